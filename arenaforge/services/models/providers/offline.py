"""The `offline` provider: deterministic generators answer each step's request from its typed inputs.

No endpoint, no weights. Every model-driven step (`services.models.steps.Step`, declared beside its stage) names its
generator, a rule beside its stage (`tracks/<track>/offline_<stage>.py`), and the provider finds it through the
step; it reads the request's typed `inputs` (the values the prompt was rendered from) and returns what a model
would: the JSON answer of a structured step, or the assistant message of an agent turn. Generators build real
artifacts from the tool schemas and the knowledge source, never canned text, and their answers pass through the same
parsing, schema validation and grounding as any model's.

Generators run synchronously inside `complete` (no await before they answer), so requests issued in a
fixed order (e.g. by `asyncio.gather`) are answered in that order and a seeded generator is
reproducible run after run. `OfflineModel.state` holds what a generator keeps across the requests of
one run (its random streams, an agent's place in its plan).
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import orjson

from arenaforge.schemas.config import ModelConfig
from arenaforge.schemas.contracts import validate_against
from arenaforge.schemas.errors import ParseError, ProviderError
from arenaforge.schemas.models import ChatMessage
from arenaforge.services.models.base import ChatRequest, ChatResponse
from arenaforge.services.models.steps import declared, import_offline_rules, offline_rule
from arenaforge.warehouse.db import Warehouse

NAME = "offline"


class OfflineModel:
    """ChatModel whose answers come from the steps' deterministic generators."""

    kind = NAME
    decides_by = "rules"

    def __init__(self, name: str = "offline") -> None:
        self.name = name
        self.state: dict[Any, Any] = {}
        import_offline_rules()  # when the run opens its model, not inside the first step that asks

    async def complete(self, request: ChatRequest) -> ChatResponse:
        step = declared(request.step)
        if step is None:
            raise ProviderError(f"the offline provider knows no step {request.step!r}")
        answer = offline_rule(step)(request, self)
        if isinstance(answer, ChatMessage):
            return ChatResponse(message=answer)
        if request.response_schema is not None:
            # like any provider's answer: checked against the step's schema (a tool's own output schema can ask
            # for more than a generator gives), and an answer that breaks it is the step's ParseError
            problem = validate_against(request.response_schema, answer)
            if problem is not None:
                raise ParseError(f"{request.step}: the offline answer breaks the step's schema at {problem}")
        content = orjson.dumps(answer).decode()
        return ChatResponse(message=ChatMessage(role="assistant", content=content), parsed=answer)


@contextlib.asynccontextmanager
async def open(cfg: ModelConfig, wh: Warehouse | None = None, run_id: str | None = None
               ) -> AsyncIterator[OfflineModel]:
    model = OfflineModel()
    try:
        yield model
    finally:
        model.state.clear()  # generators keep sources, random streams and open episodes here: the run is over
