"""How the pool reaches a worker: a Docker container's attached stdio, or a local subprocess.

A `Launcher` makes `Transport`s; a transport moves JSON lines to and from one worker and can
kill it. A launcher declares what its workers can do (`Capabilities`); the pool asks those, never
the launcher's name. Everything above (sessions, limits, replacement) is the same for every backend
and lives in `arenaforge.environments.runtime.pool` (sessions) and `.workers` (worker slots); the
backends are registered by name in `.launchers`.
"""

from __future__ import annotations

import asyncio
import collections
import logging
import os
import shutil
import signal
import socket
import struct
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from arenaforge.schemas.config import SandboxConfig
from arenaforge.schemas.errors import SandboxError

from arenaforge.environments.runtime.deps import derived_image, install, python_version
from arenaforge.environments.runtime.image import PYTHON_VERSION, WORKER_COMMAND, WORKER_DIR, build_image, worker_argv
from arenaforge.environments.runtime.worker import cgroups

log = logging.getLogger("arenaforge.sandbox")

POOL_LABEL = "arenaforge.sandbox"
STREAM_LIMIT = 1 << 26  # longest reply line accepted from a worker (64 MiB)


class Transport(Protocol):
    name: str

    def write(self, data: bytes) -> None:
        """Queue bytes for the worker (non-blocking)."""

    def buffered(self) -> int:
        """Bytes queued but not yet sent."""

    async def drain(self) -> None: ...

    async def readline(self) -> bytes:
        """One line, or b"" once the worker is gone."""

    async def ended(self) -> str:
        """After `readline` gave b"": why the worker ended (exit status, its last stderr line), or "" if unknown."""

    async def kill(self) -> None: ...


@dataclass(frozen=True)
class Capabilities:
    """What a launcher's workers can do; the pool and its worker slots ask these, never the backend's name."""

    isolates_model_code: bool  # confines model-written tool code well enough to run it unasked (docs/SANDBOX.md)
    isolates_network: bool  # the worker has no network at all, so its sessions need no private namespace each
    runs_on_host: bool  # sessions are host processes: requirement dirs bound in, namespaces and uids best effort
    session_cpu_groups: bool  # a per-session CPU cgroup weighs only against the worker's own sessions


class Launcher(Protocol):
    backend: str  # the name it is registered under (`launchers.LAUNCHERS`), for messages and stats
    capabilities: Capabilities
    scratch_root: str
    can_setuid: bool
    hide_paths: list[str]

    async def prepare(self) -> None: ...

    async def launch(self, index: int, image: str | None = None) -> Transport:
        """A worker; `image`: a derived image (`place`) instead of the sandbox image (docker only)."""

    async def place(self, requirements: list[str]) -> tuple[str | None, str]:
        """Where `requirements` are installed: (derived image or None, directory the sessions import from).
        Blocking work (pip, docker build) happens in a thread; raises deps.Unavailable."""

    async def close(self) -> None: ...


# --------------------------------------------------------------------------- process backend
STDERR_LINES = 5  # the worker's last stderr lines, kept to say why it died
EXIT_WAIT_S = 5.0  # how long a worker that closed its output gets to exit before we say so without its status


class ProcessTransport:
    def __init__(self, proc: asyncio.subprocess.Process, name: str) -> None:
        self.proc = proc
        self.name = name
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
    # CPU groups only inside a container: on the host a group of the worker's own would leave the pool's autogroup and
    # weigh against it as an equal (`sandbox.nice` is how that is weighed there)
    capabilities = Capabilities(isolates_model_code=False, isolates_network=False, runs_on_host=True,
                                session_cpu_groups=False)

    def __init__(self, cfg: SandboxConfig) -> None:
        self.cfg = cfg
        self.scratch_root = ""
        self.python = sys.executable
        self.setuid_ok = False
        self.hide_paths: list[str] = []

    async def prepare(self) -> None:
        # sessions make their (unguessably named) scratch dirs here only where private mounts are refused:
        # they may create, never list
        self.scratch_root = tempfile.mkdtemp(prefix="arenaforge-scratch-")
        os.chmod(self.scratch_root, 0o1733)
        self.python, self.setuid_ok, stdlib = await asyncio.to_thread(_pick_python)
        self.hide_paths = _paths_to_hide(stdlib)

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
            # autogroup with the pool's process, where `sandbox.nice` lets that process take a core first (a session of
            # its own would be a group the kernel weighs as an equal). The worker gives up the terminal itself.
            process_group=0,
            limit=STREAM_LIMIT,
        )
        _lower_priority(proc.pid, self.cfg.nice)
        return ProcessTransport(proc, f"process-{index}-{proc.pid}")

    async def close(self) -> None:
        if self.scratch_root:
            shutil.rmtree(self.scratch_root, ignore_errors=True)


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


# --------------------------------------------------------------------------- docker backend
class DockerTransport:
    """The worker's stdin/stdout through the engine's attach stream (stdout arrives in 8-byte-header frames)."""

    def __init__(self, container: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, raw: Any,
                 engine: str = "") -> None:
        self.container = container
        self.engine = engine  # the engine's address ("" for the default one)
        self.name = f"docker-{container.short_id}"
        self.reader = reader
        self.writer = writer
        self.raw = raw
        self.lines = bytearray()
        self.eof = False
        self.killed = False

    def write(self, data: bytes) -> None:
        self.writer.write(data)

    def buffered(self) -> int:
        return self.writer.transport.get_write_buffer_size()

    async def drain(self) -> None:
        await self.writer.drain()

    async def _frame(self) -> bytes:
        header = await self.reader.readexactly(8)
        stream, size = header[0], struct.unpack(">I", header[4:])[0]
        payload = await self.reader.readexactly(size)
        return payload if stream == 1 else b""

    async def readline(self) -> bytes:
        while True:
            cut = self.lines.find(b"\n")
            if cut >= 0:
                line = bytes(self.lines[: cut + 1])
                del self.lines[: cut + 1]
                return line
            if self.eof or len(self.lines) > STREAM_LIMIT:
                return b""
            try:
                self.lines += await self._frame()
            except (asyncio.IncompleteReadError, ConnectionError, OSError):
                self.eof = True

    @property
    def live(self) -> bool:
        return not (self.eof or self.killed)

    async def ended(self) -> str:
        return ""  # the engine removes the container (auto_remove): its status is not worth a round trip here

    async def kill(self) -> None:
        self.killed = True
        try:
            self.writer.close()
        except Exception:  # noqa: BLE001 - the socket may already be gone
            pass
        await asyncio.to_thread(_remove_container, self.container)


def _remove_container(container: Any) -> None:
    import docker.errors
    import requests

    try:
        container.remove(force=True)
    except docker.errors.NotFound:
        pass
    except docker.errors.APIError as err:
        if "already in progress" not in str(err):
            log.warning("could not remove container %s: %s", container.short_id, err)
    except (docker.errors.DockerException, requests.exceptions.RequestException) as err:  # its engine is gone
        log.info("could not reach the engine to remove container %s: %s", container.short_id, err)


class EngineUnreachable(SandboxError):
    """A Docker engine did not answer at all (its daemon stopped or its socket is gone), as opposed to refusing."""


def docker_client(timeout: int = 60, base_url: str | None = None) -> Any:
    import docker

    if base_url:
        return docker.DockerClient(base_url=base_url, timeout=timeout)
    return docker.from_env(timeout=timeout)


def docker_engine_answers(base_url: str | None = None) -> bool:
    try:
        client = docker_client(timeout=5, base_url=base_url)
        client.ping()
        client.close()
        return True
    except Exception:  # noqa: BLE001 - any failure to reach the engine means "no engine"
        return False




class DockerLauncher:
    """Workers as long-lived containers: no network, read-only root, tmpfs scratch, capped memory/pids/CPU."""

    backend = "docker"
    capabilities = Capabilities(isolates_model_code=True, isolates_network=True, runs_on_host=False,
                                session_cpu_groups=True)
    scratch_root = "/tmp"
    can_setuid = True
    hide_paths: list[str] = []

    def __init__(self, cfg: SandboxConfig, base_url: str | None = None) -> None:
        self.cfg = cfg
        self.base_url = base_url  # None: the engine DOCKER_HOST or the default socket names
        self.client: Any = None
        self.image = ""
        self.owner = f"{socket.gethostname()}:{os.getpid()}"

    async def prepare(self) -> None:
        if self.client is None:
            self.client = await asyncio.to_thread(docker_client, 60, self.base_url)
        self.image = await asyncio.to_thread(build_image, self.client, self.cfg.image)
        await asyncio.to_thread(self._reap_stale)

    def _reap_stale(self) -> None:
        """Remove containers left by pools of processes that died on this host."""
        host = socket.gethostname()
        # sparse: no inspect per container, which fails when another pool's container goes away meanwhile
        for container in self.client.containers.list(all=True, filters={"label": POOL_LABEL}, sparse=True):
            owner = (container.attrs.get("Labels") or {}).get(POOL_LABEL, "")
            owner_host, _, pid = owner.rpartition(":")
            if owner_host == host and pid.isdigit() and not _pid_alive(int(pid)):
                _remove_container(container)

    async def place(self, requirements: list[str]) -> tuple[str | None, str]:
        return await asyncio.to_thread(derived_image, self.client, self.image, requirements, PYTHON_VERSION)

    def _create(self, index: int, image: str) -> tuple[Any, Any]:
        cfg = self.cfg
        api = self.client.api
        host_config = api.create_host_config(
            network_mode="none",
            read_only=True,
            tmpfs={"/tmp": f"rw,nosuid,nodev,size={cfg.scratch_mb}m,mode=1733"},
            mem_limit=f"{cfg.container_memory_mb}m",
            memswap_limit=f"{cfg.container_memory_mb}m",
            pids_limit=cfg.container_pids,
            nano_cpus=int(cfg.cpus * 1e9),
            cap_drop=["ALL"],
            # SETUID/SETGID: to drop each session to its own uid; SYS_ADMIN: to give each session private mounts,
            # IPC and network; sessions themselves hold no capability and a seccomp filter refuses those syscalls
            cap_add=["SETUID", "SETGID", "SYS_ADMIN"],
            security_opt=["no-new-privileges"],
            auto_remove=True,
            ipc_mode="private",
            # its own cgroup tree as root: the worker mounts it to give each session a group (worker/cgroups.py),
            # and sees nothing of the host's
            cgroupns="private",
        )
        created = api.create_container(
            image,
            command=WORKER_COMMAND,
            stdin_open=True,
            detach=False,  # with stdin_open: StdinOnce, so the worker sees EOF (and exits) when the pool detaches
            tty=False,
            environment={},
            user="0",
            working_dir="/tmp",
            labels={POOL_LABEL: self.owner, "arenaforge.worker": str(index)},
            host_config=host_config,
        )
        container = self.client.containers.get(created["Id"])
        sock = api.attach_socket(container.id, params={"stdin": 1, "stdout": 1, "stream": 1})
        raw = getattr(sock, "_sock", sock)
        api.start(container.id)
        return container, raw

    async def launch(self, index: int, image: str | None = None) -> Transport:
        import docker.errors
        import requests

        try:
            container, raw = await asyncio.to_thread(self._create, index, image or self.image)
        except requests.exceptions.ConnectionError as err:
            raise EngineUnreachable(f"the Docker engine {self.base_url or 'default'} does not answer: {err}") from err
        except (docker.errors.DockerException, requests.exceptions.RequestException) as err:
            raise SandboxError(f"cannot start a sandbox container: {err}") from err
        raw.setblocking(False)
        reader, writer = await asyncio.open_connection(sock=raw, limit=STREAM_LIMIT)
        return DockerTransport(container, reader, writer, raw, self.base_url or "")

    async def close(self) -> None:
        if self.client is not None:
            await asyncio.to_thread(self.client.close)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
