"""A worker survives events that arrive together (issue F): when the pool's `unload` of an environment version and a
message (or the death) of that version's zygote reach the worker in the same loop turn, the unload closes the zygote's
channel before its event is handled. That event used to reach a closed socket (`ValueError: Invalid file descriptor:
-1`), the worker exited with status 1 and its open sessions were lost as `sandbox_failure`.

The worker process alone is stopped (SIGSTOP; its zygote keeps running) while both events queue, then continued, so
one `select` returns both; everything waits on process states, never on the clock. Process backend: it needs the
worker's and zygote's host pids.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from arenaforge.environments.runtime.process_backend import describe_returncode
from tests.environments.conftest import PoolHandle, start_pool
from tests.environments.toolsets import retail_functions_env


@pytest.fixture(scope="module")
def one_worker() -> Iterator[PoolHandle]:
    yield from start_pool("process", pool_size=1)


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "gone"


async def _until(condition, what: str, limit_s: float = 60.0) -> None:
    """Poll `condition` (process states change without an event to await); `limit_s` only bounds a failure."""
    give_up = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < give_up, f"still waiting for {what}"
        await asyncio.sleep(0.01)


def test_an_unload_and_its_zygotes_death_in_one_turn_leave_the_worker_alive(one_worker: PoolHandle) -> None:
    pool = one_worker.pool

    async def scenario() -> tuple[dict, bool, int]:
        worker = pool.workers[0]
        assert worker is not None and worker.alive
        template = pool.template(retail_functions_env())
        await pool._load(worker, template)
        relay = worker.transport.proc.pid
        # root: the relay's only child is the worker (PID 1 of its namespace); otherwise the relay is the worker
        server = (_children(relay) or [relay])[0]
        await _until(lambda: len(_children(server)) == 1, "the zygote to be the worker's only child")
        zygote = _children(server)[0]
        os.kill(server, signal.SIGSTOP)
        try:
            await _until(lambda: _state(server) == "T", "the worker to stop")
            del worker.loaded[template.key]
            unload = asyncio.ensure_future(worker.request({"op": "unload", "key": template.key}, timeout=60))
            await _until(lambda: not worker.outbuf and worker.transport.buffered() == 0, "the unload to be written")
            os.kill(zygote, signal.SIGKILL)  # its channel reads EOF: an event queued behind the unload
            await _until(lambda: _state(zygote) in ("Z", "gone"), "the zygote to die")
        finally:
            os.kill(server, signal.SIGCONT)
        reply = await unload
        ping = await worker.request({"op": "ping"}, timeout=60)
        return reply, worker.alive and bool(ping.get("ok")), pool.replaced

    reply, alive, replaced = one_worker.run(scenario())
    assert reply.get("ok") is True
    assert alive and replaced == 0


def test_a_dead_workers_exit_status_is_described() -> None:
    assert describe_returncode(1) == "it exited with status 1"
    assert describe_returncode(-9) == "it was killed by SIGKILL"
    assert describe_returncode(128 + 13) == "it was killed by SIGPIPE"  # the PID-namespace relay's way to say it
