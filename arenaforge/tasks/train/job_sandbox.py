"""The sandbox pool a training job's rollouts run in, shut down when the job's block ends."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator

from arenaforge.schemas.config import Config
from arenaforge.tasks.rollout.episodes import SandboxPool


@contextlib.asynccontextmanager
async def sandbox_pool(cfg: Config) -> AsyncIterator[SandboxPool]:
    from arenaforge.environments.containers import RoutedPool
    from arenaforge.environments.runtime import create_pool

    pool = RoutedPool(await create_pool(cfg.sandbox))  # container tasks (imported Harbor) run in their own containers
    try:
        yield pool
    finally:
        await pool.shutdown()
