"""How the pool reaches a worker: the `Transport` and `Launcher` protocols every sandbox backend implements.

A `Launcher` makes `Transport`s; a transport moves JSON lines to and from one worker and can
kill it. A launcher declares what its workers can do (`Capabilities`); the pool asks those, never
the launcher's name. Everything above (sessions, limits, replacement) is the same for every backend
and lives in `arenaforge.environments.runtime.pool` (sessions) and `.workers` (worker slots); the
backends are registered by name in `.launchers`, each in a module of its own (`process_backend`: a local
subprocess; `docker_backend`: a container's attached stdio; `engines`: containers on several Docker engines).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

STREAM_LIMIT = 1 << 26  # longest reply line accepted from a worker (64 MiB)


class Transport(Protocol):
    name: str
    shares_host_cores: bool  # the worker's CPUs are this host's, by number (`placement`)

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
