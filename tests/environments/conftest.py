"""Pools shared by a test module, driven from sync tests through an event loop on a thread."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import threading
from collections.abc import AsyncIterator, Coroutine, Iterator
from typing import Any, TypeVar

import pytest

from arenaforge.environments.runtime import Pool, create_pool
from arenaforge.schemas.config import SandboxConfig
from tests.support.requirements import require_docker

T = TypeVar("T")
HOST_SECRET = "arenaforge-host-secret-5f1c9e"


class LoopThread:
    """An asyncio loop on a daemon thread; `run(coro)` blocks for its result."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 120) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


class PoolHandle:
    def __init__(self, runner: LoopThread, pool: Pool) -> None:
        self.runner = runner
        self.pool = pool
        self.backend = pool.backend

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 120) -> T:
        return self.runner.run(coro, timeout)


def sandbox_config(backend: str, **overrides: Any) -> SandboxConfig:
    base = {"backend": backend, "pool_size": 2, "call_timeout_s": 5.0, "memory_mb": 256, "pids": 32}
    return SandboxConfig(**{**base, **overrides})


def start_pool(backend: str, **overrides: Any) -> Iterator[PoolHandle]:
    if backend == "docker":
        require_docker()
    os.environ["ARENAFORGE_TEST_SECRET"] = HOST_SECRET  # a host secret the tools must not see
    runner = LoopThread()
    try:
        pool = runner.run(create_pool(sandbox_config(backend, **overrides)), timeout=600)
        try:
            yield PoolHandle(runner, pool)
        finally:
            runner.run(pool.shutdown())
    finally:
        runner.stop()
        os.environ.pop("ARENAFORGE_TEST_SECRET", None)


BACKENDS = [pytest.param("process", id="process"), pytest.param("docker", id="docker", marks=pytest.mark.docker)]


@pytest.fixture(scope="module", params=BACKENDS)
def sandbox(request: pytest.FixtureRequest) -> Iterator[PoolHandle]:
    yield from start_pool(request.param)


@contextlib.asynccontextmanager
async def frozen(worker: Any) -> AsyncIterator[None]:
    """Stop a worker (its whole process tree, or its container) for the duration of the block."""
    transport = worker.transport
    container = getattr(transport, "container", None)
    if container is not None:
        await asyncio.to_thread(container.pause)
    else:
        os.killpg(transport.proc.pid, signal.SIGSTOP)
    try:
        yield
    finally:
        if container is not None:
            await asyncio.to_thread(container.unpause)
        else:
            os.killpg(transport.proc.pid, signal.SIGCONT)
