"""What an OpenAI-compatible endpoint answered, read: the JSON of a structured answer (with repair), the
assistant message of a chat completion, and its token usage."""

from __future__ import annotations

import json
import re
from typing import Any

from arenaforge.schemas.contracts import validate_against
from arenaforge.schemas.errors import ParseError
from arenaforge.schemas.models import ChatMessage, Usage
from arenaforge.services.models.http_errors import short

_FENCE = re.compile(r"```(?:json)?\s*(.*?)\s*```", re.DOTALL)
_TRAILING_COMMA = re.compile(r",\s*([}\]])")


def parse_json_answer(content: str | None) -> Any:
    """JSON from a model answer: the whole text, a fenced block, or the first JSON value inside prose
    (a trailing comma forgiven); raises ValueError."""
    if content is None:
        raise ValueError("the answer has no text content")
    text = content.strip()
    candidates = [text]
    candidates += _FENCE.findall(text)
    start = min((i for i in (text.find("{"), text.find("[")) if i >= 0), default=-1)
    if start >= 0:
        end = max(text.rfind("}"), text.rfind("]"))
        if end > start:
            candidates.append(text[start:end + 1])
    first_error: json.JSONDecodeError | None = None
    for candidate in candidates:
        for variant in (candidate, _TRAILING_COMMA.sub(r"\1", candidate)):
            try:
                return json.loads(variant)
            except json.JSONDecodeError as err:
                first_error = first_error or err
    assert first_error is not None
    raise ValueError(f"not valid JSON ({first_error.msg} at line {first_error.lineno} column {first_error.colno})")


def check_answer(content: str | None, schema: dict[str, Any]) -> tuple[str | None, Any]:
    """(None, the parsed answer) when `content` is JSON satisfying `schema`; else (what is wrong, None)."""
    try:
        parsed = parse_json_answer(content)
    except ValueError as err:
        return str(err), None
    problem = validate_against(schema, parsed)
    return (None, parsed) if problem is None else (f"schema violation at {problem}", None)


def assistant_message(raw: Any, step: str, url: str | None) -> ChatMessage:
    """The first choice's message of a chat.completion body, validated; ParseError otherwise."""
    try:
        message = raw["choices"][0]["message"]
        return ChatMessage(
            role="assistant",
            content=message.get("content"),
            tool_calls=[
                {"id": tc["id"], "type": "function",
                 "function": {"name": tc["function"]["name"], "arguments": tc["function"].get("arguments") or "{}"}}
                for tc in message.get("tool_calls") or []
            ] or None,
        )
    except (KeyError, IndexError, TypeError, AttributeError, ValueError) as err:
        raise ParseError(
            f"{step}: {url} answered something that is not a chat completion ({type(err).__name__}: {short(err)})"
        ) from None


def usage_of(raw: Any) -> Usage:
    u = raw.get("usage") if isinstance(raw, dict) else None
    if not isinstance(u, dict):
        return Usage()
    return Usage(prompt_tokens=u.get("prompt_tokens") or 0, completion_tokens=u.get("completion_tokens") or 0,
                 total_tokens=u.get("total_tokens") or 0)


def add_usage(total: Usage, more: Usage) -> Usage:
    return Usage(prompt_tokens=total.prompt_tokens + more.prompt_tokens,
                 completion_tokens=total.completion_tokens + more.completion_tokens,
                 total_tokens=total.total_tokens + more.total_tokens)
