"""String shapes as JSON Schema that constrained decoding enforces (llama.cpp and vLLM turn a `pattern` into a
grammar): the way a small model is made to write text that names given values."""

from __future__ import annotations

from typing import Any

_TEXT = r'[^"\\\x00-\x1f]'  # a character a JSON string holds unescaped (no quote, backslash, control)
_META = set(".^$*+?()[]{}|\\")


def nameable(value: str) -> bool:
    """Whether `value` can be a literal of the pattern (a JSON string holds it unescaped)."""
    return bool(value) and not any(c in '"\\' or ord(c) < 0x20 for c in value)


def text_naming(values: list[str], max_length: int = 200, sentence_words: int | None = None,
                word_chars: int = 16) -> dict[str, Any]:
    """A string that names each of `values` in order: a regex pattern, which constrained decoding (llama.cpp, vLLM)
    turns into a grammar. Unbounded gaps (`*`): llama.cpp expands a bounded one (`{0,80}` characters) into nested
    rules whose stacks made sampling ~50x slower (1 token/s); the step's answer budget bounds the length instead.
    `sentence_words`: one sentence, ending in `.`, `?` or `!`, with at most that many words before each value and
    after the last, each word at most `word_chars` characters. SmolLM2-135M otherwise ran on without naming the
    value until its budget cut the JSON: unbounded, 0 of 5 tasks finished; with words counted but not their length
    it wrote one endless word (`order_id:order_id:...`, 19 of 33 cut); with both, 18 of 19 clauses finished in
    1-6 s (bounds this small stay fast)."""
    literal = ["".join("\\" + c if c in _META else c for c in v) for v in values]
    if sentence_words is None:
        gap = f"{_TEXT}*"
        return {"type": "string", "maxLength": max_length, "pattern": "^" + gap + gap.join(literal) + gap + "$"}
    word = _TEXT[:-1] + f" .?!]{{0,{word_chars}}}"  # a word: no space, no sentence end, bounded
    n = sentence_words
    gap = f"(?:{word} ){{0,{n}}}{word}"  # ends in a word's start: `«` or `id=` may touch the value
    pattern = "^" + gap + gap.join(literal) + f"{word}(?: {word}){{0,{n}}}[.?!]$"
    return {"type": "string", "maxLength": max_length, "pattern": pattern}
