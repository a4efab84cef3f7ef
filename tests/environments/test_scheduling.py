"""Sandbox workers and their sessions run under SCHED_BATCH (`worker.policy.batch_scheduling`): a request written to
a worker does not preempt the pool's event loop, which also keeps the model endpoints busy."""

from __future__ import annotations

import asyncio
import os

import pytest

from arenaforge.environments.runtime import create_pool
from arenaforge.schemas.config import SandboxConfig
from arenaforge.schemas.models import Environment, FunctionDoc
from tests.support.requirements import require_docker

POLICY = Environment(
    name="policy", tools=[FunctionDoc(name="policy", description="The session's CPU scheduling policy.")],
    code="import os\n\ndef policy():\n    return os.sched_getscheduler(0)\n")


@pytest.mark.parametrize("backend", ["process", pytest.param("docker", marks=pytest.mark.docker)])
def test_a_session_runs_under_sched_batch(backend: str) -> None:
    if backend == "docker":
        require_docker()

    async def scenario() -> str | None:
        async with await create_pool(SandboxConfig(backend=backend, pool_size=1)) as pool:
            session = await pool.open(POLICY)
            try:
                obs = await pool.call(session, "policy", {})
            finally:
                await pool.close(session)
            assert obs.outcome == "ok", obs
            return obs.output

    assert asyncio.run(scenario()) == str(os.SCHED_BATCH)
    assert os.sched_getscheduler(0) == os.SCHED_OTHER  # the pool's own process keeps the default policy
