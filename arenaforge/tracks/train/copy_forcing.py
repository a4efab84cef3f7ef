"""Copy-forcing warm-start data: replays whose concrete values are fresh, so the calls can only be copied.

A from-scratch policy trained on the plain gold-call replays memorises the training ids and names
(`CU104`, `Lyon`), which are not the ones a held-out near-duplicate environment asks about
(docs/TRAINING.md, "Measured"). A copy-forced variant of a replay renames every concrete value
consistently: each value of a gold call's arguments, of a tool observation (its JSON leaves, or the
whole text) and so of the question and the final answer that mention it. The new value has the same
shape: digits become random digits of the same length, an id keeps its letter prefix and gets new
digits, a word becomes a random word of the same length and case. The tool list is shuffled (the
environment's distractors stay in it). The right call is then written from the context or not at
all.

A variant is a pure function of the replay and a seed; tool names, argument keys, call ids and the
system prompt are never changed, so a variant renders to the same rollout format as its replay.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator, Sequence
from typing import Any

# An atom: a run of letters and digits, with an optional decimal part ("194.25", "CU104", "Lyon").
ATOM = re.compile(r"[A-Za-z0-9]+(?:\.[0-9]+)?")
MAX_VALUE_CHARS = 60  # longer strings are prose (descriptions, messages), not values to copy
CONSONANTS = "bcdfghjklmnpqrstvwz"
VOWELS = "aeiou"


def copy_forced_variants(example: dict[str, Any], k: int, seed: int = 0) -> list[dict[str, Any]]:
    """`k` variants of one warm-start replay (`warmstart.conversation`) with fresh values and shuffled tools."""
    key = example.get("env_id") or json.dumps(example["messages"][:2], sort_keys=True)
    return [copy_forced(example, random.Random(f"{seed}:{key}:{index}")) for index in range(k)]


def copy_forced(example: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    """One variant: every value atom renamed through one mapping in every non-system message; tools shuffled."""
    fixed = _fixed_atoms(example)
    atoms = sorted({a for a in _value_atoms(example["messages"]) if a.lower() not in fixed}, key=lambda a: (-len(a), a))
    mapping: dict[str, str] = {}
    for atom in atoms:
        fresh = _fresh(atom, rng, taken=set(mapping.values()) | fixed)
        for original, new in ((atom, fresh), (atom.lower(), fresh.lower()), (atom.upper(), fresh.upper())):
            mapping.setdefault(original, new)
    rename = _renamer(mapping)
    tools = list(example["tools"])
    rng.shuffle(tools)
    messages = [m if m["role"] == "system" else _rename_message(m, rename) for m in example["messages"]]
    return {**example, "messages": messages, "tools": tools, "copy_forced": True}


def _value_atoms(messages: Sequence[dict[str, Any]]) -> Iterator[str]:
    """Atoms of the values to rename: gold-call argument values and tool observations."""
    for message in messages:
        for call in message.get("tool_calls") or []:
            yield from _atoms_of(json.loads(call["function"]["arguments"]))
        if message["role"] == "tool":
            yield from _atoms_of(_parsed(message.get("content") or ""))


def _atoms_of(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for item in value.values():
            yield from _atoms_of(item)
    elif isinstance(value, list):
        for item in value:
            yield from _atoms_of(item)
    elif isinstance(value, (int, float, str)) and not isinstance(value, bool):
        text = str(value)
        if len(text) <= MAX_VALUE_CHARS:
            yield from ATOM.findall(text)


def _parsed(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


def _fixed_atoms(example: dict[str, Any]) -> set[str]:
    """Atoms that must not change (lower case): tool names, argument keys, descriptions, the system prompt, JSON
    keys of observations, and the words of the answer sentence."""
    text = [json.dumps(example["tools"]), "The answer is"]
    text += [m.get("content") or "" for m in example["messages"] if m["role"] == "system"]
    for message in example["messages"]:
        for call in message.get("tool_calls") or []:
            text.append(" ".join(_keys_of(json.loads(call["function"]["arguments"]))))
        if message["role"] == "tool":
            text.append(" ".join(_keys_of(_parsed(message.get("content") or ""))))
    return {a.lower() for t in text for a in ATOM.findall(t)} | {"true", "false", "null", "none"}


def _keys_of(value: Any) -> Iterator[str]:
    if isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from _keys_of(item)
    elif isinstance(value, list):
        for item in value:
            yield from _keys_of(item)


def _fresh(atom: str, rng: random.Random, taken: set[str]) -> str:
    """A random atom of the same shape as `atom`, not already used (ids keep their letter prefix)."""
    for _ in range(100):
        candidate = _shaped(atom, rng)
        if candidate != atom and candidate not in taken and candidate.lower() not in taken:
            return candidate
    return _shaped(atom, rng)


def _shaped(atom: str, rng: random.Random) -> str:
    if any(c.isdigit() for c in atom):  # a number or an id: new digits, letters and punctuation kept
        out = [rng.choice("0123456789") if c.isdigit() else c for c in atom]
        first = next((i for i, c in enumerate(atom) if c.isdigit()), 0)
        if atom[first] != "0" and out[first] == "0" and first + 1 < len(atom) and atom[first + 1].isdigit():
            out[first] = rng.choice("123456789")  # no new leading zero: 0-free numbers stay 0-free
        return "".join(out)
    word = "".join(rng.choice(CONSONANTS if i % 2 == 0 else VOWELS) for i in range(len(atom)))
    return "".join(n.upper() if o.isupper() else n for o, n in zip(atom, word, strict=True))


def _renamer(mapping: dict[str, str]) -> Any:
    """Text -> text with every whole atom in `mapping` replaced in one pass (so renames never chain)."""
    if not mapping:
        return lambda text: text
    pattern = re.compile(r"(?<![A-Za-z0-9.])(?:" + "|".join(re.escape(a) for a in sorted(mapping, key=len, reverse=True))
                         + r")(?![A-Za-z0-9]|\.[0-9])")
    return lambda text: pattern.sub(lambda m: mapping[m.group(0)], text)


def _rename_message(message: dict[str, Any], rename: Any) -> dict[str, Any]:
    out = dict(message)
    if isinstance(out.get("content"), str):
        out["content"] = rename(out["content"])
    if out.get("tool_calls"):
        out["tool_calls"] = [{**call, "function": {**call["function"], "arguments": json.dumps(
            _rename_value(json.loads(call["function"]["arguments"]), rename))}} for call in out["tool_calls"]]
    return out


def _rename_value(value: Any, rename: Any) -> Any:
    """Argument values renamed, keeping their JSON types (an int stays an int)."""
    if isinstance(value, dict):
        return {key: _rename_value(item, rename) for key, item in value.items()}
    if isinstance(value, list):
        return [_rename_value(item, rename) for item in value]
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, (int, float)):
        renamed = rename(str(value))
        try:
            return type(value)(renamed)
        except ValueError:  # an exotic spelling (1e-05): keep the renamed text rather than break consistency
            return renamed
    return rename(value) if isinstance(value, str) else value
