"""Deadlines are deadlines: a reply past its deadline fails that call or open with a typed
infrastructure failure, and the worker and every other session on it live on (issue 20).

The worker is frozen (SIGSTOP of its process group, `docker pause` of its container) so that
it cannot answer in time, then thawed: nothing here waits on the clock, only on the call to end.
"""

from __future__ import annotations

import json

import pytest

from arenaforge.environments.runtime import EnvironmentFailure, Overloaded
from tests.environments.conftest import PoolHandle, frozen, start_pool
from tests.environments.toolsets import retail_functions_env


@pytest.fixture(scope="module", params=["process", pytest.param("docker", marks=pytest.mark.docker)])
def one_worker(request: pytest.FixtureRequest):
    # one worker, so every session shares it; short limits, so the pool-side deadline comes soon
    yield from start_pool(request.param, pool_size=1, call_timeout_s=0.5, open_timeout_s=1.0)


def test_a_slow_call_fails_alone_and_neighbours_keep_their_state(one_worker: PoolHandle) -> None:
    pool = one_worker.pool

    async def scenario() -> tuple[BaseException | None, str, str, int, bool]:
        env = retail_functions_env()
        neighbour, slow = await pool.open(env), await pool.open(env)
        await pool.call(neighbour, "cancel_pending_order", {"order_id": "W1001", "reason": "changed mind"})
        worker = neighbour.worker
        failure = None
        async with frozen(worker):
            try:
                await pool.call(slow, "get_user_balance", {"user_id": "u1"}, timeout_s=0.5)
            except EnvironmentFailure as err:
                failure = err
        after = await pool.call(neighbour, "get_order_details", {"order_id": "W1001"})
        again = await pool.call(slow, "get_user_balance", {"user_id": "u1"})
        same = neighbour.worker is worker and worker.alive
        await pool.close(neighbour)
        await pool.close(slow)
        return failure, after.output, again.output, pool.replaced, same

    failure, neighbour_order, slow_again, replaced, same_worker = one_worker.run(scenario())
    assert isinstance(failure, Overloaded), failure
    assert json.loads(neighbour_order)["status"] == "cancelled"  # the neighbour's state survived
    assert slow_again == "100.0"  # the slow session works again (from its initial state)
    assert replaced == 0 and same_worker


def test_a_slow_open_fails_alone_and_neighbours_keep_their_state(one_worker: PoolHandle) -> None:
    pool = one_worker.pool

    async def scenario() -> tuple[BaseException | None, str, int]:
        env = retail_functions_env()
        neighbour = await pool.open(env)
        await pool.call(neighbour, "cancel_pending_order", {"order_id": "W1001", "reason": "changed mind"})
        failure = None
        async with frozen(neighbour.worker):
            try:
                await pool.close(await pool.open(env))
            except EnvironmentFailure as err:
                failure = err
        after = await pool.call(neighbour, "get_order_details", {"order_id": "W1001"})
        await pool.close(neighbour)
        return failure, after.output, pool.replaced

    failure, neighbour_order, replaced = one_worker.run(scenario())
    assert isinstance(failure, Overloaded), failure
    assert json.loads(neighbour_order)["status"] == "cancelled"
    assert replaced == 0
