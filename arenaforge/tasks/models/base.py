"""The one interface every model-driven step talks to: `ChatModel.complete(ChatRequest)`."""

from __future__ import annotations

import hashlib
from typing import Any, Protocol, runtime_checkable

import orjson

from pydantic import Field

from arenaforge.schemas.base import Frozen
from arenaforge.schemas.models import ChatMessage, Usage


class ChatRequest(Frozen):
    step: str = Field(description="Stage label for usage accounting (not part of the cache key).")
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    response_schema: dict[str, Any] | None = Field(
        default=None, description="JSON Schema the answer must satisfy; enables parse + bounded re-asks."
    )
    temperature: float | None = None
    max_tokens: int | None = None
    seed: int | None = None

    def cache_key(self, model: str) -> str:
        """Hash of (model, parameters, messages, tools, schema).

        orjson with sorted keys writes the same bytes as `canonical_json` for this plain JSON
        (strings, ints, short floats) at a fraction of the cost; it runs once per request.
        """
        body = self.model_dump(mode="json", exclude={"step"})
        return hashlib.sha256(orjson.dumps({"model": model, **body}, option=orjson.OPT_SORT_KEYS)).hexdigest()


class ChatResponse(Frozen):
    message: ChatMessage
    parsed: Any = Field(default=None, description="The validated JSON answer when the request had a schema.")
    usage: Usage = Usage()
    cached: bool = False
    attempts: int = 1
    reasks: int = 0


@runtime_checkable
class ChatModel(Protocol):
    name: str

    async def complete(self, request: ChatRequest) -> ChatResponse: ...
