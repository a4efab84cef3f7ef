"""The process backend: workers as local subprocesses (rlimits, per-session uids when root, a private network
namespace where permitted). Weaker isolation than a container (docs/SANDBOX.md); its `Capabilities` say so."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path

from arenaforge.environments.runtime.deps import install, python_version
from arenaforge.environments.runtime.image import WORKER_DIR, worker_argv
from arenaforge.environments.runtime.transports import STREAM_LIMIT, Capabilities, Transport
from arenaforge.environments.runtime.worker import cgroups
from arenaforge.schemas.config import SandboxConfig

log = logging.getLogger("arenaforge.sandbox")

STDERR_LINES = 5  # the worker's last stderr lines, kept to say why it died
EXIT_WAIT_S = 5.0  # how long a worker that closed its output gets to exit before we say so without its status


class ProcessTransport:
    def __init__(self, proc: asyncio.subprocess.Process, name: str) -> None:
        self.proc = proc
        self.name = name
        self.shares_host_cores = True
        self.stderr: collections.deque[bytes] = collections.deque(maxlen=STDERR_LINES)
        self.stderr_done = asyncio.get_running_loop().create_task(self._drain_stderr())
        self.cgroups_removed = False

    async def _drain_stderr(self) -> None:
        """Keep the last lines (a worker blocked on a full stderr pipe would stall)."""
        if self.proc.stderr is None:
            return
        while line := await _read_line(self.proc.stderr):
            if line.strip():
                self.stderr.append(line.strip()[:500])

    def write(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)

    def buffered(self) -> int:
        assert self.proc.stdin is not None
        return self.proc.stdin.transport.get_write_buffer_size()

    async def drain(self) -> None:
        assert self.proc.stdin is not None
        await self.proc.stdin.drain()

    async def readline(self) -> bytes:
        assert self.proc.stdout is not None
        try:
            return await self.proc.stdout.readline()
        except (ValueError, asyncio.LimitOverrunError, ConnectionError):
            return b""

    async def ended(self) -> str:
        try:
            await asyncio.wait_for(asyncio.shield(self.proc.wait()), EXIT_WAIT_S)
            await asyncio.wait_for(asyncio.shield(self.stderr_done), EXIT_WAIT_S)
        except asyncio.TimeoutError:
            pass
        if self.proc.returncode is not None:
            await self._remove_cgroups()
        why = describe_returncode(self.proc.returncode)
        if self.stderr:
            why += f"; its last stderr line: {self.stderr[-1].decode(errors='replace')}"
        return why

    async def kill(self) -> None:
        if self.proc.returncode is None:
            try:
                self.proc.kill()
            except ProcessLookupError:
                pass
        try:
            await asyncio.wait_for(self.proc.wait(), 10)
        except asyncio.TimeoutError:
            log.warning("worker %s did not exit after SIGKILL", self.name)
            return
        await self._remove_cgroups()

    async def _remove_cgroups(self) -> None:
        """The worker's per-session cgroups (worker/cgroups.py), once its processes are gone: a SIGKILLed worker cannot
        remove them itself. Named after its pid, made under this process's own groups, which it inherited."""
        if not self.cgroups_removed:
            self.cgroups_removed = True
            await asyncio.to_thread(cgroups.cleanup, cgroups.locate(f"{cgroups.PREFIX}{self.proc.pid}"))


class ProcessLauncher:
    """Workers as local subprocesses: rlimits, per-session uids when root, a private network namespace where permitted."""

    backend = "process"
    # CPU groups per session only inside this process's own group (`cgroups.enter_pool_group`, made in `prepare`)
    capabilities = Capabilities(isolates_model_code=False, isolates_network=False, runs_on_host=True,
                                session_cpu_groups=False)

    def __init__(self, cfg: SandboxConfig) -> None:
        self.cfg = cfg
        self.scratch_root = ""
        self.python = sys.executable
        self.setuid_ok = False
        self.hide_paths: list[str] = []
        self.pool_group = ""

    async def prepare(self) -> None:
        # sessions make their (unguessably named) scratch dirs here only where private mounts are refused:
        # they may create, never list
        self.scratch_root = tempfile.mkdtemp(prefix="arenaforge-scratch-")
        os.chmod(self.scratch_root, 0o1733)
        self.python, self.setuid_ok, stdlib = await asyncio.to_thread(_pick_python)
        self.hide_paths = _paths_to_hide(stdlib)
        if self.cfg.session_cgroups and self.cfg.process_cpu_groups:
            self.pool_group = cgroups.enter_pool_group()
            self.capabilities = dataclasses.replace(self.capabilities, session_cpu_groups=bool(self.pool_group))

    @property
    def can_setuid(self) -> bool:
        return os.geteuid() == 0 and self.setuid_ok

    async def place(self, requirements: list[str]) -> tuple[str | None, str]:
        version = await asyncio.to_thread(python_version, self.python)
        return None, str(await asyncio.to_thread(install, requirements, version))

    async def launch(self, index: int, image: str | None = None) -> Transport:
        # -I -S: no environment variables, user site or site-packages: tool code sees the stdlib only, as in the image
        env = {"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
        proc = await asyncio.create_subprocess_exec(
            *worker_argv(self.python),
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,  # its last lines say why it died (sessions never write there)
            env=env,
            cwd=self.scratch_root,
            # a process group of its own (no Ctrl-C from the terminal; the pool stops it), in the pool's session: one
            # autogroup with the pool's process (or its CPU group: `prepare`), where `sandbox.nice` lets that process
            # take a core first (a session of its own would be a group the kernel weighs as an equal). The worker
            # gives up the terminal itself.
            process_group=0,
            limit=STREAM_LIMIT,
        )
        _lower_priority(proc.pid, self.cfg.nice)
        return ProcessTransport(proc, f"process-{index}-{proc.pid}")

    async def close(self) -> None:
        if self.scratch_root:
            shutil.rmtree(self.scratch_root, ignore_errors=True)
        if self.pool_group:
            self.pool_group = ""
            cgroups.leave_pool_group()


def _lower_priority(pid: int, nice: int) -> None:
    """The worker's nice value, set as it starts (from here: it has not run past its interpreter's start), inherited
    by every zygote and session it forks. Raising a process's nice value needs no privilege."""
    try:
        os.setpriority(os.PRIO_PROCESS, pid, max(nice, os.getpriority(os.PRIO_PROCESS, pid)))
    except OSError:  # gone already: the pool finds out when it says hello
        pass


async def _read_line(stream: asyncio.StreamReader) -> bytes:
    try:
        return await stream.readline()
    except ValueError:  # a line past the stream limit: skip it
        return b"..."
    except ConnectionError:
        return b""


def describe_returncode(code: int | None) -> str:
    """A worker's exit status in words; the PID-namespace relay (policy.own_pid_namespace) exits 128+N for signal N."""
    if code is None:
        return "it has not exited"
    if code < 0 or code > 128:
        number = -code if code < 0 else code - 128
        try:
            name = signal.Signals(number).name
        except ValueError:
            name = f"signal {number}"
        return f"it was killed by {name}"
    return f"it exited with status {code}"


def _stdlib_dir(python: str) -> str:
    import subprocess

    try:
        return subprocess.run(
            [python, "-I", "-S", "-c", "import os; print(os.path.dirname(os.__file__))"],
            capture_output=True, text=True, timeout=30, env={},
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def _world_readable(path: Path) -> bool:
    """Whether an unprivileged session uid could read `path` (every parent traversable)."""
    for part in [path, *path.parents]:
        try:
            if not part.stat().st_mode & 0o001:
                return False
        except OSError:
            return False
    return bool(path.stat().st_mode & 0o004)


def _pick_python() -> tuple[str, bool, str]:
    """(python, uid switching possible, its stdlib dir): this interpreter, or the system one when ours lives where
    other uids cannot read (e.g. under /root)."""
    if os.geteuid() != 0:
        return sys.executable, False, _stdlib_dir(sys.executable)
    for candidate in (sys.executable, "/usr/bin/python3", shutil.which("python3") or ""):
        if candidate and Path(candidate).exists() and os.access(candidate, os.X_OK):
            stdlib = _stdlib_dir(candidate)
            if stdlib and _world_readable(Path(stdlib).resolve()):
                return candidate, True, stdlib
    log.warning("no Python with a world-readable standard library: process sandbox sessions will not switch uid")
    return sys.executable, False, _stdlib_dir(sys.executable)


def _paths_to_hide(stdlib: str) -> list[str]:
    """Host places a process-backend session has no business reading: this checkout (the warehouse and the source
    tree usually live there), the working directory, home directories and /run (host sockets), minus whatever
    holds the interpreter the sessions run on."""
    needed = [Path(p).resolve() for p in (stdlib, sys.base_prefix) if p]
    candidates = {WORKER_DIR.parents[3], Path.cwd(), Path.home(), Path("/root"), Path("/home"), Path("/run")}
    keep = []
    for path in sorted(p.resolve() for p in candidates if p.is_dir()):
        if path == Path("/") or any(n == path or path in n.parents for n in needed):
            continue
        keep.append(str(path))
    return keep
