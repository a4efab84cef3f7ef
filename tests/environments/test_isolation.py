"""Sessions isolated from each other and from the host, against code written to break it (issue 14).

Each attack runs on both backends. A session's /tmp, /dev/shm and /var/tmp are its own size-capped
tmpfs, gone with it; its SysV IPC is its own; it gets no sockets and cannot make namespaces, mount,
or trace; its uid is its own and not the next one in line. On the process backend it also cannot
see the checkout, the host's processes or /run, and model-written code is refused unless allowed.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from arenaforge.benchmarks.isolation import ATTACK_TOOLS, ATTACKS_CODE
from arenaforge.environments.runtime import UntrustedCodeRefused, create_pool
from arenaforge.schemas.base import Provenance
from arenaforge.schemas.models import Environment, FunctionDoc, ToolObservation
from tests.environments.conftest import PoolHandle, sandbox_config, start_pool
from tests.support.requirements import require_docker

PROBES = r'''
import ctypes, errno, json, os, signal, socket

def listdir(path: str):
    return sorted(os.listdir(path))

def write(path: str, text: str = "secret"):
    with open(path, "w") as fh:
        fh.write(text)
    os.chmod(path, 0o666)
    return path

def read(path: str):
    with open(path) as fh:
        return fh.read()

def mkdir(path: str):
    os.makedirs(path, exist_ok=True)
    os.chmod(path, 0o777)
    return path

def fill(path: str):
    written = 0
    try:
        with open(path, "wb") as fh:
            while True:
                fh.write(b"z" * (1 << 20))
                fh.flush()
                written += 1
    except OSError as err:
        return {"mb": written, "errno": errno.errorcode.get(err.errno)}

def remove(path: str):
    os.remove(path)
    return "removed"

def whoami():
    return {"uid": os.getuid(), "pid": os.getpid(), "cwd": os.getcwd(), "tmpdir": os.environ.get("TMPDIR")}

def shm(key: int, create: bool):
    libc = ctypes.CDLL(None, use_errno=True)
    shmid = libc.shmget(key, 4096, 0o1666 if create else 0)
    return {"id": shmid, "errno": errno.errorcode.get(ctypes.get_errno()) if shmid < 0 else None}

def attempts():
    libc = ctypes.CDLL(None, use_errno=True)
    def errno_of(result):
        return errno.errorcode.get(ctypes.get_errno()) if result != 0 else "allowed"
    out = {
        "unshare_user": errno_of(libc.unshare(0x10000000)),
        "unshare_mount": errno_of(libc.unshare(0x20000)),
        "mount": errno_of(libc.mount(b"none", b"/tmp", b"tmpfs", 0, None)),
        "ptrace": errno_of(libc.ptrace(0, 0, None, None)),
    }
    try:
        socket.socket(socket.AF_UNIX)
        out["socket"] = "allowed"
    except OSError as err:
        out["socket"] = errno.errorcode.get(err.errno)
    return out

def signal_pid(pid: int):
    os.kill(pid, signal.SIGKILL)
    return "killed"

def pids():
    return sorted(int(p) for p in os.listdir("/proc") if p.isdigit())

def touch_many(path: str, n: int):
    made = 0
    try:
        for i in range(n):
            open(f"{path}/f{i}", "w").close()
            made += 1
    except OSError as err:
        return {"made": made, "errno": errno.errorcode.get(err.errno)}
    return {"made": made, "errno": None}

def mqueue(name: str, message: str = ""):
    """Leave `message` in the POSIX queue `name` (made here), or read the queue a neighbour may have left."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mq_open.restype = ctypes.c_int
    libc.mq_open.argtypes = [ctypes.c_char_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
    qd = libc.mq_open(name.encode(), (0o100 | 2) if message else 2, 0o666, None)  # O_CREAT | O_RDWR, or O_RDWR
    if qd < 0:
        return {"errno": errno.errorcode.get(ctypes.get_errno())}
    if message:
        libc.mq_send(qd, message.encode(), len(message), 0)
        return {"sent": message}
    buf = ctypes.create_string_buffer(1 << 16)
    got = libc.mq_receive(qd, buf, len(buf), None)
    return {"read": buf.raw[:got].decode() if got >= 0 else None}

def burn(seconds: float):
    import time
    start = time.process_time()
    while time.process_time() - start < seconds:
        pass
    return os.getpid()

def cores_after(seconds: float):
    """Spin `seconds` of CPU beside a thread of its own, then ask for every core there is: the cores it may run on
    then."""
    import threading, time
    done = threading.Event()
    helper = threading.Thread(target=done.wait)
    helper.start()
    start = time.process_time()
    while time.process_time() - start < seconds:
        pass
    try:
        os.sched_setaffinity(0, range(os.cpu_count()))
    except OSError:
        pass
    cores = sorted(os.sched_getaffinity(0))
    done.set()
    helper.join()
    return cores

def leave_behind():
    """What a tool may leave running: children never waited for, a daemon in a session of its own, a sleeper."""
    import subprocess, time
    for _ in range(3):
        if os.fork() == 0:
            os._exit(0)
    subprocess.Popen(["sleep", "1000"], start_new_session=True)
    if os.fork() == 0:
        if os.fork() == 0:
            time.sleep(1000)
        os._exit(0)
    return "left"

def fork_later():
    """A child forked by a thread after the call returned: nothing runs at the reply, something runs after it."""
    import threading, time
    def later():
        time.sleep(0.05)
        if os.fork() == 0:
            time.sleep(1000)
    threading.Thread(target=later, daemon=True).start()
    return "armed"

def exit_later(code: int):
    """The session process ends itself between calls (a background thread of the tool's code)."""
    import threading, time
    def later():
        time.sleep(0.05)
        os._exit(code)
    threading.Thread(target=later, daemon=True).start()
    return os.getpid()

def pour_then_exit(n: int, code: int):
    """A thread writes `n` bytes of bare newlines into the channel between calls, then ends the process."""
    import threading
    channel = _channel()
    def later():
        try:
            for _ in range(n // (1 << 14)):
                channel.sendall(b"\n" * (1 << 14))
        except OSError:
            pass
        os._exit(code)
    threading.Thread(target=later, daemon=True).start()
    return "pouring"

def close_channel_then_exit(linger_s: float, code: int):
    """Closes its channel during the call, lingers, then ends the process: the worker sees the channel closed first."""
    import time
    for fd in sorted(int(x) for x in os.listdir("/proc/self/fd")):
        try:
            if "socket" in os.readlink(f"/proc/self/fd/{fd}"):
                os.close(fd)
        except OSError:
            pass
    time.sleep(linger_s)
    os._exit(code)
'''
PROBES += ATTACKS_CODE  # the attacks `bench isolation` runs: memfd, spinners, fork_bomb, newlines, files, memory
TOOLS = ("listdir", "write", "read", "mkdir", "fill", "remove", "whoami", "shm", "attempts", "signal_pid", "pids",
         "touch_many", "mqueue", "cores_after", "leave_behind", "fork_later", "exit_later", "pour_then_exit", "burn",
         "close_channel_then_exit", *ATTACK_TOOLS)


def probes_env(provenance: Provenance | None = None) -> Environment:
    return Environment(name="probes", tools=[FunctionDoc(name=n) for n in TOOLS], code=PROBES, provenance=provenance)


def needs_namespaces(h: PoolHandle) -> None:
    if not h.pool.info.get("namespaces"):
        pytest.skip("optional: no private namespaces here (process backend without root or user namespaces)")


async def _calls(pool, session, *calls: tuple[str, dict]) -> list[ToolObservation]:
    return [await pool.call(session, tool, args) for tool, args in calls]


@pytest.fixture(scope="module", params=["process", pytest.param("docker", marks=pytest.mark.docker)])
def small(request: pytest.FixtureRequest):
    """Small private /tmp per session, so filling one is quick; one worker, so every session shares it."""
    yield from start_pool(request.param, pool_size=1, scratch_mb=8, scratch_files=256)


def test_scratch_space_is_private_per_session(small: PoolHandle) -> None:
    needs_namespaces(small)
    pool = small.pool
    marker = f"drop-{uuid.uuid4().hex}"

    async def scenario() -> dict[str, object]:
        a = await pool.open(probes_env())
        me = json.loads((await pool.call(a, "whoami", {})).output)
        # squat: what an attacker would pre-create for the next session, world-writable
        await _calls(pool, a, ("mkdir", {"path": "/tmp/s-1"}), ("write", {"path": f"/tmp/{marker}"}),
                     ("write", {"path": f"/dev/shm/{marker}"}), ("write", {"path": f"/var/tmp/{marker}"}))
        b = await pool.open(probes_env())
        seen = await _calls(pool, b, ("listdir", {"path": "/tmp"}), ("listdir", {"path": "/dev/shm"}),
                            ("listdir", {"path": "/var/tmp"}), ("read", {"path": f"/tmp/{marker}"}))
        await pool.call(b, "write", {"path": "/tmp/note-of-b"})
        a_sees = await pool.call(a, "listdir", {"path": "/tmp"})
        await pool.close(a)
        c = await pool.open(probes_env())
        after = await pool.call(c, "listdir", {"path": "/tmp"})
        await pool.close(b)
        await pool.close(c)
        return {"me": me, "seen": seen, "a_sees": a_sees, "after": after}

    got = small.run(scenario())
    assert got["me"]["cwd"] == got["me"]["tmpdir"] == "/tmp"
    b_tmp, b_shm, b_var, b_read = got["seen"]
    assert (b_tmp.output, b_shm.output, b_var.output) == ("[]", "[]", "[]")  # nothing of A's, nothing squatted
    assert b_read.outcome == "error" and "FileNotFoundError" in (b_read.traceback or "")
    assert "note-of-b" not in got["a_sees"].output
    assert got["after"].output == "[]"  # a closed session's files are gone
    for place in ("/tmp", "/dev/shm", "/var/tmp"):  # and nothing reached the host's (process backend)
        assert not Path(place, marker).exists()


def test_filling_its_tmp_stops_at_its_own_cap_and_hurts_no_one(small: PoolHandle) -> None:
    needs_namespaces(small)
    pool = small.pool

    async def scenario() -> tuple[list[ToolObservation], ToolObservation]:
        a, b = await pool.open(probes_env()), await pool.open(probes_env())
        filled = await _calls(pool, a, ("fill", {"path": "/tmp/big"}), ("fill", {"path": "/dev/shm/big"}))
        other = await pool.call(b, "write", {"path": "/tmp/fine"})
        await pool.close(a)
        await pool.close(b)
        return filled, other

    filled, other = small.run(scenario())
    for obs in filled:
        got = json.loads(obs.output)
        assert got["errno"] == "ENOSPC" and got["mb"] <= pool.cfg.scratch_mb
    assert other.outcome == "ok"


def test_sysv_ipc_is_private(small: PoolHandle) -> None:
    needs_namespaces(small)
    pool = small.pool
    key = 0x5A17 + os.getpid() % 1000

    async def scenario() -> tuple[dict, dict]:
        a, b = await pool.open(probes_env()), await pool.open(probes_env())
        made = json.loads((await pool.call(a, "shm", {"key": key, "create": True})).output)
        found = json.loads((await pool.call(b, "shm", {"key": key, "create": False})).output)
        await pool.close(a)
        await pool.close(b)
        return made, found

    made, found = small.run(scenario())
    assert made["id"] >= 0
    assert found == {"id": -1, "errno": "ENOENT"}  # another session's segment does not exist here


def test_many_empty_files_stop_at_the_file_cap_and_hurt_no_one(small: PoolHandle) -> None:
    """400,000 empty files (no size at all) held ~400 MB of kernel memory until their session closed (issue 35)."""
    needs_namespaces(small)
    pool = small.pool

    async def scenario() -> tuple[list[ToolObservation], ToolObservation]:
        a, b = await pool.open(probes_env()), await pool.open(probes_env())
        made = await _calls(pool, a, ("touch_many", {"path": "/tmp", "n": 5000}),
                            ("touch_many", {"path": "/dev/shm", "n": 5000}))
        other = await pool.call(b, "touch_many", {"path": "/tmp", "n": 100})
        await pool.close(a)
        await pool.close(b)
        return made, other

    made, other = small.run(scenario())
    for obs in made:
        got = json.loads(obs.output)
        assert got["errno"] == "ENOSPC" and got["made"] < pool.cfg.scratch_files
    assert json.loads(other.output) == {"made": 100, "errno": None}  # the neighbour's cap is its own


def test_posix_message_queues_are_private_and_gone_with_their_session(small: PoolHandle) -> None:
    """A queue left by one session was read by a later one through the worker's /dev/mqueue (issue 35)."""
    needs_namespaces(small)
    pool = small.pool
    name = f"/af-{uuid.uuid4().hex[:12]}"

    async def scenario() -> dict[str, object]:
        a, b = await pool.open(probes_env()), await pool.open(probes_env())
        sent = json.loads((await pool.call(a, "mqueue", {"name": name, "message": "MQ-SECRET"})).output)
        mine = json.loads((await pool.call(a, "mqueue", {"name": name})).output)
        await pool.call(a, "mqueue", {"name": name, "message": "MQ-SECRET"})  # left behind for the next session
        await pool.call(a, "write", {"path": f"/dev/mqueue{name}-file"})  # a queue made through the file system
        a_lists = (await pool.call(a, "listdir", {"path": "/dev/mqueue"})).output
        b_reads = json.loads((await pool.call(b, "mqueue", {"name": name})).output)
        b_lists = (await pool.call(b, "listdir", {"path": "/dev/mqueue"})).output
        await pool.close(a)
        c = await pool.open(probes_env())
        c_reads = json.loads((await pool.call(c, "mqueue", {"name": name})).output)
        await pool.close(b)
        await pool.close(c)
        return {"sent": sent, "mine": mine, "a_lists": a_lists, "b_reads": b_reads, "b_lists": b_lists,
                "c_reads": c_reads}

    got = small.run(scenario())
    assert got["sent"] == {"sent": "MQ-SECRET"} and got["mine"] == {"read": "MQ-SECRET"}  # queues work in a session
    assert got["b_reads"] == got["c_reads"] == {"errno": "ENOENT"}  # a neighbour's, or a closed session's: none
    if os.path.isdir("/dev/mqueue") or small.pool.backend == "docker":  # a /dev/mqueue to look in
        assert f"{name[1:]}-file" in got["a_lists"] and name[1:] not in got["b_lists"]


def needs_cgroups(h: PoolHandle, controller: str) -> None:
    if controller not in h.pool.info.get("cgroups", []):
        why = h.pool.info.get("cgroups_missing") or f"no {controller} group per session on this backend"
        pytest.skip(f"optional: no per-session {controller} cgroup here ({why})")


def test_memory_held_outside_the_address_space_ends_that_session_only(small: PoolHandle) -> None:
    """One session held 3.6 GB in a memfd under a 512 MB address-space limit, and the container's OOM killer took its
    neighbours (issue 35). Its own cgroup now counts those pages: the kernel kills it, the tool's `limit`."""
    needs_cgroups(small, "memory")
    pool = small.pool
    limit = pool.cfg.memory_mb

    async def scenario() -> tuple[ToolObservation, list[ToolObservation], str]:
        a, b = await pool.open(probes_env()), await pool.open(probes_env())
        before = await _calls(pool, b, ("write", {"path": "/tmp/mine", "text": "B-STATE"}), ("whoami", {}))
        held = await pool.call(a, "memfd", {"mb": 2 * limit + 64})
        after = await _calls(pool, b, ("read", {"path": "/tmp/mine"}), ("whoami", {}))
        again = (await pool.call(a, "whoami", {})).outcome  # the attacker's session restarted and serves again
        await pool.close(a)
        await pool.close(b)
        return held, before + after, again

    held, neighbour, again = small.run(scenario())
    assert held.outcome == "limit" and "killed for memory" in (held.error or ""), held
    assert [o.outcome for o in neighbour] == ["ok"] * 4
    assert neighbour[2].output == "B-STATE"  # the neighbour's state survived
    assert json.loads(neighbour[1].output)["pid"] == json.loads(neighbour[3].output)["pid"]  # in the same process
    assert again == "ok"


@pytest.fixture(scope="module", params=["process", pytest.param("docker", marks=pytest.mark.docker)])
def grouped(request: pytest.FixtureRequest):
    """One worker whose sessions each have a CPU group: Docker's default, the process backend's opt-in."""
    yield from start_pool(request.param, pool_size=1, process_cpu_groups=request.param == "process")


def test_busy_processes_of_a_session_leave_its_neighbour_a_share(grouped: PoolHandle) -> None:
    """A session's busy processes, as many as its pids allow, made its neighbour's calls fail as `Overloaded`
    (issue 35): each process was weighed as one, so the neighbour got 1/30 of the worker's CPU. Each session is now one
    group, weighed as one: the neighbour's CPU-bound calls all finish while the attacker's call still runs."""
    needs_cgroups(grouped, "cpu")
    pool = grouped.pool

    async def scenario() -> tuple[ToolObservation, list[ToolObservation]]:
        a, b = await pool.open(probes_env()), await pool.open(probes_env())
        busy = asyncio.ensure_future(pool.call(a, "busy_call", {"n": pool.cfg.pids - 4}, timeout_s=10.0))
        calls = [await pool.call(b, "burn", {"seconds": 0.3}, timeout_s=1.0) for _ in range(5)]
        done_first = not busy.done()
        spin = await busy
        await pool.close(a)
        await pool.close(b)
        return spin, calls, done_first

    spin, calls, neighbour_first = grouped.run(scenario())
    assert neighbour_first  # the neighbour's calls ran beside the busy processes, not after them
    assert spin.outcome == "timeout", spin  # the attacker's own limit: the tool's
    assert [c.outcome for c in calls] == ["ok"] * 5, [c.error for c in calls if c.outcome != "ok"]


def test_a_call_that_leaves_processes_running_is_the_tools_limit(small: PoolHandle) -> None:
    """Busy processes a call left behind took its neighbours' CPU until the session closed (issue 35). A call's
    processes now end with it: one that returns while they run is `limit`, they are killed with its session, which
    restarts; so are processes a thread starts after the call returned (the session's next call says so)."""
    needs_cgroups(small, "pids")
    pool = small.pool

    async def scenario() -> tuple[list[ToolObservation], int, list[ToolObservation]]:
        session = await pool.open(probes_env())
        left = await _calls(pool, session, ("write", {"path": "/tmp/state", "text": "S"}),
                            ("spinners", {"n": 3}), ("listdir", {"path": "/tmp"}))
        now = json.loads((await pool.call(session, "whoami", {})).output)["uid"]  # restarted: a uid of its own
        later = [await pool.call(session, "fork_later", {})]
        await _gone(now)  # the sweep kills the session once its thread's child runs
        later.append(await pool.call(session, "whoami", {}))
        later.append(await pool.call(session, "whoami", {}))
        await pool.close(session)
        return left, now, later

    left, uid, later = small.run(scenario())
    assert [o.outcome for o in left] == ["ok", "limit", "ok"], left
    assert left[1].error.startswith("the call returned while 3 processes it started kept running"), left[1]
    assert "state" not in left[2].output  # the session restarted from its initial state
    assert [o.outcome for o in later] == ["ok", "limit", "ok"], later
    assert "1 process the session started kept running between calls" in later[1].error, later[1]
    assert _wait_for_none(uid) == []


def test_a_thread_left_spinning_between_calls_is_the_tools_limit(small: PoolHandle) -> None:
    """A thread that kept a CPU busy after its call returned ran until the session's 60 s CPU limit, beside its
    neighbours and charged to no call (issue 35). The worker's sweep of idle sessions stops it within a few tenths of
    a second, and the session's next call is the tool's `limit`, saying why."""
    pool = small.pool

    async def scenario() -> tuple[int, list[ToolObservation]]:
        session = await pool.open(probes_env())
        uid = json.loads((await pool.call(session, "whoami", {})).output)["uid"]
        got = [await pool.call(session, "busy_thread", {})]
        if uid not in (0, os.getuid()):
            await _gone(uid)  # stopped between calls, not during the next one
        got += [await pool.call(session, "whoami", {}), await pool.call(session, "whoami", {})]
        await pool.close(session)
        return uid, got

    uid, got = small.run(scenario())
    if uid in (0, os.getuid()):
        pytest.skip("optional: sessions share this uid here, so the host cannot tell when this one's process is gone")
    assert [o.outcome for o in got] == ["ok", "limit", "ok"], got
    assert "s of CPU between calls" in got[1].error, got[1]


async def _gone(uid: int) -> None:
    """Once the host sees no process of `uid` (polling that condition; 120 s at most: a nice-19 spinner on a loaded
    machine takes its time to use the CPU it is stopped for)."""
    deadline = time.monotonic() + 120
    while _processes_of(uid) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)


def test_a_session_that_ends_itself_between_calls_is_the_tools_limit(small: PoolHandle) -> None:
    """A session process that exited between calls, by its own code, made its next call a `SessionLost`: the
    sandbox's failure, never the tool's (issue 35). It is the tool's: that call is `limit`, saying why."""
    needs_cgroups(small, "pids")  # its own uid, so the host can see when its process is gone
    pool = small.pool

    async def scenario() -> tuple[ToolObservation, ToolObservation, ToolObservation]:
        session = await pool.open(probes_env())
        uid = json.loads((await pool.call(session, "whoami", {})).output)["uid"]
        armed = await pool.call(session, "exit_later", {"code": 3})
        await _gone(uid)  # ended between calls, not during the next one
        after, again = await pool.call(session, "whoami", {}), await pool.call(session, "whoami", {})
        await pool.close(session)
        return armed, after, again

    armed, after, again = small.run(scenario())
    assert armed.outcome == "ok"
    assert after.outcome == "limit" and after.error.startswith("the session process exited with code 3 between calls")
    assert again.outcome == "ok"


def test_a_session_writing_into_its_channel_between_calls_is_stopped_at_64_kb(small: PoolHandle) -> None:
    """Between calls nothing a session writes into its channel is honest. A thread left pouring was read up to the
    bound for a call in flight (2.3 MB), and its neighbours' calls waited 2-8 ms beside it (issue 35); it is stopped
    at 64 KB now. 1.5 MB of newlines then an exit: stopped before the exit (at the old bound it ended itself)."""
    needs_cgroups(small, "pids")  # its own uid, so the host can see when its process is gone
    pool = small.pool

    async def scenario() -> tuple[ToolObservation, ToolObservation, ToolObservation]:
        session = await pool.open(probes_env())
        uid = json.loads((await pool.call(session, "whoami", {})).output)["uid"]
        armed = await pool.call(session, "pour_then_exit", {"n": 3 << 19, "code": 3})
        await _gone(uid)  # stopped, or ended, between calls
        after, again = await pool.call(session, "whoami", {}), await pool.call(session, "whoami", {})
        await pool.close(session)
        return armed, after, again

    armed, after, again = small.run(scenario())
    assert (armed.outcome, armed.output) == ("ok", "pouring"), armed
    assert after.outcome == "limit", after
    assert after.error.startswith("the session process flooded its reply channel between calls"), after.error
    assert again.outcome == "ok", again


def test_a_closed_channel_is_not_watched_while_its_process_dies(small: PoolHandle) -> None:
    """A session's channel closes before its process has exited: killed for memory, it frees a 512 MB memfd first
    (50 ms), or tool code closed it. A closed channel is always readable, and the worker spun on it until the exit
    status came, while its neighbours' calls waited 2-5 ms (`bench isolation` memfd, process backend: 2.7-3.4x quiet,
    issue 35). Here the process lingers 0.8 s: the worker's own CPU over that call stays near none."""
    pool = small.pool

    async def scenario() -> tuple[ToolObservation, float, ToolObservation]:
        session = await pool.open(probes_env())
        before = (await pool.ping())[0]["cpu_s"]
        closed = await pool.call(session, "close_channel_then_exit", {"linger_s": 0.8, "code": 5})
        spent = (await pool.ping())[0]["cpu_s"] - before
        again = await pool.call(session, "whoami", {})
        await pool.close(session)
        return closed, spent, again

    closed, spent, again = small.run(scenario())
    assert closed.outcome == "limit" and "exited with code 5" in closed.error, closed
    assert spent < 0.2, f"the worker used {spent:.2f} s of CPU while the process lingered 0.8 s"
    assert again.outcome == "ok", again


CAPPED = Environment(name="capped", tools=[FunctionDoc(name="share", description="CPU its busy processes got.")],
                     code="""
import os, resource, time

def share(cpu_s: float):
    started = time.monotonic()
    children = []
    for _ in range(2):  # two busy processes: all of a 1-CPU container's quota, uncapped
        pid = os.fork()
        if pid == 0:
            while sum(os.times()[:2]) < cpu_s:
                pass
            os._exit(0)
        children.append(pid)
    for pid in children:
        os.waitpid(pid, 0)
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    return str((used.ru_utime + used.ru_stime) / (time.monotonic() - started))
""")


def test_a_session_gets_at_most_its_share_of_its_containers_cpu(small: PoolHandle) -> None:
    """A session whose busy processes used the whole container's CPU quota got the container throttled, its
    neighbours and the worker included, for the rest of each period (issue 35: a neighbour's p99 at 50-100x quiet).
    Its group is capped at `session_cpu_share` of the quota (a quarter of 2 CPUs: half a core); extra load only lowers
    the share it measures."""
    needs_cgroups(small, "cpu")
    if small.pool.backend == "process":
        pytest.skip("optional: a host process has no container quota to exhaust, so its sessions get no cap")
    pool = small.pool
    container_cpus = min(pool.cfg.cpus, os.cpu_count() or 1)  # the engine gives no container more than it has
    assert (pool.cfg.cpus, pool.cfg.session_cpu_share) == (2.0, 0.25)
    assert pool.info["session_cpu_quota_us"] == int(0.25 * container_cpus * 100_000)

    async def scenario() -> ToolObservation:
        session = await pool.open(CAPPED)
        try:
            return await pool.call(session, "share", {"cpu_s": 0.4}, timeout_s=60.0)
        finally:
            await pool.close(session)

    got = small.run(scenario())
    assert got.outcome == "ok", got
    # capped at a quarter of the container (uncapped: one core, the one its busy call is pinned to)
    assert float(got.output) < 0.375 * container_cpus


@pytest.mark.docker
def test_a_container_asked_for_more_cpus_than_the_engine_has_gets_all_it_has() -> None:
    """The engine refuses a container more CPUs than it has (the default 2 on a one-core host): the pool asks for at
    most that many, and each session's cap is its share of what the container got."""
    for handle in start_pool("docker", pool_size=1, cpus=1000.0, session_cpu_share=0.5):
        needs_cgroups(handle, "cpu")
        assert handle.pool.info["session_cpu_quota_us"] == int(0.5 * os.cpu_count() * 100_000)


@pytest.mark.docker
def test_sessions_held_to_their_share_can_still_run_their_container_out_of_quota() -> None:
    """Each session is capped at half its container's CPUs, but three busy ones ask for one and a half: the container
    runs out of quota, and the worker and every session stop until the next period. `group_throttled` counts those
    stops (what `bench isolation` reports per attack, the neighbour's slowest calls among them). A container of a
    fifth of a CPU, so the sessions get there even on a loaded host."""
    for handle in start_pool("docker", pool_size=1, cpus=0.2, session_cpu_share=0.5):
        needs_cgroups(handle, "cpu")
        pool = handle.pool

        async def scenario() -> tuple[list[float], list[ToolObservation], list[float]]:
            before = (await pool.ping())[0]["group_throttled"]
            sessions = [await pool.open(CAPPED) for _ in range(3)]
            got = await asyncio.gather(*(pool.call(s, "share", {"cpu_s": 0.05}, timeout_s=120.0) for s in sessions))
            return before, list(got), (await pool.ping())[0]["group_throttled"]

        before, got, after = handle.run(scenario())
        assert [g.outcome for g in got] == ["ok"] * 3, got
        assert after[0] > before[0] and after[1] > before[1], (before, after)


def test_the_helper_that_ends_a_session_works_in_that_sessions_cpu_groups() -> None:
    """A helper forked to end a fork bomb's 60 processes ran at the worker's weight, on the worker's core, and held it
    2.6 ms while the neighbours' replies waited (traced, issue 35). It now joins the session's CPU and cpuset groups
    before it kills, so its work is the session's: weighed, capped and placed as the session. Real cgroup v1 groups on
    this host, named as a worker names a session's; a process of the session's uid to end."""
    from arenaforge.environments.runtime.worker import cgroups, policy

    roots = {"cpu": "/sys/fs/cgroup/cpu", "cpuset": "/sys/fs/cgroup/cpuset"}
    if os.geteuid() != 0 or not all(os.access(os.path.join(r, "cgroup.procs"), os.W_OK) for r in roots.values()):
        pytest.skip("optional: needs root and writable cgroup v1 cpu and cpuset hierarchies")
    name, uid = f"arenaforge-test-helper-{os.getpid()}", 61000 + os.getpid() % 1000
    bases = {c: os.path.join(r, name) for c, r in roots.items()}
    cpu, cpuset = f"{bases['cpu']}-u{uid}", os.path.join(bases["cpuset"], f"u{uid}")
    os.mkdir(cpu)
    os.makedirs(cpuset)
    try:
        for group in (bases["cpuset"], cpuset):
            for knob in ("cpuset.cpus", "cpuset.mems"):
                Path(group, knob).write_text(Path(os.path.dirname(group), knob).read_text())
        # what the helper does first, in a child held until its groups are read
        joined, release = os.pipe(), os.pipe()
        child = os.fork()
        if child == 0:
            cgroups.enter_cpu_groups(bases, uid)
            os.write(joined[1], b"j")
            os.read(release[0], 1)
            os._exit(0)
        os.read(joined[0], 1)
        seen = {controller: path for _, controllers, path in
                (line.split(":", 2) for line in Path(f"/proc/{child}/cgroup").read_text().splitlines())
                for controller in controllers.split(",")}
        os.write(release[1], b"r")
        os.waitpid(child, 0)
        for fd in (*joined, *release):
            os.close(fd)
        assert seen["cpu"] == cpu.removeprefix(roots["cpu"]), seen
        assert seen["cpuset"] == cpuset.removeprefix(roots["cpuset"]), seen
        # and the helper itself, given the worker's groups, still ends every process of the uid
        victim = subprocess.Popen(["sleep", "600"], user=uid, group=uid)
        helper = policy.kill_uid(uid, None, bases)
        assert os.waitpid(helper, 0)[1] == 0
        assert victim.wait(timeout=60) == -9
    finally:
        for group in (cpu, cpuset, bases["cpuset"]):
            os.rmdir(group)


def test_a_call_that_runs_long_runs_on_one_core_until_its_next_call(small: PoolHandle) -> None:
    """A busy session's processes ran on every core at once in each quota period's burst, and its neighbours' calls,
    the worker and the flow relaying them found no core to wake on: `busy_call` p99 5-14x quiet (issue 35). Once a
    call has run 1 ms with several tasks (here a thread beside it) its session runs on one core (a cpuset, which tool
    code cannot widen) until its next call is sent; two busy sessions of a worker get different cores."""
    needs_cgroups(small, "cpuset")
    every = sorted(os.sched_getaffinity(0))
    if len(every) < 2:
        pytest.skip("optional: one core here, so there is no other core to keep")
    pool = small.pool
    assert pool.cfg.busy_session_cores == 1

    async def scenario() -> tuple[list, list, list, list]:
        a, b = await pool.open(probes_env()), await pool.open(probes_env())
        try:
            # an open (a spare's ahead of it too) is no busy call: loading holds no core, so none is claimed when
            # the calls start (a spare pinned while it loaded had made both calls tie for the same core)
            while (info := (await pool.ping())[0])["spares_ready"] < info["spares"]:
                await asyncio.sleep(0.01)
            assert info["pinned"] == {}, info["pinned"]
            both = await asyncio.gather(pool.call(a, "cores_after", {"seconds": 0.3}, timeout_s=30.0),
                                        pool.call(b, "cores_after", {"seconds": 0.3}, timeout_s=30.0))
            # the next call is sent pinned, and its session gets every core back; a call that waits 1 ms for a
            # CPU on a loaded machine is pinned again, so ask until one answers sooner (never, if left pinned)
            for _ in range(100):
                quick = await pool.call(a, "cores_after", {"seconds": 0.0})
                if quick.outcome != "ok" or len(json.loads(quick.output)) > 1:
                    break
        finally:
            await pool.close(a)
            await pool.close(b)
        assert all(o.outcome == "ok" for o in [*both, quick]), [*both, quick]
        return json.loads(both[0].output), json.loads(both[1].output), json.loads(quick.output)

    first, second, quick = small.run(scenario())
    assert len(first) == 1 and len(second) == 1, (first, second)  # one core each, even asking for all
    assert first != second  # the quietest core: a second busy session does not share the first one's
    assert quick == every  # every core again


def test_a_closed_session_leaves_no_cgroup(small: PoolHandle) -> None:
    """Its groups go with its processes; the worker's own go with the worker (checked from the host where it can
    see them: the process backend)."""
    needs_cgroups(small, "memory")
    pool = small.pool

    async def scenario() -> int:
        session = await pool.open(probes_env())
        uid = json.loads((await pool.call(session, "whoami", {})).output)["uid"]
        await pool.call(session, "leave_behind", {})
        await pool.close(session)
        return uid

    uid = small.run(scenario())
    if small.pool.backend != "process":
        pytest.skip("optional: a container's groups are seen from inside it only")
    deadline = time.monotonic() + 30
    while (left := _cgroups_named(f"u{uid}")) and time.monotonic() < deadline:
        time.sleep(0.1)  # polling a condition with a deadline: the uid's teardown runs after close returns
    assert left == []


def test_a_stopped_pool_leaves_no_cgroup_of_its_workers() -> None:
    """A worker is killed when its pool stops, so it cannot remove its groups: the pool does, once it has exited."""
    names: list[str] = []
    for handle in start_pool("process", pool_size=2):
        needs_cgroups(handle, "memory")

        async def scenario() -> None:
            session = await handle.pool.open(probes_env())
            await handle.pool.call(session, "whoami", {})
            names.extend(w["cgroup_name"] for w in await handle.pool.ping() if w.get("cgroups"))

        handle.run(scenario())
        assert any(_cgroups_named(n) for n in names), names
    assert names and [n for n in names if _cgroups_named(n)] == []


POOL_GROUP_PROBE = """
import asyncio, json
from arenaforge.environments.runtime import create_pool
from tests.environments.conftest import sandbox_config

def cpu_group():
    return next(line.split(":", 2)[2].strip() for line in open("/proc/self/cgroup")
                if "cpu" in line.split(":")[1].split(","))

async def main():
    before = cpu_group()
    pool = await create_pool(sandbox_config("process", pool_size=2, process_cpu_groups=True))
    during, info = cpu_group(), dict(pool.info)
    await pool.shutdown()
    print(json.dumps({"before": before, "during": during, "after": cpu_group(), "cgroups": info.get("cgroups", [])}))

asyncio.run(main())
"""


def test_a_process_pool_weighs_its_workers_in_a_cpu_group_of_its_own_and_leaves_none() -> None:
    """On the host (`process_cpu_groups`), the pool's process moves into a CPU group of its own before it starts
    workers, so its sessions' groups weigh against its own process, not as equals of every autogroup on the host; it
    goes back, and the group goes, when the pool stops (a process of its own here, so no other pool keeps it in use)."""
    root = Path(__file__).parents[2]
    done = subprocess.run([sys.executable, "-c", POOL_GROUP_PROBE], capture_output=True, text=True, check=False,
                          cwd=root, env={**os.environ, "PYTHONPATH": str(root)})
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    if "cpu" not in got["cgroups"]:
        pytest.skip("optional: no CPU group per session here (not root, or no writable cpu hierarchy)")
    name = os.path.basename(got["during"])
    assert name.startswith("arenaforge-pool-")
    assert os.path.dirname(got["during"]) == (got["before"].rstrip("/") or "/")  # made under its own group
    assert got["after"] == got["before"]
    assert _cgroups_named(name) == []  # with its workers' groups inside it


DOCKER_FLOW_GROUP_PROBE = """
import asyncio, json, os
from arenaforge.environments.runtime import create_pool
from arenaforge.environments.runtime.worker import cgroups
from tests.environments.conftest import sandbox_config
from tests.environments.test_isolation import probes_env

def cpu_group(pid="self"):
    return next(line.split(":", 2)[2].strip() for line in open(f"/proc/{pid}/cgroup")
                if "cpu" in line.split(":")[1].split(","))

async def main():
    before = cpu_group()
    pool = await create_pool(sandbox_config("docker", pool_size=2, nice=19))
    during = cpu_group()
    session = await pool.open(probes_env())
    result = await pool.call(session, "whoami", {})
    group = "/sys/fs/cgroup/cpu" + during
    containers = {name: open(os.path.join(group, name, "cpu.shares")).read().strip()
                  for name in os.listdir(group) if os.path.isdir(os.path.join(group, name))}
    await pool.shutdown()
    print(json.dumps({"before": before, "during": during, "after": cpu_group(), "outcome": result.outcome,
                      "containers": containers, "weight": cgroups.NICE_WEIGHT[19 + 20]}))

asyncio.run(main())
"""


@pytest.mark.docker
def test_a_docker_pool_puts_its_containers_in_its_own_cpu_group_at_its_nice_weight_and_leaves_none() -> None:
    """The flow's process first on Docker too: a pool moves into a CPU group of its own and makes its containers
    there, each weighing as one process at `sandbox.nice` beside it, not as the flow's equal under the engine's
    group. When it stops it goes back, and its group goes, in every hierarchy the engine made it in."""
    require_docker()
    root = Path(__file__).parents[2]
    done = subprocess.run([sys.executable, "-c", DOCKER_FLOW_GROUP_PROBE], capture_output=True, text=True,
                          check=False, cwd=root, env={**os.environ, "PYTHONPATH": str(root)})
    assert done.returncode == 0, done.stderr[-2000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["outcome"] == "ok"
    name = os.path.basename(got["during"])
    if not name.startswith("arenaforge-pool-"):
        pytest.skip("optional: the pool cannot make a CPU group here (not root, or the engine is not local with the "
                    "cgroupfs driver on cgroup v1)")
    assert os.path.dirname(got["during"]) == (got["before"].rstrip("/") or "/")
    assert len(got["containers"]) == 2  # both workers' containers, and nothing else
    assert set(got["containers"].values()) == {str(got["weight"])}
    assert got["after"] == got["before"]
    left = [os.path.join(parent, d) for parent, dirs, _ in os.walk("/sys/fs/cgroup") for d in dirs if d == name]
    assert left == []


def _cgroups_named(name: str) -> list[str]:
    """Groups named `name`, and sessions' CPU groups named after it (`<worker group>-u<uid>`, beside their worker)."""
    found = []
    for root in ("/sys/fs/cgroup/memory", "/sys/fs/cgroup/pids", "/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpuset"):
        for parent, dirs, _ in os.walk(root):
            found += [os.path.join(parent, d) for d in dirs
                      if d == name or d.endswith(f"-{name}") or d.startswith(f"{name}-u")]
    return found


def _processes_of(uid: int) -> list[str]:
    """Every process on this kernel with the real uid `uid`, zombies included, as `pid state`: what the host sees."""
    found = []
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/status") as fh:
                fields = dict(line.split(":", 1) for line in fh if ":" in line)
        except (OSError, ValueError):
            continue  # not a process, or gone while read
        if int(fields["Uid"].split()[0]) == uid:
            found.append(f"{entry} {fields['State'].strip()}")
    return found


def test_nothing_a_session_started_outlives_it(sandbox: PoolHandle) -> None:
    """Children never waited for, daemons and sleepers: after close, the host sees no process of the session's uid,
    not even a zombie (issue 35)."""
    pool = sandbox.pool

    async def scenario() -> tuple[int, ToolObservation]:
        session = await pool.open(probes_env())
        uid = json.loads((await pool.call(session, "whoami", {})).output)["uid"]
        left = await pool.call(session, "leave_behind", {})
        await pool.close(session)
        return uid, left

    uid, left = sandbox.run(scenario())
    if uid in (0, os.getuid()):
        pytest.skip("optional: sessions share this uid here (no uid switching), so its processes are not theirs alone")
    assert left.outcome == "limit" if "pids" in sandbox.pool.info.get("cgroups", []) else left.output == "left", left
    assert _wait_for_none(uid) == []


def test_a_session_is_ended_by_its_worker_without_forking_a_helper(sandbox: PoolHandle) -> None:
    """Ending a session forked a kill helper from the worker: 0.8 ms of the worker's core, and the helper ran there
    1.1 ms more before it joined the session's groups, while every other session's reply waited; once per close, so
    open, call and close ran 1.4-1.6x slower than now. Where the session's pids group lists its processes, the worker
    signals them itself. A fork bomb's processes and what a call leaves behind still all end (issue 35)."""
    pool = sandbox.pool
    if "pids" not in pool.info.get("cgroups", []):
        pytest.skip("optional: no pids group per session here, so a helper ends each session by its uid")

    async def scenario() -> tuple[int, int, list[ToolObservation], int]:
        session = await pool.open(probes_env())
        first = json.loads((await pool.call(session, "whoami", {})).output)["uid"]
        # counted from here: the open may drop another environment's spares, one perhaps still being forked (no pid)
        before = (await pool.ping())[0]["kill_helpers"]
        bomb = await pool.call(session, "fork_bomb", {}, timeout_s=30.0)
        second = json.loads((await pool.call(session, "whoami", {})).output)["uid"]  # a fresh process, a fresh uid
        left = await pool.call(session, "leave_behind", {})
        await pool.close(session)
        return first, second, [bomb, left], (await pool.ping())[0]["kill_helpers"] - before

    first, second, (bomb, left), forked = sandbox.run(scenario())
    if first in (0, os.getuid()):
        pytest.skip("optional: sessions share this uid here (no uid switching), so its processes are not theirs alone")
    assert bomb.outcome == "limit" and left.outcome == "limit", (bomb, left)
    assert first != second
    assert _wait_for_none(first) == [] and _wait_for_none(second) == []
    assert forked == 0


def _wait_for_none(uid: int) -> list[str]:
    """The session's processes, once none are left or 30 s have passed (its teardown runs after close returns)."""
    deadline = time.monotonic() + 30
    while (found := _processes_of(uid)) and time.monotonic() < deadline:
        time.sleep(0.1)  # polling a condition with a deadline
    return found


def test_no_sockets_namespaces_mounts_or_tracing(sandbox: PoolHandle) -> None:
    if not sandbox.pool.info.get("seccomp"):
        pytest.skip("optional: no seccomp filter on this architecture")

    async def scenario() -> ToolObservation:
        session = await sandbox.pool.open(probes_env())
        try:
            return await sandbox.pool.call(session, "attempts", {})
        finally:
            await sandbox.pool.close(session)

    got = json.loads(sandbox.run(scenario()).output)
    assert got == {"unshare_user": "EPERM", "unshare_mount": "EPERM", "mount": "EPERM", "ptrace": "EPERM", "socket": "EPERM"}


def test_sessions_have_their_own_unpredictable_uids_and_cannot_signal_each_other(sandbox: PoolHandle) -> None:
    if not sandbox.pool.info.get("setuid"):
        pytest.skip("optional: the process backend run without root shares one uid (a documented gap)")
    pool = sandbox.pool

    async def scenario() -> tuple[list[int], ToolObservation, ToolObservation]:
        sessions = [await pool.open(probes_env()) for _ in range(6)]
        who = [json.loads((await pool.call(s, "whoami", {})).output) for s in sessions]
        kill = await pool.call(sessions[0], "signal_pid", {"pid": who[1]["pid"]})
        alive = await pool.call(sessions[1], "whoami", {})
        await asyncio.gather(*(pool.close(s) for s in sessions))
        return [w["uid"] for w in who], kill, alive

    uids, kill, alive = sandbox.run(scenario())
    assert len(set(uids)) == len(uids) and 0 not in uids
    assert sorted(uids) != list(range(min(uids), min(uids) + len(uids)))  # not handed out in sequence
    assert kill.outcome == "error" and "PermissionError" in (kill.traceback or "")
    assert alive.outcome == "ok"


def test_process_backend_hides_the_checkout_the_host_processes_and_run() -> None:
    handle = start_pool("process", pool_size=1)
    h = next(handle)
    try:
        if not h.pool.info.get("namespaces") or h.pool.info.get("pid") != 1:
            pytest.skip("optional: no private mount and PID namespaces here (process backend without root)")
        checkout = str(Path(__file__).resolve().parents[2])

        async def scenario() -> list[ToolObservation]:
            session = await h.pool.open(probes_env())
            try:
                return await _calls(h.pool, session, ("listdir", {"path": checkout}), ("read", {"path": "/proc/1/cmdline"}),
                                    ("listdir", {"path": "/run"}), ("pids", {}))
            finally:
                await h.pool.close(session)

        checkout_seen, init, run, pids = h.run(scenario())
        # the source tree and a warehouse inside it are not there: hidden under an empty directory, or absent
        # altogether when the checkout lies under /tmp (the session's /tmp is its own)
        assert checkout_seen.output == "[]" or (checkout_seen.outcome == "error"
                                                 and "FileNotFoundError" in (checkout_seen.traceback or "")), checkout_seen
        assert "worker.server" in init.output  # PID 1 is the worker: the host's processes are out of sight
        assert run.output == "[]"  # no host sockets under /run
        assert len(json.loads(pids.output)) < 50  # only the worker's own processes
    finally:
        handle.close()


def test_model_written_code_needs_an_opt_in_on_the_process_backend() -> None:
    written_by_a_model = probes_env(Provenance(backend="openai", model="some-model"))

    async def scenario(**cfg: object) -> str:
        async with await create_pool(sandbox_config("process", pool_size=1, **cfg)) as pool:
            session = await pool.open(written_by_a_model)
            out = (await pool.call(session, "whoami", {})).outcome
            await pool.close(session)
            return out

    with pytest.raises(UntrustedCodeRefused, match="process_allows_model_code"):
        asyncio.run(scenario())
    assert asyncio.run(scenario(process_allows_model_code=True)) == "ok"
    assert asyncio.run(_open_plain()) == "ok"  # code nobody marked as model-written runs as before


async def _open_plain() -> str:
    async with await create_pool(sandbox_config("process", pool_size=1)) as pool:
        session = await pool.open(probes_env(Provenance(backend="offline")))
        out = (await pool.call(session, "whoami", {})).outcome
        await pool.close(session)
        return out


@pytest.mark.docker
def test_docker_runs_model_written_code_without_an_opt_in() -> None:
    handle = start_pool("docker", pool_size=1)
    h = next(handle)
    try:
        async def scenario() -> str:
            session = await h.pool.open(probes_env(Provenance(backend="openai", model="some-model")))
            out = (await h.pool.call(session, "whoami", {})).outcome
            await h.pool.close(session)
            return out

        assert h.run(scenario()) == "ok"
    finally:
        handle.close()
