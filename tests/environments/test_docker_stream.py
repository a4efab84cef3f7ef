"""A Docker worker's stream: over the pool's own socket where the engine is local, and alive as long as its worker.

Where the engine runs on this host, the pool listens on a Unix socket in a directory bind-mounted into the worker's
container, and the worker makes that socket its stdin and stdout: no call passes through dockerd and the shim. A
worker that cannot reach it says so and the pool keeps the attach stream, which is also the stream of the tests below.

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
import os
import socket
import stat

import pytest

from arenaforge.environments.runtime import create_pool, docker_backend
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


def _worker_stdio(transport) -> tuple[str, str]:
    """What the worker's stdin and stdout are, read from the host: `socket:[...]` or `pipe:[...]`."""
    transport.container.reload()
    pid = transport.container.attrs["State"]["Pid"]
    return os.readlink(f"/proc/{pid}/fd/0"), os.readlink(f"/proc/{pid}/fd/1")


async def _echo_through_each_worker(cfg: SandboxConfig) -> list[tuple[str, str, str, bool, str]]:
    """Per worker: its stdin, its stdout, an echo's answer, whether its channel directory is still on the host, and
    the channel it reports (`arenaforge sandbox status`)."""
    async with await create_pool(cfg) as pool:
        sessions = await asyncio.gather(*(pool.open(ECHO) for _ in range(2 * cfg.pool_size)))
        assert len({s.worker.index for s in sessions}) == cfg.pool_size
        seen = []
        for session in sessions[: cfg.pool_size]:
            obs = await pool.call(session, "echo", {"text": session.id})
            transport = session.worker.transport
            sources = [m["Source"] for m in transport.container.attrs["Mounts"] if m["Type"] == "bind"]
            seen.append((*_worker_stdio(transport), obs.output, any(os.path.exists(s) for s in sources),
                         session.worker.info.get("channel", "")))
            assert obs.output == session.id, obs
        return seen


@pytest.mark.docker
def test_a_docker_worker_talks_over_the_pools_socket_and_leaves_no_directory_behind() -> None:
    require_docker()
    direct = asyncio.run(_echo_through_each_worker(SandboxConfig(backend="docker", pool_size=2, spare_sessions=0)))
    attached = asyncio.run(_echo_through_each_worker(
        SandboxConfig(backend="docker", pool_size=2, spare_sessions=0, docker_socket_channel=False)))
    assert all(i.startswith("socket:") and o == i and not left and said == "socket"
               for i, o, _, left, said in direct), direct
    # the attach stream: the engine's pipes, as before (the setting is what decides, not the image)
    assert all(i.startswith("pipe:") and o.startswith("pipe:") and said == "stdio"
               for i, o, _, _, said in attached), attached


@pytest.mark.docker
def test_a_worker_that_cannot_reach_the_pools_socket_falls_back_to_the_attach_stream(monkeypatch) -> None:
    require_docker()
    listen = docker_backend._listen

    def unreachable() -> tuple:
        # as for an engine whose root is not the pool's user: the container's root, without CAP_DAC_OVERRIDE, is
        # refused a socket whose mode grants it nothing
        directory, listener = listen()
        os.chmod(os.path.join(directory, "pool.sock"), 0)
        return directory, listener

    monkeypatch.setattr(docker_backend, "_listen", unreachable)
    seen = asyncio.run(_echo_through_each_worker(SandboxConfig(backend="docker", pool_size=1, spare_sessions=0)))
    assert [(i.split(":")[0], o.split(":")[0], left) for i, o, _, left, _ in seen] == [("pipe", "pipe", False)], seen
    assert "Permission denied" in seen[0][4], seen  # and the worker says why, in `arenaforge sandbox status`


@pytest.mark.docker
def test_a_connection_without_the_workers_token_is_turned_away(monkeypatch) -> None:
    require_docker()
    listen = docker_backend._listen
    impostors = []

    def raced() -> tuple:
        # anyone may enter the directory (a pool that is not root must let the container's root in): a local process
        # connects before the worker does
        directory, listener = listen()
        for wrong in (b"", b"0123456789abcdef0123456789abcdef\n"):  # one says nothing, one a wrong token
            impostor = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            impostor.connect(os.path.join(directory, "pool.sock"))
            impostor.sendall(wrong)
            impostors.append((impostor, stat.S_IMODE(os.stat(directory).st_mode)))
        return directory, listener

    monkeypatch.setattr(docker_backend, "_listen", raced)
    seen = asyncio.run(_echo_through_each_worker(SandboxConfig(backend="docker", pool_size=1, spare_sessions=0)))
    assert [(i.split(":")[0], said) for i, _, _, _, said in seen] == [("socket", "socket")], seen
    for impostor, mode in impostors:
        impostor.settimeout(30)
        assert mode == 0o711 and impostor.recv(1 << 16) == b"", "an impostor was closed unread, never sent a request"
