"""Model access for every model-driven step: one `ChatModel` protocol, built once at the edge.

`offline` steps need no ChatModel: each step's offline implementation is a deterministic
generator next to its openai implementation (see docs/ARCHITECTURE.md). This package builds
the `openai` ChatModel with its cache and usage ledger, and offers `complete_json` for
structured steps.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from arenaforge.schemas.config import ModelConfig
from arenaforge.schemas.errors import ParseError
from arenaforge.tasks.models.base import ChatModel, ChatRequest, ChatResponse
from arenaforge.tasks.models.cache import ResponseCache, UsageLedger
from arenaforge.tasks.models.openai_model import OpenAIChatModel, parse_json_answer
from arenaforge.warehouse.db import Warehouse


@contextlib.contextmanager
def chat_model(cfg: ModelConfig, wh: Warehouse | None = None, run_id: str | None = None) -> Iterator[OpenAIChatModel]:
    """An openai-backend ChatModel whose cache and usage rows are flushed when the block exits."""
    cache = ResponseCache(wh, cfg.model) if (wh is not None and cfg.cache) else None
    ledger = UsageLedger(wh, run_id) if wh is not None else None
    model = OpenAIChatModel(cfg, cache=cache, ledger=ledger)
    try:
        yield model
    finally:
        for closable in (cache, ledger):
            if closable is not None:
                closable.close()


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
    "OpenAIChatModel",
    "ResponseCache",
    "UsageLedger",
    "chat_model",
    "complete_json",
    "parse_json_answer",
]
