"""The docker backend: workers as long-lived containers on one Docker engine (no network, read-only root, tmpfs
scratch, capped memory/pids/CPU), reached over a Unix socket of the pool's bind-mounted into the container where the
engine is local (`sandbox.docker_socket_channel`), else through the container's attached stdio. Several engines:
`engines.py`."""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import os
import secrets
import shutil
import socket
import struct
import sys
import tempfile
from typing import Any

from arenaforge.environments.runtime.deps import derived_image
from arenaforge.environments.runtime.image import PYTHON_VERSION, WORKER_COMMAND, build_image
from arenaforge.environments.runtime.transports import STREAM_LIMIT, Capabilities, Transport
from arenaforge.environments.runtime.worker import cgroups
from arenaforge.schemas.config import SandboxConfig
from arenaforge.schemas.errors import SandboxError

log = logging.getLogger("arenaforge.sandbox")

POOL_LABEL = "arenaforge.sandbox"


CHANNEL_DIR = "/run/arenaforge-channel"  # where a worker finds the pool's socket (`worker.server.connect_channel`)
CHANNEL_WAIT_S = 60.0  # for a started worker to connect, or to say it cannot: its interpreter's start, on a busy host
TOKEN_WAIT_S = 5.0  # for a connection to the channel to present its token (a worker sends it as it connects)


class DockerTransport:
    """The worker's stdin/stdout: through the engine's attach stream (stdout arrives in 8-byte-header frames), or,
    once `use_channel` is called, over the socket the worker connected to (plain lines, no engine in between)."""

    def __init__(self, container: Any, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, attach: Any,
                 engine: str = "") -> None:
        self.container = container
        self.engine = engine  # the engine's address ("" for the default one)
        self.name = f"docker-{container.short_id}"
        self.shares_host_cores = _local_engine(engine or None)  # a container's cores are its engine's host's
        self.reader = reader
        self.writer = writer
        # what docker-py's attach_socket returned, kept for as long as the worker lives: it holds the HTTP response
        # whose garbage collection closes the socket (`attach_socket`)
        self.attach = attach
        self.lines = bytearray()
        self.eof = False
        self.killed = False
        self.attach_writer: asyncio.StreamWriter | None = None  # kept open while the channel carries the calls

    def use_channel(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.attach_writer, self.reader, self.writer = self.writer, reader, writer

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
        if self.attach_writer is not None:  # the channel: lines, as the process backend's pipe
            try:
                line = await self.reader.readline()
            except (ValueError, asyncio.LimitOverrunError, ConnectionError):
                line = b""
            self.eof = self.eof or not line
            return line
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
        for writer in (self.writer, self.attach_writer):
            try:
                if writer is not None:
                    writer.close()
            except Exception:  # noqa: BLE001 - the socket may already be gone
                pass
        await asyncio.to_thread(_remove_container, self.container)


def attach_socket(attach: Any) -> socket.socket:
    """The socket under what docker-py's `attach_socket` returned (a SocketIO over a Unix socket).

    Only the socket is used, but the caller must keep `attach` referenced for as long as it uses the socket: it holds
    the HTTP response (`_response`), and when that response is garbage collected (a reference cycle: whenever the
    collector runs) urllib3 closes its connection, which is this socket. Workers then lost their stream at random:
    the engine saw the connection close and ended the worker's stdin (it exited 0), while the pool's reader, whose
    file descriptor was closed under it, heard nothing and its calls waited out their deadline."""
    return getattr(attach, "_sock", attach)


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
        self.socket_channel = cfg.docker_socket_channel and _local_engine(base_url)
        self.cpus = cfg.cpus  # at most the engine's CPUs (`prepare`): it refuses a container more than it has
        self.flow_group: str | None = None  # the cgroup parent of its containers ("": the engine's), `prepare`

    async def prepare(self) -> None:
        if self.client is None:
            self.client = await asyncio.to_thread(docker_client, 60, self.base_url)
        self.image = await asyncio.to_thread(build_image, self.client, self.cfg.image)
        info = await asyncio.to_thread(self.client.info)
        engine_cpus = info.get("NCPU") or 0
        self.cpus = min(self.cfg.cpus, engine_cpus) if engine_cpus else self.cfg.cpus
        await asyncio.to_thread(self._reap_stale)
        if self.flow_group is None:
            self.flow_group = ""
            if _local_engine(self.base_url) and (info.get("CgroupDriver"), str(info.get("CgroupVersion"))) == (
                    "cgroupfs", "1"):
                self.flow_group = self._enter_flow_group()  # a few cgroup writes, as the process backend's

    def _enter_flow_group(self) -> str:
        """The flow's process first, as on the process backend: its containers go into its CPU group (made here:
        `cgroups.enter_pool_group`), each weighing as one process at `sandbox.nice` beside it. Under the engine's
        own group they weighed as the flow's equal, and a hop of a neighbour's call (the flow's process, woken with a
        reply) queued behind a busy session's core waited there up to a tick (docs/SANDBOX.md). Needs a local engine
        with the cgroupfs driver on cgroup v1, and a pool run as root; elsewhere containers stay where the engine
        puts them."""
        return cgroups.pool_group_parent() if cgroups.enter_pool_group() else ""

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

    def _create(self, index: int, image: str, channel: str = "", token: str = "") -> tuple[Any, Any]:
        cfg = self.cfg
        api = self.client.api
        host_config = api.create_host_config(
            # read-only, and empty once the worker has connected (`launch`)
            binds={channel: {"bind": CHANNEL_DIR, "mode": "ro"}} if channel else None,
            network_mode="none",
            read_only=True,
            tmpfs={"/tmp": f"rw,nosuid,nodev,size={cfg.scratch_mb}m,mode=1733"},
            mem_limit=f"{cfg.container_memory_mb}m",
            memswap_limit=f"{cfg.container_memory_mb}m",
            pids_limit=cfg.container_pids,
            nano_cpus=int(self.cpus * 1e9),
            # in the flow's CPU group, as one process at `sandbox.nice` (`_enter_flow_group`)
            **({"cgroup_parent": self.flow_group, "cpu_shares": max(2, cgroups.NICE_WEIGHT[cfg.nice + 20])}
               if self.flow_group else {}),
            cap_drop=["ALL"],
            # SETUID/SETGID: to drop each session to its own uid; SYS_ADMIN: to give each session private mounts,
            # IPC and network; KILL: to end a session's processes itself (`cgroups.kill`); sessions themselves hold
            # no capability and a seccomp filter refuses those syscalls
            cap_add=["SETUID", "SETGID", "SYS_ADMIN", "KILL"],
            security_opt=["no-new-privileges"],
            auto_remove=True,
            ipc_mode="private",
            # its own cgroup tree as root: the worker mounts it to give each session a group (worker/cgroups.py),
            # and sees nothing of the host's
            cgroupns="private",
            # no log driver: the engine would otherwise write every reply line to a JSON file on the host for as
            # long as the worker lives (nothing reads it: replies come through the attach stream)
            log_config={"type": "none"},
        )
        created = api.create_container(
            image,
            command=WORKER_COMMAND,
            stdin_open=True,
            detach=False,  # with stdin_open: StdinOnce, so the worker sees EOF (and exits) when the pool detaches
            tty=False,
            environment={"ARENAFORGE_CHANNEL": f"{CHANNEL_DIR}/pool.sock", "ARENAFORGE_CHANNEL_TOKEN": token}
            if channel else {},
            user="0",
            working_dir="/tmp",
            labels={POOL_LABEL: self.owner, "arenaforge.worker": str(index)},
            host_config=host_config,
        )
        container = self.client.containers.get(created["Id"])
        attach = api.attach_socket(container.id, params={"stdin": 1, "stdout": 1, "stream": 1})
        api.start(container.id)
        return container, attach

    async def launch(self, index: int, image: str | None = None) -> Transport:
        import docker.errors
        import requests

        channel, listener = _listen() if self.socket_channel else ("", None)
        token = secrets.token_hex(16)  # what the worker presents on connecting: anyone else is turned away
        try:
            try:
                container, attach = await asyncio.to_thread(self._create, index, image or self.image, channel, token)
            except requests.exceptions.ConnectionError as err:
                raise EngineUnreachable(
                    f"the Docker engine {self.base_url or 'default'} does not answer: {err}") from err
            except (docker.errors.DockerException, requests.exceptions.RequestException) as err:
                raise SandboxError(f"cannot start a sandbox container: {err}") from err
            raw = attach_socket(attach)
            raw.setblocking(False)
            reader, writer = await asyncio.open_connection(sock=raw, limit=STREAM_LIMIT)
            transport = DockerTransport(container, reader, writer, attach, self.base_url or "")
            if listener is not None:
                await _take_channel(transport, listener, token)
            return transport
        finally:
            if listener is not None:
                listener.close()
                shutil.rmtree(channel, ignore_errors=True)

    async def close(self) -> None:
        if self.client is not None:
            await asyncio.to_thread(self.client.close)
        if self.flow_group:
            self.flow_group = None
            await asyncio.to_thread(cgroups.leave_pool_group, cgroups.CLEANUP_S)


def _local_engine(base_url: str | None) -> bool:
    """Whether the engine runs on this Linux host, so a directory of ours can be bind-mounted into its containers
    (a tcp:// or ssh:// engine, or one in a VM as on macOS, would mount a path of its own machine)."""
    url = base_url or os.environ.get("DOCKER_HOST", "")
    return sys.platform.startswith("linux") and (not url or url.startswith("unix://"))


def _listen() -> tuple[str, socket.socket]:
    """A directory holding a listening socket, for one worker to connect to. Others may enter the directory and
    connect (the container's root holds no CAP_DAC_OVERRIDE, and is not the pool's user where the pool is not root
    on a rootful engine, or the engine remaps users): only a connection that presents the worker's token is taken
    (`_accept_worker`)."""
    directory = tempfile.mkdtemp(prefix="arenaforge-channel-")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        path = os.path.join(directory, "pool.sock")
        listener.bind(path)
        os.chmod(path, 0o666)
        os.chmod(directory, 0o711)  # enter, not list
        listener.listen(8)
        listener.setblocking(False)
    except OSError:
        listener.close()
        shutil.rmtree(directory, ignore_errors=True)
        raise
    return directory, listener


async def _accept_worker(listener: socket.socket, token: str) -> socket.socket:
    """The first connection to `listener` that sends `token` as its first line; every other is closed unread. Each
    is read on its own, so one that sends nothing holds up no other."""
    loop = asyncio.get_running_loop()
    expected = token.encode() + b"\n"
    found: asyncio.Future[socket.socket] = loop.create_future()
    checks: set[asyncio.Task] = set()

    async def check(sock: socket.socket) -> None:
        said = b""
        try:
            async with asyncio.timeout(TOKEN_WAIT_S):
                while len(said) < len(expected) and (chunk := await loop.sock_recv(sock, len(expected) - len(said))):
                    said += chunk
        except (TimeoutError, OSError):
            pass
        finally:
            if hmac.compare_digest(said, expected) and not found.done():
                found.set_result(sock)
            else:
                sock.close()
        if not found.done() or found.result() is not sock:
            log.warning("a connection to a worker's channel did not present its token: closed")

    async def accept_all() -> None:
        while True:
            sock, _ = await loop.sock_accept(listener)
            checks.add(task := asyncio.ensure_future(check(sock)))
            task.add_done_callback(checks.discard)

    acceptor = asyncio.ensure_future(accept_all())
    try:
        return await found
    finally:
        acceptor.cancel()
        for task in list(checks):
            task.cancel()


async def _take_channel(transport: DockerTransport, listener: socket.socket, token: str) -> None:
    """Wait for the worker to connect to `listener` (then calls go over that socket), or to say on its stdout that it
    cannot, or to end (the pool's hello finds out why)."""
    accepted = asyncio.ensure_future(_accept_worker(listener, token))
    said = asyncio.ensure_future(transport.readline())
    try:
        done, _ = await asyncio.wait({accepted, said}, timeout=CHANNEL_WAIT_S, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (accepted, said):
            task.cancel()
    if accepted in done and not accepted.cancelled() and accepted.exception() is None:
        sock = accepted.result()
        reader, writer = await asyncio.open_connection(sock=sock, limit=STREAM_LIMIT)
        transport.use_channel(reader, writer)
    elif said in done and not said.cancelled():
        line = said.result()
        if line:
            log.info("worker %s talks through the attach stream: %s", transport.name,
                     json.loads(line).get("error", "") if line.startswith(b"{") else line[:200])
    else:
        await transport.kill()
        raise SandboxError(f"worker {transport.name} neither connected to its channel nor said why within "
                           f"{CHANNEL_WAIT_S:.0f}s")


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
        return True
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
