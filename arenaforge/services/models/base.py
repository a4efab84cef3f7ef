"""The one interface every model-driven step talks to: `ChatModel.complete(ChatRequest)`.

A step renders its prompt, attaches the typed inputs the prompt was rendered from, and sends one
`ChatRequest`. Which provider answers — an OpenAI-compatible endpoint, the deterministic offline
generator, anything added under `services/models/` — is decided once per run, when the model is built
(`services.models.open_chat_model`); the step never knows.
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal, Protocol, runtime_checkable

import orjson
from pydantic import Field

from arenaforge.schemas.base import Frozen
from arenaforge.schemas.models import ChatMessage, Usage


class ChatRequest(Frozen):
    step: str = Field(description="Stage label for usage accounting and the offline generator (not in the cache key).")
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None = None
    tool_choice: Literal["auto", "none", "required"] | None = Field(
        default=None, description="none: the step needs a final answer, not another tool call.")
    response_schema: dict[str, Any] | None = Field(
        default=None, description="JSON Schema the answer must satisfy; enables parse + bounded re-asks."
    )
    temperature: float | None = None
    max_tokens: int | None = None
    seed: int | None = None
    inputs: Any = Field(
        default=None, exclude=True,
        description="The typed values the prompt was rendered from. The offline provider answers from them; "
                    "HTTP providers send only the messages. Never part of the cache key.")

    def cache_key(self, model: str) -> str:
        """Hash of (model, parameters, messages, tools, schema).

        orjson with sorted keys writes the same bytes as `canonical_json` for this plain JSON
        (strings, ints, short floats) at a fraction of the cost; it runs once per request.
        `tool_choice` enters the key only when set, so caches written before it existed still hit.
        """
        body = self.model_dump(mode="json", exclude={"step"})
        if body.get("tool_choice") is None:
            body.pop("tool_choice", None)
        return hashlib.sha256(orjson.dumps({"model": model, **body}, option=orjson.OPT_SORT_KEYS)).hexdigest()


class ChatResponse(Frozen):
    message: ChatMessage
    parsed: Any = Field(default=None, description="The validated JSON answer when the request had a schema.")
    usage: Usage = Usage()
    cached: bool = False
    attempts: int = 1
    reasks: int = 0
    wasted_tokens: int = Field(default=0, description="Tokens of answers thrown away (re-asked for breaking the schema).")


class NoAnswer(Exception):
    """The provider understood the request and has no answer for it (e.g. the offline generator finds no
    join path of the asked structure). A per-record outcome: the step writes a rejection with this reason."""

    def __init__(self, reason: str, detail: str, payload: Any = None) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail
        self.payload = payload


@runtime_checkable
class ChatModel(Protocol):
    name: str  # the model id recorded in provenance
    kind: str  # the provider: "offline", "openai", ... (Provenance.backend)
    decides_by: Literal["rules", "model"]  # what its grades and choices come from (recorded on judged records)

    async def complete(self, request: ChatRequest) -> ChatResponse: ...


def reads_prompts(model: ChatModel) -> bool:
    """Whether the model reads the rendered prompt text: a model does; rules (the offline provider) answer from
    the request's typed `inputs`, so a step renders its prompt only for a model that reads it."""
    return model.decides_by == "model"


def graded_by(model: ChatModel) -> Literal["rules", "model"]:
    """What a record says decided it: the offline provider's programmatic rules, or a model."""
    return model.decides_by
