"""Constrained decoding of hermes tool calls for the HF engine.

Outside a call the model writes freely. From the `<tool_call>` token on, every token must keep the
text a prefix of

    \\n{"name": "<a tool of this environment>", "arguments": {"<one of its keys>": <JSON value>, ...}}\\n</tool_call>

keys from that tool's schema, each at most once, the required ones before the object closes; values
are any well-formed JSON (strings, numbers, true/false/null, arrays, objects). The constraint is a
character automaton (`step`); a token is allowed in a state when its decoded text walks the
automaton without falling off, so it stays token-exact: the model still picks whole tokens of its own
vocabulary, including ones that straddle a boundary (`": "`).

Log-probs: the engine samples from softmax(logits masked to the allowed tokens) and records the
log-prob of that masked distribution, the distribution actually sampled from. The automaton is a
deterministic function of (tools, tokens so far), so a trainer that wants the exact ratio against
the engine can replay it; the default GRPO update (`old_logprobs="policy"`) uses the policy's own
log-probs and does not read the recorded ones.

A vLLM server would do the same with guided decoding / structured outputs (a JSON schema per tool
in a `oneOf`, or the `tools` + `tool_choice` structured-output path); the HTTP engine does not ask
for it yet.
"""

from __future__ import annotations

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
FREE = ("free",)
DONE = ("done",)


def _fixed(options: Sequence[tuple[str, tuple]]) -> tuple | None:
    live = tuple((text, nxt) for text, nxt in options if text)
    return ("fixed", live) if live else None


def after_open(tools: Tools) -> tuple:
    """The state right after the `<tool_call>` token: the call's head with one of the tool names."""
    return _fixed([(f'\n{{"name": "{t.name}", "arguments": {{', _first_key(t)) for t in tools]) or DONE


def _first_key(tool: ToolSpec) -> tuple:
    """Right after `"arguments": {`: a first key, or the end of the call when nothing is required."""
    return _fixed(_keys(tool, (), "") + _close(tool, (), "}}\n")) or DONE


def _keys(tool: ToolSpec, used: tuple[str, ...], lead: str) -> list[tuple[str, tuple]]:
    return [(f'{lead}"{k}": ', ("val", tool, (*used, k), (), "v")) for k in tool.keys if k not in used]


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
    return None  # "special" waits for a special token; "done" takes nothing


def _step_value(state: tuple, ch: str) -> tuple | None:
    """One character of a JSON argument value; `stack` holds the open containers ('[' or '{')."""
    _, tool, used, stack, sub = state

    def to(new_sub: str, new_stack: tuple = stack) -> tuple:
        return ("val", tool, used, new_stack, new_sub)

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
                return _fixed(_keys(tool, used, " "))
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

    def advance(self, state: tuple, token_id: int, tools: Tools) -> tuple | None:
        """The state after `token_id`, or None when the token is not allowed in `state`."""
        special = self.id_to_special.get(token_id)
        if special is not None:
            if state[0] == "free":
                if special == CALL_OPEN:
                    return after_open(tools)
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
                if step(state, first) is None:
                    continue
                for i in ids:
                    if self.advance(state, i, tools) is not None:
                        allowed[i] = True
        if not allowed.any():  # never a dead end: a state with no way on lets the model write freely
            allowed = self.free
        if len(self._cache) > 50_000:  # states are per tool set; keep memory bounded over many environments
            self._cache.clear()
        self._cache[state] = allowed
        return allowed


def tool_specs(tools: Sequence[Any]) -> Tools:
    """ToolSpecs of FunctionDoc-like objects (`.name`, `.parameters`)."""
    return tuple(ToolSpec.from_schema(t.name, t.parameters) for t in tools)
