"""What the stages of one flow run share: config, warehouse, run id, the ChatModel, the sandbox pool and the
knowledge sources.

A flow opens one `RunScope` (`open_run_scope`) in its event loop and hands it to every stage, so the
stages of a run share one model (one HTTP session, one concurrency budget per endpoint), one warm
sandbox pool started on first use, and each knowledge source loaded once. All are closed when the
scope exits: the model's cache and usage rows flushed, the pool's workers stopped, the sources closed.

`recorded_scope` also keeps the run's `runs` row: started as the scope opens, finished (completed, or failed
with the error) with the counts its stages filled in `scope.counts`. A stage recorded as a run of its own (a
training run's evaluations and warm start) takes `scope.stage_run(...)`: its own row on the same pool.

A training scope (`training=True`) opens no chat model (the policy samples itself) and does not tenure the
heap (`heap.py`: autograd's reference cycles must be freed as they die); its sandbox pool routes container
tasks (imported Harbor suites) to their own containers.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

from arenaforge.schemas.base import Provenance
from arenaforge.schemas.config import Config
from arenaforge.services.heap import tenured_heap
from arenaforge.services.models import ChatModel, open_chat_model
from arenaforge.warehouse.db import Warehouse
from arenaforge.warehouse.runs import recorded_run


@dataclass
class RunScope:
    cfg: Config
    wh: Warehouse
    run_id: str | None
    model: ChatModel | None  # None in a training scope
    training: bool = False
    counts: dict[str, int] = field(default_factory=dict)  # what the run produced (its `runs` row, recorded_scope)
    _parent: RunScope | None = field(default=None, repr=False)  # a stage_run's scope: the pool is its parent's
    _pool: Any = field(default=None, repr=False)
    _own_pool: bool = field(default=False, repr=False)
    _pool_lock: asyncio.Lock = field(default_factory=asyncio.Lock, repr=False)
    # the envs track's knowledge sources by (name, shared data), each loaded once per run (`envs.knowledge.run_sources`)
    sources: dict[tuple[str, str | None], Any] = field(default_factory=dict, repr=False)
    merge_index: Any = field(default=None, repr=False)  # the envs track's merge groups (pipeline.merge_index)
    distractor_pool: Any = field(default=None, repr=False)  # tools earlier windows and runs built (pipeline)

    async def sandbox(self) -> Any:
        """The run's sandbox pool (started on first use, shared by every stage of the run)."""
        if self._parent is not None:
            return await self._parent.sandbox()
        async with self._pool_lock:
            if self._pool is None:
                from arenaforge.environments.runtime import create_pool

                self._pool = await create_pool(self.cfg.sandbox)
                if self.training:  # rollouts of imported container tasks run in their own containers
                    from arenaforge.environments.containers import RoutedPool

                    self._pool = RoutedPool(self._pool)
                self._own_pool = True
        return self._pool

    def use_sandbox(self, pool: Any) -> None:
        """Run the stages on a pool the caller owns (and shuts down)."""
        self._pool, self._own_pool = pool, False

    def provenance(self, seed: int | None = None, prompt_hash: str | None = None) -> Provenance:
        assert self.model is not None, "a training scope has no chat model"
        return Provenance(backend=self.model.kind, model=self.model.name, seed=seed, prompt_hash=prompt_hash)

    @contextlib.contextmanager
    def stage_run(self, flow: str, params: dict[str, Any]) -> Iterator[RunScope]:
        """A stage recorded as a run of its own (its `runs` row, its counts) on this scope's pool and sources."""
        with recorded_run(self.wh, flow, params) as (run, counts):
            yield replace(self, run_id=run.id, counts=counts, _parent=self, _pool=None, _own_pool=False)

    async def close(self) -> None:
        sources, self.sources = self.sources, {}
        for source in sources.values():
            source.close()
        pool, self._pool = self._pool, None
        if pool is not None and self._own_pool:
            await pool.shutdown()


@contextlib.asynccontextmanager
async def open_run_scope(cfg: Config, wh: Warehouse, run_id: str | None, *,
                         training: bool = False) -> AsyncIterator[RunScope]:
    # a synthesis run's inputs and caches are not walked again by every full collection; training's are (autograd)
    with contextlib.nullcontext() if training else tenured_heap():
        async with contextlib.nullcontext() if training else open_chat_model(cfg.model, wh, run_id) as model:
            scope = RunScope(cfg, wh, run_id, model, training)
            try:
                yield scope
            finally:
                await scope.close()


@contextlib.asynccontextmanager
async def recorded_scope(cfg: Config, wh: Warehouse, flow: str, params: dict[str, Any], *,
                         training: bool = False) -> AsyncIterator[RunScope]:
    """The scope of a run with its `runs` row: completed with `scope.counts` when the block ends, or failed."""
    with recorded_run(wh, flow, params) as (run, counts):
        async with open_run_scope(cfg, wh, run.id, training=training) as scope:
            scope.counts = counts
            yield scope
