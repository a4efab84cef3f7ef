"""The model seam: every model-driven step talks to one `ChatModel`, built once per run.

`open_chat_model(cfg.model, warehouse, run_id)` picks the provider named by `model.backend`
(`providers/`: `offline`, the deterministic generators; `openai`, any OpenAI-compatible endpoint)
and closes it when the run ends. Steps receive the model in their constructor and send
`ChatRequest`s; `complete_json` is the structured-answer shortcut.
"""

from __future__ import annotations

from typing import Any

from arenaforge.schemas.errors import ParseError
from arenaforge.tasks.models.base import ChatModel, ChatRequest, ChatResponse, NoAnswer, graded_by
from arenaforge.tasks.models.providers import open_chat_model
from arenaforge.tasks.models.providers.openai_compatible import OpenAICompatibleModel, parse_json_answer


async def complete_json(
    model: ChatModel,
    step: str,
    messages: list[dict[str, Any]],
    schema: dict[str, Any],
    **params: Any,
) -> Any:
    """The validated JSON answer of a structured step; ParseError when it never validates."""
    response = await model.complete(ChatRequest(step=step, messages=messages, response_schema=schema, **params))
    if response.parsed is None and schema.get("type") != "null":
        raise ParseError(f"{step}: the model returned no structured answer")
    return response.parsed


__all__ = [
    "ChatModel",
    "ChatRequest",
    "ChatResponse",
    "NoAnswer",
    "OpenAICompatibleModel",
    "complete_json",
    "graded_by",
    "open_chat_model",
    "parse_json_answer",
]
