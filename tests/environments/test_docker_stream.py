"""A Docker worker's stream lives as long as its worker, whenever the garbage collector runs.

docker-py's `attach_socket` returns a wrapper that holds the HTTP response of the attach request. The pool used to keep
only the socket under it, so the response (in a reference cycle) was collected at whatever moment the collector next
ran, and urllib3 then closed its connection: that socket. The engine saw the connection close and ended the worker's
stdin (it exited 0); the pool's reader, its file descriptor closed under it, heard nothing, and every call of the
worker's sessions waited out its deadline (`bench sandbox` hung at concurrency 64 in 2 of ~40 Docker runs). It
happened to workers started together, as a pool starts them: in 4 threads, one or more of 4 sockets closed on the
next `gc.collect()` in 7 of 15 rounds.
"""

from __future__ import annotations

import asyncio
import gc

import pytest

from arenaforge.environments.runtime import create_pool
from arenaforge.schemas.config import SandboxConfig
from arenaforge.schemas.models import Environment, FunctionDoc
from tests.support.requirements import require_docker

ECHO = Environment(name="echo", tools=[FunctionDoc(name="echo")], code="def echo(text=''):\n    return text\n")
WORKERS = 6


@pytest.mark.docker
def test_every_worker_of_a_docker_pool_still_answers_after_a_garbage_collection() -> None:
    require_docker()

    async def scenario() -> list[list[str]]:
        rounds = []
        for _ in range(2):
            cfg = SandboxConfig(backend="docker", pool_size=WORKERS, call_timeout_s=5.0, spare_sessions=0)
            async with await create_pool(cfg) as pool:
                gc.collect()  # the moment the collector ran in the hung runs: now, before any session
                sessions = await asyncio.gather(*(pool.open(ECHO) for _ in range(4 * WORKERS)))
                assert len({s.worker.index for s in sessions}) == WORKERS  # sessions on every worker
                gc.collect()
                observations = await asyncio.gather(*(pool.call(s, "echo", {"text": s.id}) for s in sessions))
                rounds.append([f"{o.outcome}:{o.output}" for o in observations])
                assert [o.output for o in observations] == [s.id for s in sessions]
        return rounds

    rounds = asyncio.run(scenario())
    assert all(outcome.startswith("ok:") for answers in rounds for outcome in answers), rounds
