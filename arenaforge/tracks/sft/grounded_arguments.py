"""Arguments a small agent may only copy (`sft.grounded_arguments`): identifiers and numbers from the conversation.

SmolLM2-135M, given `track order_5igvhs`, called `track_order(order_id="order_id_to_track_order")`; 18 of the 22
trajectories the rules judge kept in one `bench models --real` run called tools with an identifier or a number no
message held. Two parts, one rule:
- `grounded_tools`: before each turn, a tool's identifier parameters (named like one: `order_id`, `calendar_id`)
  and number parameters are offered as enums of the values the user's messages and the tool results so far hold,
  so constrained decoding makes the call structurally right (as the envs route offers a table's columns);
- `invented_argument`: a trajectory whose calls use such a value that no message gave is not kept, whoever judged it.
Free text (a title, a message body) stays the agent's to write. The trajectory keeps the tools' real documents.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterable, Sequence
from typing import Any

from arenaforge.environments.reward import normalise
from arenaforge.schemas.models import ChatMessage, Tool
from arenaforge.tracks.sft.tool_graph import id_like

_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:\.\d+)?(?![\w.]\w)")  # a number said as one, not inside `order_41`
_TOKEN = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.@:/+-]*[A-Za-z0-9]|[A-Za-z0-9]")
_MAX_ENUM = 48  # a conversation's candidates; llama.cpp turns each into a grammar alternative


def json_leaves(data: Any) -> Iterable[Any]:
    """The scalar leaves of parsed JSON (no nulls, no booleans)."""
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
        elif item is not None and not isinstance(item, bool):
            yield item


def conversation_values(messages: Sequence[ChatMessage]) -> tuple[list[str], list[float]]:
    """Identifier-like strings and numbers the user's messages and the tool results hold, first seen first."""
    strings: dict[str, None] = {}
    numbers: dict[float, None] = {}
    for m in messages:
        if m.role not in ("user", "tool") or not m.content:
            continue
        text = m.content
        try:
            leaves = list(json_leaves(json.loads(text)))
        except ValueError:
            leaves = []
        for leaf in leaves:
            if isinstance(leaf, (int, float)):
                numbers[float(leaf)] = None
            elif isinstance(leaf, str) and leaf.strip():
                strings[leaf.strip()] = None
        for token in _TOKEN.findall(text):
            if any(c.isdigit() or c in "_@" for c in token) and not _NUMBER.fullmatch(token):
                strings[token] = None
        for quoted in re.findall(r"'([^']+)'", text):  # a quoted value may hold spaces
            strings[quoted] = None
        for number in _NUMBER.findall(text):
            numbers[float(number)] = None
    return list(strings)[-_MAX_ENUM:], list(numbers)[-_MAX_ENUM:]


def grounded_tools(tools: Sequence[Tool], messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """The tools' OpenAI specs with identifier and number parameters narrowed to the conversation's values (left as
    they are where the conversation holds none)."""
    strings, numbers = conversation_values(messages)
    specs = []
    for tool in tools:
        spec = copy.deepcopy(tool.function.as_openai_tool())
        props = spec["function"].get("parameters", {}).get("properties", {})
        for name, schema in props.items():
            kind = schema.get("type") if isinstance(schema, dict) else None
            if kind == "string" and id_like(name) and strings and "enum" not in schema:
                props[name] = {**schema, "enum": strings}
            elif kind in ("integer", "number") and numbers and "enum" not in schema:
                values = [int(n) for n in numbers if n == int(n)] if kind == "integer" else numbers
                if values:
                    props[name] = {**schema, "enum": values}
        specs.append(spec)
    return specs


def invented_argument(messages: Sequence[ChatMessage]) -> str | None:
    """The first identifier or number a call uses that neither the user's messages nor an earlier tool result holds
    (None when every one is held)."""
    seen = ""
    for m in messages:
        if m.role in ("user", "tool"):
            seen += " " + normalise(m.content or "")
        for call in m.tool_calls or ():
            try:
                args = json.loads(call.function.arguments or "{}")
            except ValueError:
                continue  # an unreadable call is already a failed call the judge sees
            for name, value in (args.items() if isinstance(args, dict) else ()):
                if isinstance(value, bool) or not isinstance(value, (str, int, float)):
                    continue
                if not (id_like(name) or isinstance(value, (int, float))):
                    continue
                said = normalise(_number_text(value) if isinstance(value, (int, float)) else value)
                if said and not re.search(r"(?<![0-9a-z])" + re.escape(said) + r"(?![0-9a-z])", seen):
                    return f"{call.function.name} was called with {name}={value!r}, which no message gave"
    return None


def _number_text(value: float) -> str:
    return str(int(value)) if float(value) == int(value) else repr(float(value))
