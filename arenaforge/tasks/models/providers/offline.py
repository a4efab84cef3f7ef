"""The `offline` provider: deterministic generators answer each step's request from its typed inputs.

No endpoint, no weights. For every model-driven step there is a generator in `arenaforge/tasks/offline/`,
registered under the step's name with `@generator("<step>")`; it reads the request's typed `inputs`
(the values the prompt was rendered from) and returns what a model would: the JSON answer of a
structured step, or the assistant message of an agent turn. Generators build real artifacts from the
tool schemas and the knowledge source, never canned text, and their answers pass through the same
parsing, schema validation and grounding as any model's.

Generators run synchronously inside `complete` (no await before they answer), so requests issued in a
fixed order (e.g. by `asyncio.gather`) are answered in that order and a seeded generator is
reproducible run after run. `OfflineModel.state` holds what a generator keeps across the requests of
one run (its random streams, an agent's place in its plan).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import pkgutil
from collections.abc import AsyncIterator, Callable
from typing import Any

import orjson

from arenaforge.schemas.config import ModelConfig
from arenaforge.schemas.contracts import validate_against
from arenaforge.schemas.errors import ParseError, ProviderError
from arenaforge.schemas.models import ChatMessage
from arenaforge.tasks.models.base import ChatRequest, ChatResponse
from arenaforge.warehouse.db import Warehouse

NAME = "offline"

Generator = Callable[[ChatRequest, "OfflineModel"], Any]
_GENERATORS: dict[str, Generator] = {}


def generator(step: str) -> Callable[[Generator], Generator]:
    """Register the offline answer of one step (a decorator)."""

    def register(fn: Generator) -> Generator:
        if step in _GENERATORS and _GENERATORS[step] is not fn:
            raise ValueError(f"two offline generators for step {step!r}")
        _GENERATORS[step] = fn
        return fn

    return register


@functools.cache
def _load_generators() -> None:
    from arenaforge.tasks import offline

    for info in pkgutil.iter_modules(offline.__path__):
        importlib.import_module(f"{offline.__name__}.{info.name}")


class OfflineModel:
    """ChatModel whose answers come from the registered deterministic generators."""

    kind = NAME
    decides_by = "rules"

    def __init__(self, name: str = "offline") -> None:
        self.name = name
        self.state: dict[Any, Any] = {}
        _load_generators()  # when the run opens its model, not inside the first step that asks

    async def complete(self, request: ChatRequest) -> ChatResponse:
        answer_of = _GENERATORS.get(request.step)
        if answer_of is None:
            raise ProviderError(f"the offline provider has no generator for step {request.step!r}")
        answer = answer_of(request, self)
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
