"""Deadlines are deadlines: a reply past its deadline fails that call or open with a typed
infrastructure failure, and the worker and every other session on it live on (issue 20).

The worker is frozen (SIGSTOP of its process group, `docker pause` of its container) so that
it cannot answer in time, then thawed: nothing here waits on the clock, only on the call to end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import sys

import pytest

from arenaforge.environments.runtime import EnvironmentFailure, Overloaded, SessionLost, WorkerLost
from arenaforge.schemas.errors import FailureKind
from arenaforge.schemas.models import ToolObservation
from tests.environments.conftest import PoolHandle, frozen, start_pool
from tests.environments.toolsets import adversarial_env, retail_functions_env
from tests.support.procfs import read_or_empty


@pytest.fixture(scope="module", params=["process", pytest.param("docker", marks=pytest.mark.docker)])
def one_worker(request: pytest.FixtureRequest):
    # one worker, so every session shares it; short limits, so the pool-side deadline comes soon; sessions stay on
    # the cores a test gives them (a busy one would move to a core of its own: `busy_session_cores`)
    yield from start_pool(request.param, pool_size=1, call_timeout_s=0.5, open_timeout_s=1.0, busy_session_cores=0)


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


def test_a_worker_that_stays_stopped_is_replaced_and_its_sessions_are_told() -> None:
    handle = next(start := start_pool("process", pool_size=1, call_timeout_s=0.5, open_timeout_s=1.0, worker_stall_s=1.0))
    pool = handle.pool
    try:
        async def scenario() -> tuple[BaseException | None, BaseException | None, str]:
            env = retail_functions_env()
            neighbour, slow = await pool.open(env), await pool.open(env)
            worker = slow.worker
            os.killpg(worker.transport.proc.pid, signal.SIGSTOP)  # stopped for good: it never answers the probe
            overdue = lost = None
            try:
                await pool.call(slow, "get_user_balance", {"user_id": "u1"})
            except EnvironmentFailure as err:
                overdue = err
            while worker.alive:  # the liveness probe gives up on it after worker_stall_s
                await asyncio.sleep(0.05)
            try:
                await pool.call(neighbour, "get_user_balance", {"user_id": "u1"})
            except EnvironmentFailure as err:
                lost = err
            again = await pool.call(neighbour, "get_user_balance", {"user_id": "u1"})
            return overdue, lost, again.output

        overdue, lost, again = handle.run(scenario())
        assert isinstance(overdue, Overloaded)
        assert isinstance(lost, SessionLost)  # the neighbour is told once that its state is gone ...
        assert again == "100.0"  # ... and goes on from the initial state on a new worker
        assert pool.replaced == 1
    finally:
        start.close()


def test_a_worker_dying_mid_call_is_worker_lost_not_the_tools_fault(one_worker: PoolHandle) -> None:
    pool = one_worker.pool

    async def scenario() -> BaseException | None:
        session = await pool.open(adversarial_env())
        call = asyncio.ensure_future(pool.call(session, "sleep_forever", {}, timeout_s=30))
        while not session.worker.pending:  # the call is in flight
            await asyncio.sleep(0.01)
        await session.worker.transport.kill()
        try:
            await call
        except EnvironmentFailure as err:
            return err
        finally:
            await pool.close(session)
        return None

    failure = one_worker.run(scenario())
    assert isinstance(failure, WorkerLost) and failure.failure == "worker_lost" and failure.kind == FailureKind.INFRASTRUCTURE


def test_a_starved_call_is_overloaded_and_a_long_one_is_a_timeout(one_worker: PoolHandle) -> None:
    """A session pinned to one CPU at the lowest priority beside a hog barely runs: missing its deadline is the
    machine's fault (overloaded). Unpinned, a call that computes past its limit is the tool's (timeout)."""
    pool = one_worker.pool

    async def scenario() -> tuple[BaseException | ToolObservation, ToolObservation]:
        session = await pool.open(adversarial_env())
        uid = json.loads((await pool.call(session, "whoami", {})).output)["uid"]
        pid = next(int(p) for p in os.listdir("/proc") if p.isdigit() and _owner(p) == uid)
        os.sched_setaffinity(pid, {0})
        os.setpriority(os.PRIO_PROCESS, pid, 19)
        async with _hog_on_cpu0(session.worker, pid):
            try:
                starved: BaseException | ToolObservation = await pool.call(session, "burn", {"seconds": 0.3}, timeout_s=0.5)
            except EnvironmentFailure as err:
                starved = err
        too_long = await pool.call(session, "burn", {"seconds": 5.0}, timeout_s=0.5)  # a fresh process, unpinned
        await pool.close(session)
        return starved, too_long

    starved, too_long = one_worker.run(scenario())
    assert isinstance(starved, Overloaded), starved
    assert too_long.outcome == "timeout" and "time limit" in (too_long.error or "")


HOG = "import os\nos.sched_setaffinity(0, {0})\nwhile True: pass  # arenaforge-test-hog"


@contextlib.asynccontextmanager
async def _hog_on_cpu0(worker, session_pid: int):
    """A busy loop on CPU 0 beside the session (in the container, or here), which weighs next to nothing."""
    container = getattr(worker.transport, "container", None)
    hog_argv = ["/usr/bin/python3", "-c", HOG]
    if container is not None and "cpu" in worker.info.get("cgroups", []):
        # a session in a CPU group of its own (beside its worker, in the container's) weighs as its group does,
        # whatever its nice value, and the worker sets that weight during a call (`cgroups.weigh`): the hog gets a
        # group of its own that weighs the most
        group = "/tmp/.arenaforge-cgroup-cpu/test-hog"
        enter = f"mkdir -p {group} && echo 262144 > {group}/cpu.shares && echo $$ > {group}/cgroup.procs"
        hog_argv = ["/bin/sh", "-c", f"{enter} && exec /usr/bin/python3 -c '{HOG}'"]
    # nice values only weigh within one autogroup: where the session has one of its own, lower it too (the process
    # backend's workers share the pool's, where the session's nice value already weighs against the hog)
    autogroup = f"/proc/{session_pid}/autogroup"
    before = read_or_empty(autogroup) if container is None else ""
    lowered = bool(before) and before.split(" nice ")[0] != read_or_empty("/proc/self/autogroup").split(" nice ")[0]
    if lowered:
        with open(autogroup, "w") as fh:
            fh.write("19")
    if container is None:
        hog = subprocess.Popen([sys.executable, "-c", HOG])
        pids = [hog.pid]
    else:
        await asyncio.to_thread(container.exec_run, hog_argv, detach=True)
        pids = []
    while not pids or _cpu_s(pids[0]) < 0.05:  # wait until the hog is up and spinning
        pids = pids or [int(p) for p in os.listdir("/proc") if p.isdigit()
                        and _cmdline(p).startswith(b"/usr/bin/python3\0-c\0") and b"arenaforge-test-hog" in _cmdline(p)]
        await asyncio.sleep(0.01)
    try:
        yield
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        if container is None:
            hog.wait()
        if lowered:  # the session may be gone by now (a timed-out call's session is killed): nothing to restore
            with contextlib.suppress(FileNotFoundError, ProcessLookupError), open(autogroup, "w") as fh:
                fh.write(before.split(" nice ")[1])


def _owner(pid: str) -> int:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return -1


def _cpu_s(pid: int) -> float:
    try:
        with open(f"/proc/{pid}/schedstat") as fh:
            return int(fh.read().split()[0]) / 1e9
    except (OSError, ValueError):
        return 0.0


def _cmdline(pid: str) -> bytes:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as fh:
            return fh.read()
    except OSError:
        return b""


def test_an_episode_the_sandbox_fails_is_env_failure_and_left_out(one_worker: PoolHandle) -> None:
    from transformers import AutoTokenizer

    from arenaforge.testing.scripted_policy import ScriptedEngine
    from arenaforge.tracks.train.params import EpisodeParams
    from arenaforge.tracks.train.rollout.episodes import run_episode
    from arenaforge.tracks.train.rollout.evaluate import summarise
    from tests.support.rl import call_text, tiny_env, tiny_model_path

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_path())
    pool = one_worker.pool
    env = tiny_env()
    killed: list[str] = []

    def respond(_prompt: str, turn: int) -> str:
        if turn == 1:  # the sandbox worker dies between the agent's two calls (killed here and now)
            transport = next(w for w in pool.workers if w is not None and w.alive).transport
            container = getattr(transport, "container", None)
            if container is not None:
                container.kill()
            else:
                os.killpg(transport.proc.pid, signal.SIGKILL)
            killed.append(transport.name)
        return call_text("get_capital", country="Freedonia") if turn == 0 else call_text("get_population", city="Quaxton")

    async def scenario():
        engine = ScriptedEngine(tokenizer, respond)
        failed = await run_episode(engine, tokenizer, pool, env, EpisodeParams().rollout_config())
        while not all(w is not None and w.alive for w in pool.workers):
            await asyncio.sleep(0.05)
        good = await run_episode(ScriptedEngine(tokenizer, lambda _p, i: [
            call_text("get_capital", country="Freedonia"), call_text("get_population", city="Quaxton"), "81234"][i]),
            tokenizer, pool, env, EpisodeParams().rollout_config())
        return failed.rollout, good.rollout

    failed, good = one_worker.run(scenario())
    assert killed and failed.status == "env_failure" and "sandbox failure (" in (failed.failure_reason or "")
    assert failed.tool_errors == 0  # not charged to the agent as a tool error
    summary = summarise([failed, good], policy="p", engine="scripted", env_ids=[env.id], samples=1, started_at="t")
    assert summary.episodes == 1 and summary.f1 == good.reward.f1 == 1.0  # left out of the averages ...
    assert summary.statuses == {"env_failure": 1, "finished": 1}  # ... and counted
