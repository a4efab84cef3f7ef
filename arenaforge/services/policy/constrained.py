"""Constrained decoding of hermes tool calls for the HF engine.

Outside a call the model writes freely. From the `<tool_call>` token on, every token must keep the
text a prefix of

    \\n{"name": "<a tool of this environment>", "arguments": {"<one of its keys>": <JSON value>, ...}}\\n</tool_call>

keys from that tool's schema, each at most once, the required ones before the object closes; values
are any well-formed JSON (strings, numbers, true/false/null, arrays, objects). The constraint is a
character automaton (`step`); a token is allowed in a state when its decoded text walks the
automaton without falling off, so it stays token-exact: the model still picks whole tokens of its own
vocabulary, including ones that straddle a boundary (`": "`).

Grounded arguments (a `Ground` of the request's context, the default): a top-level string value must
equal a span of the context that does not cut a word (`OR5031`, `Wireless Mouse`, `2024-05-01`) and a
top-level number must equal a number standing alone in the context; true/false/null and nested
arrays/objects stay free. Schema enum values are in the tools block of the prompt, so they are spans
too. A string state holds the context positions still matching (advanced per character), so the
closing quote is allowed exactly when one of them sits at a word end. A context with no string (or
number) candidate leaves that kind of value free, so grounding never dead-ends.

Log-probs: the engine samples from softmax(logits masked to the allowed tokens) and records the
log-prob of that masked distribution, the distribution actually sampled from. The automaton is a
deterministic function of (tools, prompt, tokens so far), so a trainer that wants the exact ratio
against the engine can replay it; the default GRPO update (`old_logprobs="policy"`) uses the policy's own
log-probs and does not read the recorded ones.

A vLLM server would do the same with guided decoding / structured outputs (a JSON schema per tool
in a `oneOf`, or the `tools` + `tool_choice` structured-output path); the HTTP engine does not ask
for it yet.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

CALL_OPEN, CALL_CLOSE = "<tool_call>", "</tool_call>"
STOP_TOKENS = ("<|im_end|>", "<|endoftext|>")
_DIGITS = "0123456789"
_ESCAPES = '"\\/bfnrt'


@dataclass(frozen=True)
class ToolSpec:
    """What the automaton needs of one tool: its name, argument keys and the required ones."""

    name: str
    keys: tuple[str, ...]
    required: tuple[str, ...] = ()

    @classmethod
    def from_schema(cls, name: str, parameters: dict[str, Any] | None) -> "ToolSpec":
        params = parameters or {}
        keys = tuple((params.get("properties") or {}).keys())
        return cls(name, keys, tuple(k for k in params.get("required") or () if k in keys))


Tools = tuple[ToolSpec, ...]
# a JSON number standing alone in the text: not part of a word (`OR5031`) or of a longer number
_NUMBER = re.compile(r"(?<![\w.])-?(?:0|[1-9]\d*)(?:\.\d+)?(?![\w]|\.\d)")


def _wordy(ch: str) -> bool:
    return ch.isalnum() or ch == "_"


class Ground:
    """The values a grounded call may copy: spans and numbers of one request's context text.

    Compared by identity (one per request), so automaton states that hold it are cached per request."""

    def __init__(self, text: str) -> None:
        self.text = text
        n = len(text)
        # a span text[i:j] is a candidate when it starts and ends on non-space, never cuts a word, and holds
        # no quote, backslash or control character (those end the JSON string or need escapes)
        self.starts = frozenset(i for i in range(n) if not text[i].isspace() and text[i] >= " " and text[i] not in '"\\'
                                and not (i > 0 and _wordy(text[i - 1]) and _wordy(text[i])))
        self.ends = frozenset(j for j in range(1, n + 1) if not text[j - 1].isspace()
                              and not (j < n and _wordy(text[j - 1]) and _wordy(text[j])))
        at: dict[str, set[int]] = {}
        for i, ch in enumerate(text):
            if ch >= " " and ch not in '"\\':  # a span never runs over these
                at.setdefault(ch, set()).add(i)
        self.at = {ch: frozenset(ps) for ch, ps in at.items()}
        self.numbers = frozenset(m.group() for m in _NUMBER.finditer(text))
        self.number_prefixes = frozenset(num[:k] for num in self.numbers for k in range(1, len(num) + 1))


def ground_of(tokenizer: Any, prompt_ids: Sequence[int]) -> Ground:
    """The context a request's grounded arguments copy from: the text of its prompt."""
    return Ground(tokenizer.decode(list(prompt_ids), skip_special_tokens=True))


FREE = ("free",)
DONE = ("done",)


def _fixed(options: Sequence[tuple[str, tuple]]) -> tuple | None:
    live = tuple((text, nxt) for text, nxt in options if text)
    return ("fixed", live) if live else None


def after_open(tools: Tools, ground: Ground | None = None) -> tuple:
    """The state right after the `<tool_call>` token: the call's head with one of the tool names.

    With `ground`, top-level argument values are copied from it (see the module doc)."""
    return _fixed([(f'\n{{"name": "{t.name}", "arguments": {{', _first_key(t, ground)) for t in tools]) or DONE


def _first_key(tool: ToolSpec, ground: Ground | None) -> tuple:
    """Right after `"arguments": {`: a first key, or the end of the call when nothing is required."""
    return _fixed(_keys(tool, (), "", ground) + _close(tool, (), "}}\n")) or DONE


def _keys(tool: ToolSpec, used: tuple[str, ...], lead: str, ground: Ground | None) -> list[tuple[str, tuple]]:
    return [(f'{lead}"{k}": ', ("val", tool, (*used, k), (), "v", ground)) for k in tool.keys if k not in used]


def _close(tool: ToolSpec, used: tuple[str, ...], text: str) -> list[tuple[str, tuple]]:
    if any(k not in used for k in tool.required):
        return []
    return [(text, ("special", CALL_CLOSE, FREE))]


def step(state: tuple, ch: str) -> tuple | None:
    """The state after one character of text, or None when the character is not allowed."""
    kind = state[0]
    if kind == "free":
        return state
    if kind == "fixed":
        live = [(text[1:], nxt) for text, nxt in state[1] if text[0] == ch]
        if not live:
            return None
        for text, nxt in live:
            if not text:
                return nxt
        return ("fixed", tuple(live))
    if kind == "val":
        return _step_value(state, ch)
    if kind == "gs":
        return _step_grounded_string(state, ch)
    if kind == "gn":
        return _step_grounded_number(state, ch)
    return None  # "special" waits for a special token; "done" takes nothing


def _step_value(state: tuple, ch: str) -> tuple | None:
    """One character of a JSON argument value; `stack` holds the open containers ('[' or '{')."""
    _, tool, used, stack, sub, ground = state

    def to(new_sub: str, new_stack: tuple = stack) -> tuple:
        return ("val", tool, used, new_stack, new_sub, ground)

    if sub == "v" and ground is not None and not stack:  # a top-level value: copied from the context
        if ch == '"' and ground.starts:
            return ("gs", tool, used, ground, None)
        if (ch == "-" or ch in _DIGITS) and ground.numbers:
            return ("gn", tool, used, ground, ch) if ch in ground.number_prefixes else None

    if sub in ("s", "ks"):  # inside a string (a value, or a key of a nested object)
        if ch == '"':
            return to("a" if sub == "s" else "kc")
        if ch == "\\":
            return to(sub + "e")
        return to(sub) if ch >= " " else None
    if sub in ("se", "kse"):
        return to(sub[:-1]) if ch in _ESCAPES else None
    if sub == "v":  # a value starts
        if ch == '"':
            return to("s")
        if ch in "{[":
            return to("o" if ch == "{" else "l", (*stack, ch))
        if ch == "-":
            return to("n-")
        if ch in _DIGITS:
            return to("n0" if ch == "0" else "ni")
        for word in ("true", "false", "null"):
            if ch == word[0]:
                return to("w" + word[1:])
        return to("v") if ch == " " and stack else None
    if sub.startswith("w"):  # the rest of true/false/null
        rest = sub[1:]
        if ch != rest[0]:
            return None
        return to("a") if len(rest) == 1 else to("w" + rest[1:])
    if sub.startswith("n"):  # a number: -? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?
        if sub == "n-":
            return to("n0" if ch == "0" else "ni") if ch in _DIGITS else None
        if sub in ("ni", "nf", "ne") and ch in _DIGITS:
            return to(sub)
        if sub in ("ni", "n0") and ch == ".":
            return to("nd")
        if sub == "nd":
            return to("nf") if ch in _DIGITS else None
        if sub in ("ni", "n0", "nf") and ch in "eE":
            return to("nx")
        if sub == "nx":
            return to("ns") if ch in "+-" else to("ne") if ch in _DIGITS else None
        if sub == "ns":
            return to("ne") if ch in _DIGITS else None
        if sub in ("ni", "n0", "nf", "ne"):
            return _step_value(to("a"), ch)  # the number ended; this character follows it
        return None
    if sub in ("o", "ok"):  # after `{` (a key or `}`) / after `,` in an object (a key)
        if ch == '"':
            return to("ks")
        if ch == " ":
            return to(sub)
        return _step_value(to("a"), ch) if ch == "}" and sub == "o" else None
    if sub == "kc":  # after a nested key: `:`
        return to("v") if ch == ":" else to("kc") if ch == " " else None
    if sub == "l":  # after `[`: a value or `]`
        return _step_value(to("a"), ch) if ch == "]" else _step_value(to("v"), ch)
    if sub == "a":  # a value just ended
        if not stack:  # a top-level argument: another key, or the end of the call
            if ch == ",":
                return _fixed(_keys(tool, used, " ", ground))
            if ch == "}":
                return _fixed(_close(tool, used, "}\n"))
            return None
        top = stack[-1]
        if ch == " ":
            return to("a")
        if ch == ",":
            return to("ok" if top == "{" else "v")
        if (ch == "}" and top == "{") or (ch == "]" and top == "["):
            return to("a", stack[:-1])
        return None
    return None


def _step_grounded_string(state: tuple, ch: str) -> tuple | None:
    """One character of a string copied from the context; `positions` (None before the first character)
    are the context indices where the next character must match, one per span still matching."""
    _, tool, used, ground, positions = state
    if ch == '"':  # the string ends: some matching span must end at a word end, and it must not be empty
        if positions is not None and not positions.isdisjoint(ground.ends):
            return ("val", tool, used, (), "a", ground)
        return None
    here = ground.starts if positions is None else positions
    matched = here & ground.at.get(ch, frozenset())
    if not matched:
        return None
    return ("gs", tool, used, ground, frozenset(p + 1 for p in matched))


def _step_grounded_number(state: tuple, ch: str) -> tuple | None:
    """One character of a number copied from the context (`typed` so far); the number ends with the
    character after it, once `typed` is one of the context's numbers."""
    _, tool, used, ground, typed = state
    if typed + ch in ground.number_prefixes:
        return ("gn", tool, used, ground, typed + ch)
    if typed in ground.numbers:
        return _step_value(("val", tool, used, (), "a", ground), ch)
    return None


class ToolCallConstraint:
    """Allowed-token masks over one tokenizer's vocabulary, cached per automaton state."""

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        import torch

        self.vocab_size = vocab_size
        added = tokenizer.get_added_vocab()  # special tokens by text
        self.special_ids = {text: i for text, i in added.items() if i < vocab_size}
        self.id_to_special = {i: text for text, i in self.special_ids.items()}
        self.texts: dict[int, str] = {}
        self.by_first: dict[str, list[int]] = {}
        plain = torch.zeros(vocab_size, dtype=torch.bool)  # text tokens with no quote, backslash or control char
        for i in range(min(len(tokenizer), vocab_size)):
            if i in self.id_to_special:
                continue
            text = tokenizer.decode([i], clean_up_tokenization_spaces=False)
            if not text:
                continue
            self.texts[i] = text
            self.by_first.setdefault(text[0], []).append(i)
            plain[i] = all(c >= " " and c not in '"\\' for c in text)
        self.free = torch.zeros(vocab_size, dtype=torch.bool)
        for i in self.texts:
            self.free[i] = True
        for text in (CALL_OPEN, *STOP_TOKENS):
            if text in self.special_ids:
                self.free[self.special_ids[text]] = True
        self.plain = plain
        self._cache: dict[tuple, Any] = {}

    def advance(self, state: tuple, token_id: int, tools: Tools, ground: Ground | None = None) -> tuple | None:
        """The state after `token_id`, or None when the token is not allowed in `state` (`ground`: where a
        call opened here copies its argument values from; None leaves them free)."""
        special = self.id_to_special.get(token_id)
        if special is not None:
            if state[0] == "free":
                if special == CALL_OPEN:
                    return after_open(tools, ground)
                return state if special in STOP_TOKENS else None  # the engine stops on its own stop ids
            if state[0] == "special" and special == state[1]:
                return state[2]
            return None
        text = self.texts.get(token_id)
        if text is None:
            return None
        if state[0] == "free":
            return state
        for ch in text:
            state = step(state, ch)  # type: ignore[assignment]
            if state is None:
                return None
        return state

    def mask(self, state: tuple, tools: Tools) -> Any:
        """Boolean mask (vocab_size,) of the tokens allowed in `state`."""
        import torch

        if state[0] == "free":
            return self.free
        cached = self._cache.get(state)
        if cached is not None:
            return cached
        if state[0] == "special":
            allowed = torch.zeros(self.vocab_size, dtype=torch.bool)
            allowed[self.special_ids[state[1]]] = True
        elif state[0] == "val" and state[4] in ("s", "ks"):  # in a string: plain tokens always fit
            allowed = self.plain.clone()
            for i, text in self.texts.items():
                if not self.plain[i] and self.advance(state, i, tools) is not None:
                    allowed[i] = True
        else:
            allowed = torch.zeros(self.vocab_size, dtype=torch.bool)
            for first, ids in self.by_first.items():
                after_first = step(state, first)  # shared by every token starting with this character
                if after_first is None:
                    continue
                for i in ids:
                    if _walk(after_first, self.texts[i], 1) is not None:
                        allowed[i] = True
        if not allowed.any():  # never a dead end: a state with no way on lets the model write freely
            allowed = self.free
        if len(self._cache) > 50_000:  # states are per tool set; keep memory bounded over many environments
            self._cache.clear()
        self._cache[state] = allowed
        return allowed


def _walk(state: tuple | None, text: str, start: int = 0) -> tuple | None:
    """The state after `text[start:]`, or None where it falls off the automaton."""
    for ch in text[start:]:
        state = step(state, ch)  # type: ignore[arg-type]
        if state is None:
            return None
    return state


def tool_specs(tools: Sequence[Any]) -> Tools:
    """ToolSpecs of FunctionDoc-like objects (`.name`, `.parameters`)."""
    return tuple(ToolSpec.from_schema(t.name, t.parameters) for t in tools)
