"""Sandboxes across several Docker engines (`sandbox.engines`): spread, image copied, one engine lost mid-run."""

from __future__ import annotations

import asyncio
import os

import pytest

from arenaforge.environments.runtime import EnvironmentFailure, SessionLost, WorkerLost, create_pool
from arenaforge.environments.runtime.docker_backend import docker_client
from arenaforge.environments.runtime.image import image_ref
from arenaforge.schemas.config import SandboxConfig
from arenaforge.schemas.errors import ConfigError, FailureKind, SandboxError
from arenaforge.schemas.models import Environment, FunctionDoc
from tests.support.dockerd import second_dockerd
from tests.support.requirements import require_docker

pytestmark = pytest.mark.docker

COUNTER = '''
STATE = {"n": 0}


def bump():
    STATE["n"] += 1
    return STATE["n"]
'''
ENV = Environment(name="counter", tools=[FunctionDoc(name="bump")], code=COUNTER, data_var="STATE",
                  initial_state={"n": 0})
DEFAULT_ENGINE = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
SESSIONS = 8
CALLS = 40  # per session; the second engine is killed once every session has made KILL_AFTER of them
KILL_AFTER = 5


def _config(engines: list[str]) -> SandboxConfig:
    return SandboxConfig(backend="docker", engines=engines, pool_size=4, call_timeout_s=5.0, memory_mb=256, pids=32)


def _engine_of(session) -> str:  # noqa: ANN001 - a pool Session
    return session.worker.transport.engine


async def _until(condition, what: str, limit_s: float = 120) -> None:  # noqa: ANN001
    """Wait for `condition()` to hold (polled), failing with `what` past a generous limit."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + limit_s
    while not condition():
        assert loop.time() < deadline, f"waited {limit_s:g} s for: {what}"
        await asyncio.sleep(0.05)


def test_sessions_spread_over_two_engines_and_losing_one_fails_only_its_sessions() -> None:
    require_docker()
    with second_dockerd() as second:
        ref = image_ref(SandboxConfig().image)
        fresh = docker_client(30, second.url)
        assert not fresh.images.list(name=SandboxConfig().image), "a new engine starts without the sandbox image"
        fresh.close()
        asyncio.run(_scenario(second, ref))


async def _scenario(second, ref: str) -> None:  # noqa: ANN001 - tests.support.dockerd.SecondEngine
    engines = [DEFAULT_ENGINE, second.url]
    async with await create_pool(_config(engines)) as pool:
        # the pool copied the image to the new engine and put half the workers on each
        copied = docker_client(30, second.url)
        assert copied.images.get(ref).tags == [ref]
        copied.close()
        assert [(e["engine"], e["workers"]) for e in pool.stats()["engines"]] == [(DEFAULT_ENGINE, 2), (second.url, 2)]

        sessions = [await pool.open(ENV) for _ in range(SESSIONS)]
        on_second = {s.id for s in sessions if _engine_of(s) == second.url}
        assert len(on_second) == SESSIONS // 2, "sessions spread evenly over the engines"

        progress = {s.id: 0 for s in sessions}
        failures: dict[str, EnvironmentFailure] = {}
        counts: dict[str, list[int]] = {s.id: [] for s in sessions}

        killed = asyncio.Event()

        async def drive(session) -> None:  # noqa: ANN001
            for n in range(CALLS):
                if n == KILL_AFTER:  # the rest of the calls only once the engine is gone, so none can outrun the kill
                    await killed.wait()
                try:
                    obs = await pool.call(session, "bump", {})
                except EnvironmentFailure as err:
                    failures[session.id] = err
                    return
                assert obs.outcome == "ok", obs
                counts[session.id].append(int(obs.output))
                progress[session.id] += 1
                await asyncio.sleep(0)  # let the other sessions' calls interleave with this one's

        async def kill_mid_run() -> None:
            await _until(lambda: min(progress.values()) >= KILL_AFTER, "every session made its first calls")
            await asyncio.to_thread(second.kill)
            killed.set()

        await asyncio.gather(kill_mid_run(), *(drive(s) for s in sessions))

        # the lost engine's sessions ended with a typed infrastructure failure, and only those
        assert set(failures) == on_second, (set(failures), on_second)
        for err in failures.values():
            assert isinstance(err, (WorkerLost, SessionLost)) and err.kind == FailureKind.INFRASTRUCTURE, err
        # the others ran every call with their state intact
        for sid in progress.keys() - on_second:
            assert counts[sid] == list(range(1, CALLS + 1))
        for sid in on_second:
            assert len(counts[sid]) == KILL_AFTER

        # the dead workers are replaced on the live engine; the lost one is marked
        await _until(lambda: pool.stats()["workers"] == 4, "the lost engine's workers are replaced")
        stats = {e["engine"]: e for e in pool.stats()["engines"]}
        assert stats[DEFAULT_ENGINE]["workers"] == 4 and stats[second.url]["workers"] == 0
        assert "does not answer" in stats[second.url]["lost"]

        # later sessions (new ones, and the failed ones restarting) all run on the live engine
        later = [await pool.open(ENV) for _ in range(4)] + [s for s in sessions if s.id in on_second]
        for session in later:
            obs = await pool.call(session, "bump", {})
            assert obs.outcome == "ok" and _engine_of(session) == DEFAULT_ENGINE
        for session in sessions + later[:4]:
            await pool.close(session)


def test_an_engine_that_does_not_answer_is_named_and_a_duplicate_is_refused() -> None:
    require_docker()
    missing = "unix:///tmp/af-no-such-engine.sock"
    with pytest.raises(SandboxError, match="af-no-such-engine.sock"):
        asyncio.run(create_pool(_config([DEFAULT_ENGINE, missing])))
    with pytest.raises(ConfigError, match="twice"):
        asyncio.run(create_pool(_config([DEFAULT_ENGINE, DEFAULT_ENGINE])))


@pytest.mark.slow
def test_bench_compares_the_pool_over_two_engines_with_one() -> None:
    """`bench sandbox --engines`: the same calls with every worker on the first engine, then spread over both."""
    from arenaforge.benchmarks.sandbox_engines import compare_engines

    require_docker()
    with second_dockerd() as second:
        cfg = _config([])
        result = asyncio.run(compare_engines(cfg, ENV, "bump", {}, [DEFAULT_ENGINE, second.url], calls=160,
                                             concurrency=16, rounds=1))
    one, both = result["runs"]["one_engine"][0], result["runs"]["all_engines"][0]
    assert one["calls"] == both["calls"] == 160 and one["failed"] == both["failed"] == 0
    assert one["sessions_per_engine"] == {DEFAULT_ENGINE: 16}
    assert both["sessions_per_engine"] == {DEFAULT_ENGINE: 8, second.url: 8}
    assert result["all_over_one"] == round(both["calls_per_s"] / one["calls_per_s"], 2)
