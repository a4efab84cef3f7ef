"""The two providers as sync tests use them (each test drives its own event loops with asyncio.run)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

from arenaforge.schemas.config import Config, ModelConfig
from arenaforge.services.models import Accounted, OpenAICompatibleModel, Step
from arenaforge.services.models.providers.offline import OfflineModel
from arenaforge.services.run_scope import open_run_scope
from arenaforge.warehouse import Warehouse


@contextlib.contextmanager
def http_model(cfg: ModelConfig, wh: Warehouse | None = None, run_id: str | None = None
               ) -> Iterator[Accounted]:
    """The OpenAI-compatible provider behind the warehouse cache and usage ledger, as a run builds it; its
    cache and usage rows are flushed when the block exits."""
    model = Accounted(OpenAICompatibleModel(cfg), wh, run_id, cache=cfg.cache)
    try:
        yield model
    finally:
        model.close()


def offline_model() -> OfflineModel:
    return OfflineModel()


def http_step(name: str, schema: dict[str, Any], max_tokens: int = 64) -> Step:
    """A step the tests ask only of HTTP models (scripted endpoints, wire replays): it has no offline rule."""

    def no_rule(request: Any, model: Any) -> Any:
        raise AssertionError(f"step {name!r} is asked of HTTP models only")

    return Step(name, prompt="", schema=schema, max_tokens=max_tokens, offline=lambda: no_rule)


def run_stage(stage: Callable[..., Awaitable[Any]], cfg: Config, wh: Warehouse, run_id: str | None,
              *args: Any, **kwargs: Any) -> Any:
    """One stage coroutine run the way a flow runs it: in its own loop, over a fresh run scope."""

    async def go() -> Any:
        async with open_run_scope(cfg, wh, run_id) as scope:
            return await stage(scope, *args, **kwargs)

    return asyncio.run(go())
