"""Sandboxes across several Docker engines: one launcher that spreads worker containers over `sandbox.engines`.

Each engine is a `DockerLauncher` with its own client. Every engine gets the sandbox image before the
pool starts: copied from an engine that has it (`docker save | docker load`, nothing downloaded), or
built from the cached root filesystem tar when none has it (`image.build_image`). A new worker goes to
the live engine running the fewest live workers; the pool's own least-busy choice of worker then spreads
sessions over the engines too.

Losing an engine (its daemon stopped): the attach streams of its containers end, so the pool sees those
workers die and its usual typed failures follow (`WorkerLost` for a call in flight, `SessionLost` at a
session's next call: infrastructure failures, never scored). Their replacements are launched here; an
engine that does not answer a launch is marked lost for the rest of the pool's life and the next
engine is tried, so the pool goes on with the engines left.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from arenaforge.environments.runtime.image import _image_exists, image_ref
from arenaforge.environments.runtime.docker_backend import (
    DockerLauncher,
    DockerTransport,
    EngineUnreachable,
    docker_client,
)
from arenaforge.environments.runtime.transports import Transport
from arenaforge.schemas.config import SandboxConfig
from arenaforge.schemas.errors import ConfigError, SandboxError

log = logging.getLogger("arenaforge.sandbox")

COPY_CHUNK = 1 << 20


@dataclass(eq=False)
class Engine:
    url: str
    launcher: DockerLauncher
    lost: str = ""  # why it was given up, empty while it serves
    workers: list[DockerTransport] = field(default_factory=list)
    starting: int = 0  # launches under way (counted, so launches at once spread too)

    def load(self) -> int:
        """Live workers on this engine (transports whose stream still runs), plus those starting."""
        self.workers = [t for t in self.workers if t.live]
        return len(self.workers) + self.starting


class EnginesLauncher:
    """Worker containers on several Docker engines, least loaded first; see the module docstring."""

    backend = "docker"
    capabilities = DockerLauncher.capabilities
    scratch_root = "/tmp"
    can_setuid = True
    hide_paths: list[str] = []

    def __init__(self, cfg: SandboxConfig) -> None:
        if len(set(cfg.engines)) != len(cfg.engines):
            raise ConfigError(f"sandbox.engines lists an engine twice: {cfg.engines}")
        self.cfg = cfg
        self.engines = [Engine(url, DockerLauncher(cfg, base_url=url)) for url in cfg.engines]

    async def prepare(self) -> None:
        ref = image_ref(self.cfg.image)
        for engine in self.engines:  # a clear error naming the engine that does not answer, before any work
            try:
                engine.launcher.client = await asyncio.to_thread(_client, engine.url)
            except Exception as err:  # noqa: BLE001 - the engine's own errors are translated at this boundary
                raise SandboxError(f"the Docker engine {engine.url} (sandbox.engines) does not answer: {err}") from err
        have = [await asyncio.to_thread(_image_exists, e.launcher.client, ref) for e in self.engines]
        if not any(have):  # none has it: the first builds it (from the cached rootfs tar), the others copy it
            await self.engines[0].launcher.prepare()
            have[0] = True
        donor = self.engines[have.index(True)]
        for engine, present in zip(self.engines, have, strict=True):
            if not present:
                log.info("copying sandbox image %s from %s to %s", ref, donor.url, engine.url)
                await asyncio.to_thread(copy_image, donor.launcher.client, engine.launcher.client, ref)
            await engine.launcher.prepare()  # finds the image; removes containers of dead pools

    async def place(self, requirements: list[str]) -> tuple[str | None, str]:
        """A derived image for `requirements`: built (or found) on the first live engine, copied to the others."""
        live = [e for e in self.engines if not e.lost]
        if not live:
            raise SandboxError("no sandbox engine is left: " + "; ".join(f"{e.url}: {e.lost}" for e in self.engines))
        image, site = await live[0].launcher.place(requirements)
        if image is not None:
            for engine in live[1:]:
                if not await asyncio.to_thread(_image_exists, engine.launcher.client, image):
                    await asyncio.to_thread(copy_image, live[0].launcher.client, engine.launcher.client, image)
        return image, site

    async def launch(self, index: int, image: str | None = None) -> Transport:
        while True:
            live = [e for e in self.engines if not e.lost]
            if not live:
                raise SandboxError("no sandbox engine is left: " + "; ".join(f"{e.url}: {e.lost}" for e in self.engines))
            engine = min(live, key=lambda e: (e.load(), self.engines.index(e)))
            engine.starting += 1
            try:
                transport = await engine.launcher.launch(index, image)
            except EngineUnreachable as err:
                engine.lost = str(err)
                log.warning("sandbox engine %s is lost (%s): its sessions fail as infrastructure failures, "
                            "new workers go to the %d engine(s) left", engine.url, err, len(live) - 1)
                continue
            finally:
                engine.starting -= 1
            assert isinstance(transport, DockerTransport)
            engine.workers.append(transport)
            return transport

    def stats(self) -> list[dict[str, Any]]:
        return [{"engine": e.url, "workers": e.load() - e.starting, "lost": e.lost} for e in self.engines]

    async def close(self) -> None:
        await asyncio.gather(*(e.launcher.close() for e in self.engines), return_exceptions=True)


def _client(url: str) -> Any:
    client = docker_client(60, url)
    client.ping()
    return client


def copy_image(source: Any, dest: Any, ref: str) -> None:
    """Stream `ref` from one engine to another (`docker save | docker load`), never held whole in memory."""
    stream = source.api.get_image(ref, chunk_size=COPY_CHUNK)
    for _ in dest.api.load_image(stream):  # the engine's progress messages; drained so the load completes
        pass
    if not _image_exists(dest, ref):
        raise SandboxError(f"loading {ref} into another Docker engine did not produce it")


def on_least_loaded_engine(workers: list[Any]) -> list[Any]:
    """The live workers (`WorkerConnection`s) of the engine with the fewest sessions per worker; all of them when
    they share one engine (or run as processes), so a single engine keeps the pool's own choice."""
    by_engine: dict[str, list[Any]] = {}
    for worker in workers:
        by_engine.setdefault(getattr(worker.transport, "engine", ""), []).append(worker)
    if len(by_engine) < 2:
        return workers
    return min(by_engine.values(), key=lambda ws: (sum(len(w.sessions) for w in ws) / len(ws), ws[0].index))


def docker_launcher(cfg: SandboxConfig) -> DockerLauncher | EnginesLauncher:
    """The docker backend's launcher: one engine (the default, or the one listed), or several."""
    if len(cfg.engines) > 1:
        return EnginesLauncher(cfg)
    return DockerLauncher(cfg, base_url=cfg.engines[0] if cfg.engines else None)
