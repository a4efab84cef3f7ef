"""Spare sessions (issue 15): a worker keeps up to `spare_sessions` sessions of a reused environment version forked,
confined and loaded ahead (one more per open), so opens back to back are hand-overs; only the version opened last
keeps more than one; each handed-over session starts from the initial state."""

from __future__ import annotations

import asyncio

import pytest

from arenaforge.environments.runtime import create_pool
from arenaforge.schemas.config import SandboxConfig
from arenaforge.schemas.models import Environment, FunctionDoc
from tests.support.requirements import require_docker

COUNTER = Environment(
    name="counter", tools=[FunctionDoc(name="bump", description="Add one and return the count.")], data_var="STATE",
    code="STATE = {}\n\ndef bump():\n    STATE['n'] = STATE.get('n', 0) + 1\n    return STATE['n']\n",
    initial_state={"n": 0})


async def ready_spares(pool) -> int:
    """The worker's count of spares once every one of them is ready (it forks them right after an open)."""
    for _ in range(5000):
        info = (await pool.ping())[0]
        if info["spares"] == info["spares_ready"]:
            return info["spares"]
        await asyncio.sleep(0)  # a ping is a round trip to the worker: the condition is re-read, not timed
    raise AssertionError(f"spares never all ready: {info}")


@pytest.mark.parametrize("backend", ["process", pytest.param("docker", marks=pytest.mark.docker)])
def test_several_spares_are_kept_and_each_hand_over_starts_fresh(backend: str) -> None:
    if backend == "docker":
        require_docker()

    async def scenario() -> tuple:
        cfg = SandboxConfig(backend=backend, pool_size=1, spare_sessions=3)
        async with await create_pool(cfg) as pool:
            grown = []
            for _ in range(4):  # a version opened again gets a spare, one more per open (up to 3)
                await pool.close(await pool.open(COUNTER))
                grown.append(await ready_spares(pool))
            before = grown[-1]
            sessions = [await pool.open(COUNTER) for _ in range(3)]  # back to back, all open at once
            counts = [(await pool.call(s, "bump")).output for s in sessions]
            counts += [(await pool.call(sessions[0], "bump")).output]
            for s in sessions:
                await pool.close(s)
            after = await ready_spares(pool)
            other = Environment.model_validate({**COUNTER.model_dump(), "id": "", "initial_state": {"n": 10}})
            for _ in range(4):  # another version in demand: it gets 3, the first one keeps 1
                await pool.close(await pool.open(other))
            both = await ready_spares(pool)
            fresh = await pool.open(COUNTER)
            first_again = (await pool.call(fresh, "bump")).output
            await pool.close(fresh)
            return grown, before, counts, after, both, first_again

    grown, before, counts, after, both, first_again = asyncio.run(scenario())
    assert grown == [0, 1, 2, 3] and before == 3 and after == 3  # one spare before this change
    assert counts == ["1", "1", "1", "2"]  # independent sessions, each from the initial state
    assert both == 4 and first_again == "1"  # extra spares only for the version opened last: memory stays bounded
