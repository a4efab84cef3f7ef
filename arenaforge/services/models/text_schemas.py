"""String shapes as JSON Schema that constrained decoding enforces (llama.cpp and vLLM turn a `pattern` into a
grammar): the way a small model is made to write text that names given values."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

_TEXT = r'[^"\\\x00-\x1f]'  # a character a JSON string holds unescaped (no quote, backslash, control)
_META = set(".^$*+?()[]{}|\\")


def nameable(value: str) -> bool:
    """Whether `value` can be a literal of the pattern (a JSON string holds it unescaped)."""
    return bool(value) and not any(c in '"\\' or ord(c) < 0x20 for c in value)


def text_naming(values: list[str], max_length: int = 200) -> dict[str, Any]:
    """A string that names each of `values` in order: a regex pattern, which constrained decoding (llama.cpp, vLLM)
    turns into a grammar. Unbounded gaps (`*`): llama.cpp expands a bounded one (`{0,80}` characters) into nested
    rules whose stacks made sampling ~50x slower (1 token/s); the step's answer budget bounds the length instead."""
    gap = f"{_TEXT}*"
    return {"type": "string", "maxLength": max_length, "pattern": "^" + gap + gap.join(map(_literal, values)) + gap + "$"}


OPENERS = ("Can you", "Could you", "Please", "I need to", "I want to", "Help me")
SENTENCE_WORD = "[A-Za-z']{1,14}"  # a plain word: no digits, no symbols; the values are the only other text


@dataclass(frozen=True)
class SentenceBounds:
    """Plain words allowed before the first value, between two values and after the last."""

    before: int = 8
    between: int = 6
    after: int = 4


def sentence_naming(values: list[str], bounds: SentenceBounds = SentenceBounds(), max_length: int = 400
                    ) -> dict[str, Any]:
    """One sentence a user would type, naming each of `values` in order: an opener (`Can you`, `Please`, ...),
    then plain words and the values, each value after a space (or in single quotes), ending in `.`, `?` or `!`.

    What a 135M model does without each part (SmolLM2-135M, llama-server, 2026-11-28): with gaps of any text it ran
    on without naming the value until its budget cut the JSON (0 of 5 tasks); with words counted but not their
    length it wrote one endless word (`order_id:order_id:...`, 19 of 33 cut); with any characters in a word it
    wrote code (`SELECT * FROM ...`, `createEvent({id: 1})`); shown an example, it copied the example's words into
    most queries ("the book Dune", "play Yellow Submarine"). With an opener and plain words, 25 of 25 sentences
    finished in 1-5 s and restated what the user wants."""
    word, tail = SENTENCE_WORD + ",?", SENTENCE_WORD  # no comma right before the sentence's end
    opener = "(?:" + "|".join(OPENERS) + ") "
    if not values:
        return {"type": "string", "maxLength": max_length,
                "pattern": f"^{opener}{tail}(?:,? {tail}){{0,{bounds.before + bounds.after}}}[.?!]$"}
    named = [f"'?{_literal(v)}'?" for v in values]  # ASCII: llama.cpp's grammar parser refused «»
    pattern = (f"^{opener}(?:{word} ){{0,{bounds.before}}}" + f",? (?:{word} ){{0,{bounds.between}}}".join(named)
               + f"(?:,? {tail}){{0,{bounds.after}}}[.?!]$")
    return {"type": "string", "maxLength": max_length, "pattern": pattern}


def _literal(value: str) -> str:
    return "".join("\\" + c if c in _META else c for c in value)
