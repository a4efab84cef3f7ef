"""The sandbox backends by name: `sandbox.backend` picks one here, and nothing else in the runtime asks a name.

A backend is a `Launcher` (transports.py: its transport, and the `Capabilities` the pool asks); adding one is a module
with its launcher (as `process_backend.py`, `docker_backend.py`) plus one line in `LAUNCHERS`. `auto` is resolved
here too: docker when an engine answers (and its image builds), else process (warned).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from arenaforge.environments.runtime.engines import docker_launcher
from arenaforge.environments.runtime.docker_backend import docker_engine_answers
from arenaforge.environments.runtime.process_backend import ProcessLauncher
from arenaforge.environments.runtime.transports import Launcher
from arenaforge.schemas.config import SandboxConfig
from arenaforge.schemas.errors import ConfigError, SandboxError

log = logging.getLogger("arenaforge.sandbox")

LAUNCHERS: dict[str, Callable[[SandboxConfig], Launcher]] = {"docker": docker_launcher, "process": ProcessLauncher}
AUTO = "auto"  # docker if an engine answers, else process


async def open_launcher(cfg: SandboxConfig) -> Launcher:
    """The prepared launcher `cfg.backend` names. Raises ConfigError for a name not registered here."""
    if cfg.backend != AUTO and cfg.backend not in LAUNCHERS:
        raise ConfigError(f"unknown sandbox backend {cfg.backend!r}; known: {', '.join([AUTO, *LAUNCHERS])}")
    backend = cfg.backend
    if backend == AUTO:
        engines = cfg.engines or [None]
        answers = await asyncio.gather(*(asyncio.to_thread(docker_engine_answers, url) for url in engines))
        backend = "docker" if any(answers) else "process"
        if backend == "process":
            log.warning(
                "no Docker engine answers: using the process sandbox backend (weaker isolation, docs/SANDBOX.md); "
                "run scripts/start-docker.sh for containers"
            )
    try:
        return await _prepare(backend, cfg)
    except SandboxError as err:
        if cfg.backend != AUTO or backend != "docker":
            raise
        log.warning("the docker sandbox backend is unusable (%s): falling back to the process backend", err)
        return await _prepare("process", cfg)


async def _prepare(backend: str, cfg: SandboxConfig) -> Launcher:
    launcher = LAUNCHERS[backend](cfg)
    try:
        await launcher.prepare()
    except SandboxError:
        raise
    except Exception as err:  # noqa: BLE001 - the engine's own errors are translated at this boundary
        raise SandboxError(f"cannot prepare the {backend} sandbox backend: {err}") from err
    return launcher
