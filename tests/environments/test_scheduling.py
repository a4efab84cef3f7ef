"""A session whose call runs long weighs less among its worker's sessions until its next call (`cgroups.weigh`). Sandbox
workers, their zygotes and sessions run under the default policy, whatever the pool's process runs under, so
each hop of a call (worker, session) preempts a neighbour's busy processes on waking (`worker.policy.wake_preempting`;
under SCHED_BATCH each waited for the next tick); and, on the process backend, the nice value `sandbox.nice`, weighed
in the pool's own autogroup, so the pool's process comes first: its workers stay in the pool's session and give up its
terminal (`worker.policy.leave_terminal`)."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from arenaforge.environments.runtime import create_pool
from arenaforge.environments.runtime.worker.cgroups import NICE_WEIGHT
from arenaforge.schemas.config import SandboxConfig
from arenaforge.schemas.models import Environment, FunctionDoc
from tests.support.procfs import read_or_empty
from tests.support.requirements import require_docker

POLICY = Environment(
    name="policy", tools=[FunctionDoc(name="policy", description="The session's CPU scheduling.")],
    code=textwrap.dedent("""
        import json, os

        def policy():
            try:
                with open("/proc/self/autogroup") as fh:
                    group = fh.read().split(" nice ")[0]
            except OSError:
                group = ""
            return json.dumps({"policy": os.sched_getscheduler(0), "nice": os.getpriority(os.PRIO_PROCESS, 0),
                               "autogroup": group, "zygote_policy": os.sched_getscheduler(os.getppid())})
        """))


def _session_scheduling(backend: str, **cfg: object) -> dict:
    async def scenario() -> dict:
        async with await create_pool(SandboxConfig(backend=backend, pool_size=1, **cfg)) as pool:  # type: ignore[arg-type]
            session = await pool.open(POLICY)
            try:
                obs = await pool.call(session, "policy", {})
            finally:
                await pool.close(session)
            assert obs.outcome == "ok", obs
            return json.loads(obs.output)

    return asyncio.run(scenario())


@pytest.mark.parametrize("backend", ["process", pytest.param("docker", marks=pytest.mark.docker)])
def test_a_session_and_its_zygote_run_under_the_default_policy_under_a_batch_pool(backend: str) -> None:
    if backend == "docker":
        require_docker()
    before = os.sched_getscheduler(0)
    os.sched_setscheduler(0, os.SCHED_BATCH, os.sched_param(0))  # a flow started under `chrt -b`: workers inherit it
    try:
        got = _session_scheduling(backend)
    finally:
        os.sched_setscheduler(0, before, os.sched_param(0))
    assert got["policy"] == os.SCHED_OTHER  # its wake-ups preempt a neighbour's busy processes
    assert got["zygote_policy"] == os.SCHED_OTHER  # and so do its worker's, whose policy it keeps


def test_a_process_session_runs_at_the_configured_nice_value_in_the_pools_autogroup() -> None:
    assert SandboxConfig().nice == 19
    assert _session_scheduling("process")["nice"] == 19
    assert _session_scheduling("process", nice=7)["nice"] == 7
    got = _session_scheduling("process", nice=0)
    assert got["nice"] == 0
    if os.path.exists("/proc/self/autogroup"):  # a kernel that groups by session: the session is in ours
        with open("/proc/self/autogroup") as fh:
            assert got["autogroup"] == fh.read().split(" nice ")[0]
    assert os.getpriority(os.PRIO_PROCESS, 0) == 0  # the pool's own process keeps its priority


HOLD = Environment(
    name="hold", tools=[FunctionDoc(name="hold", description="Wait for SIGUSR1; say who waited."),
                        FunctionDoc(name="who", description="Say who answers."),
                        FunctionDoc(name="cores", description="The cores this session may run on."),
                        FunctionDoc(name="hold_leaving", description="Leave a process running, then hold.")],
    code=textwrap.dedent("""
        import os, signal

        def who():
            return str(os.getuid())

        def cores():
            return " ".join(map(str, sorted(os.sched_getaffinity(0))))

        def hold():
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
            signal.sigwait({signal.SIGUSR1})
            return str(os.getuid())

        def hold_leaving():
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
            if os.fork() == 0:  # left running: the call's `limit`, and the session ends
                while True:
                    signal.pause()
            signal.sigwait({signal.SIGUSR1})
            return str(os.getuid())
        """))


@pytest.mark.parametrize("backend", ["process", pytest.param("docker", marks=pytest.mark.docker)])
def test_a_long_call_weighs_less_among_its_workers_sessions_until_its_next_call(backend: str) -> None:
    """Its neighbours' short calls, and the worker relaying them, then preempt its processes on waking rather than
    wait for the next tick (docs/SANDBOX.md, Scheduling); a thread it left running stays light until the session's
    next call is sent. Watched from the host: the session's own cpu group."""
    if os.geteuid() != 0:
        pytest.skip("session CPU groups need a root worker")
    if backend == "docker":
        require_docker()

    async def scenario() -> tuple[int, list[int]]:
        cfg = SandboxConfig(backend=backend, pool_size=1, process_cpu_groups=True)  # type: ignore[arg-type]
        async with await create_pool(cfg) as pool:
            session = await pool.open(HOLD)
            if "cpu" not in session.worker.info.get("cgroups", []):
                pytest.skip(f"no session CPU groups here: {session.worker.info.get('cgroups_missing')}")
            # the session, found from the host by its CPU group, named after its worker's beside it (other tests'
            # sessions run too; every Docker worker names its group after its pid in the container, 1, so its
            # container's id tells them apart)
            container = getattr(session.worker.transport, "container", None)
            group = f"{container.id if container else ''}/{session.worker.info['cgroup_name']}-u"
            call = asyncio.create_task(pool.call(session, "hold", {}, timeout_s=60))
            pid = 0
            while not pid and not call.done():
                await asyncio.sleep(0.01)
                pid = next((int(p) for p in os.listdir("/proc") if p.isdigit() and group in _cpu_group(p)), 0)
            shares = f"/sys/fs/cgroup/cpu{_cpu_group(str(pid))}/cpu.shares"
            before = NICE_WEIGHT[int(read_or_empty(f"/proc/{pid}/stat").rsplit(")", 1)[1].split()[16]) + 20]
            while (during := int(read_or_empty(shares) or 0)) != max(2, before // 8) and not call.done():
                await asyncio.sleep(0.01)  # in flight past `YIELD_AFTER_S` (or its 60 s limit: the asserts say so)
            if not call.done():
                os.kill(pid, signal.SIGUSR1)
            obs = await call
            assert obs.outcome == "ok", obs  # not its time limit: it weighed less while it waited
            answered = int(read_or_empty(shares))
            # its next call is sent light and then weighs as before; a call that waits 1 ms for a CPU on a loaded
            # machine is light again, so ask until one answers sooner (never, if it were left light)
            for _ in range(100):
                assert (await pool.call(session, "who", {})).outcome == "ok"
                if (after := int(read_or_empty(shares))) == before:
                    break
            await pool.close(session)
            return int(obs.output), [before, during, answered, after]

    uid, (before, during, answered, after) = asyncio.run(scenario())
    assert uid > 0  # a session of its own uid, so its own group
    assert during < before  # lighter while its call runs
    assert answered == during  # and once it answered, until its next call
    assert after == before  # then it weighs as its worker, and its neighbours, again


@pytest.mark.parametrize("backend", ["process", pytest.param("docker", marks=pytest.mark.docker)])
def test_while_a_call_runs_long_the_worker_its_other_sessions_and_the_pool_keep_off_its_core(backend: str) -> None:
    """A busy session's processes spend much of their time in the kernel (forking, faulting, making files), where this
    kernel does not preempt them, so a hop of a neighbour's call woken onto their core waited there 1-4 ms (issue 35).
    While a session's pinned call runs, the worker, its other sessions and the pool's thread run on the other cores;
    they get every core back once it answers. The call is held open until the host signals it, so nothing here
    depends on how fast anything runs."""
    every = _cores_to_keep(backend)

    async def scenario() -> tuple[list, dict, list, list, dict, list, list]:
        async with await create_pool(_grouped(backend)) as pool:
            busy, neighbour, group, call, during = await _busy_beside(pool, "hold")
            mine = sorted(os.sched_getaffinity(0))  # this pool's thread, told before that reply
            # the other session's cores (pinned as well, if its call waits 1 ms for a CPU: then to the other core)
            seen = (await pool.call(neighbour, "cores", {})).output.split()
            _release(group)
            assert (held := await call).outcome == "ok", held
            seen_after = await _cores_once_free(pool, neighbour, every)
            mine_after = sorted(os.sched_getaffinity(0))
            after = (await pool.ping())[0]
            return during["pinned"].get(busy.id, []), during, seen, mine, after, seen_after, mine_after

    pinned, during, seen, mine, after, seen_after, mine_after = asyncio.run(scenario())
    assert len(pinned) == 1, during["pinned"]
    assert during["calm"] == [core for core in every if core not in pinned], (pinned, during["calm"])
    assert mine == during["calm"]  # the pool's thread, on the other cores
    assert [int(core) for core in seen] == during["calm"]  # and the other session
    assert after["calm"] == [] and [int(core) for core in seen_after] == every and mine_after == every


@pytest.mark.parametrize("backend", ["process", pytest.param("docker", marks=pytest.mark.docker)])
def test_a_busy_session_that_ends_gives_its_core_back_once_its_processes_are_gone(backend: str) -> None:
    """Its processes die on the core it was pinned to, and dying is kernel work too (a memfd freed, 60 processes torn
    down), so the others keep off that core until its group is empty; then every core, not one kept clear for good."""
    every = _cores_to_keep(backend)

    async def scenario() -> tuple[str, list, dict, list, list]:
        async with await create_pool(_grouped(backend)) as pool:
            _, neighbour, group, call, during = await _busy_beside(pool, "hold_leaving")
            _release(group)  # the child it left has the signal blocked as well
            ended = await call
            for _ in range(6000):  # until its processes are gone and its group removed (or the 2 s cap)
                if not (after := (await pool.ping())[0])["calm"]:
                    break
                await asyncio.sleep(0.01)
            seen_after = await _cores_once_free(pool, neighbour, every)
            return ended.outcome, during["calm"], after, seen_after, sorted(os.sched_getaffinity(0))

    outcome, calm, after, seen_after, mine_after = asyncio.run(scenario())
    assert outcome == "limit"  # the process it left ended the session
    assert len(calm) == len(every) - 1  # kept clear while its call ran
    assert after["calm"] == [] and [int(core) for core in seen_after] == every and mine_after == every


def _cores_to_keep(backend: str) -> list[int]:
    """This host's cores, or a skip where no core can be kept clear (one core, no root, no Docker)."""
    if os.geteuid() != 0:
        pytest.skip("session cpusets need a root worker")
    if backend == "docker":
        require_docker()
    every = sorted(os.sched_getaffinity(0))
    if len(every) < 2:
        pytest.skip("optional: one core here, so there is no other core to keep")
    return every


def _grouped(backend: str) -> SandboxConfig:
    return SandboxConfig(backend=backend, pool_size=1, process_cpu_groups=True)  # type: ignore[arg-type]


async def _busy_beside(pool, tool: str) -> tuple:
    """Two HOLD sessions; the first's `tool` call sent and held open, once it is pinned with a core kept clear for it.
    Returns (busy, neighbour, the busy session's CPU group as its processes' /proc/<pid>/cgroup ends, the call, the
    worker's info then)."""
    busy, neighbour = await pool.open(HOLD), await pool.open(HOLD)
    if "cpuset" not in busy.worker.info.get("cgroups", []):
        pytest.skip(f"no session cpusets here: {busy.worker.info.get('cgroups_missing')}")
    container = getattr(busy.worker.transport, "container", None)
    group = f"{container.id if container else ''}/{busy.worker.info['cgroup_name']}-u"
    group += (await pool.call(busy, "who", {})).output
    call = asyncio.create_task(pool.call(busy, tool, {}, timeout_s=60))
    # pinned 1 ms after it was sent (or its 60 s limit: the asserts say so); `who` may have left it pinned already,
    # if it waited 1 ms for a CPU, but then with no call in flight, so with no core kept clear
    while not ((during := (await pool.ping())[0])["pinned"].get(busy.id) and during["calm"]) and not call.done():
        await asyncio.sleep(0.01)
    return busy, neighbour, group, call, during


def _release(group: str) -> None:
    """SIGUSR1 to every process of the session whose CPU group path ends with `group`: its held call returns."""
    for pid in [int(p) for p in os.listdir("/proc") if p.isdigit() and _cpu_group(p).endswith(group)]:
        os.kill(pid, signal.SIGUSR1)


async def _cores_once_free(pool, session, every: list[int]) -> list[str]:
    """`session`'s cores once every core is back; a call that waits 1 ms for a CPU on a loaded machine is pinned
    itself, so ask until one answers sooner (never, if the session were left off a core)."""
    for _ in range(100):
        seen = (await pool.call(session, "cores", {})).output.split()
        if len(seen) == len(every):
            break
    return seen


def _cpu_group(pid: str) -> str:
    for line in read_or_empty(f"/proc/{pid}/cgroup").splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(","):
            return path
    return ""


TTY = Environment(
    name="tty", tools=[FunctionDoc(name="tty", description="Try to open the controlling terminal.")],
    code=textwrap.dedent("""
        import os

        def tty():
            try:
                os.close(os.open("/dev/tty", os.O_RDWR))
            except OSError as err:
                return f"refused: {err.strerror}"
            return "opened"
        """))

FLOW = """
import asyncio, os, sys
from arenaforge.environments.runtime import create_pool
from arenaforge.environments.runtime.worker.cgroups import NICE_WEIGHT
from arenaforge.schemas.config import SandboxConfig
from tests.environments.test_scheduling import TTY

os.close(os.open("/dev/tty", os.O_RDWR))  # this process has a controlling terminal

async def main():
    async with await create_pool(SandboxConfig(backend="process", pool_size=1)) as pool:
        session = await pool.open(TTY)
        obs = await pool.call(session, "tty", {})
        print("SESSION", obs.outcome, obs.output, flush=True)

asyncio.run(main())
os.close(os.open("/dev/tty", os.O_RDWR))  # and still has it
print("FLOW still has its terminal", flush=True)
"""


def test_a_process_session_cannot_open_the_pools_terminal(tmp_path: Path) -> None:
    """The process backend keeps workers in the pool's session (its autogroup), where a terminal may be: the worker
    gives it up before any session is forked, so tool code cannot write to it or push input into it."""
    flow = tmp_path / "flow.py"
    flow.write_text(FLOW)
    # pty.spawn: the flow runs as a session leader with a pseudo-terminal as its controlling terminal
    done = subprocess.run([sys.executable, "-c", "import pty, sys; pty.spawn([sys.executable, sys.argv[1]])", str(flow)],
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])})
    out = done.stdout.replace("\r", "")
    assert "SESSION ok refused: No such device or address" in out, out + done.stderr
    assert "FLOW still has its terminal" in out, out + done.stderr
