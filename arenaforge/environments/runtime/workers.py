"""The pool's worker slots: `pool_size` long-lived workers (plus, per derived image for environments with declared
requirements, one more whenever all of that image's are busy, up to `pool_size`), launched, said hello to, replaced when they die, and loaded with environment versions (one
zygote per worker and version, evicted least recently used past `template_cache_mb`). `Pool` (pool.py) adds sessions
on top."""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import logging
import random
from collections import OrderedDict
from typing import Any, Self

from arenaforge.environments.runtime.connection import Loaded, Overdue, WorkerConnection, WorkerGone
from arenaforge.environments.runtime.deps import Unavailable
from arenaforge.environments.runtime.engines import on_least_loaded_engine
from arenaforge.environments.runtime.errors import Overloaded, RequirementUnavailable, SpawnFailure
from arenaforge.environments.runtime.handles import Template, payload
from arenaforge.environments.runtime.transports import Launcher
from arenaforge.schemas.config import SandboxConfig
from arenaforge.schemas.errors import SandboxError
from arenaforge.schemas.models import Environment

log = logging.getLogger("arenaforge.sandbox")

GRACE_S = 5.0  # the worker enforces deadlines; the pool gives up on a reply this much later
LOAD_STRETCH = 4.0  # a request starved of CPU may take this many times its limit (time spent waiting is given back)
UID_SLOTS = 4096  # session uids per worker (each session runs as its own uid when the worker is root)
LAUNCH_ATTEMPTS = 3
TEMPLATE_MEMO = 32  # environments whose serialized payload the pool keeps (to load them on other workers)


class WorkerSlots:
    """The workers of a pool and the environment versions loaded on them; see the module docstring."""

    def __init__(self, cfg: SandboxConfig, launcher: Launcher) -> None:
        self.cfg = cfg
        self.launcher = launcher
        self.backend = launcher.backend
        self.workers: list[WorkerConnection | None] = [None] * cfg.pool_size
        self.images: list[str | None] = [None] * cfg.pool_size  # per slot: a derived image, or None: the pool's
        self._placements: dict[tuple[str, ...], asyncio.Task[tuple[str | None, str]]] = {}
        self._sem = asyncio.Semaphore(cfg.max_concurrency)
        self._uses = itertools.count(1)
        self._launching: dict[int, asyncio.Task[WorkerConnection]] = {}
        self._closed = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._templates: OrderedDict[str, Template] = OrderedDict()
        self.replaced = 0
        self.info: dict[str, Any] = {}

    # ---------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        await asyncio.gather(*(self._worker(i) for i in range(self.cfg.pool_size)))
        info = dict(next((w.info for w in self.workers if w is not None), {}))  # each worker measures its own
        self.info = {"backend": self.backend, **info}
        if self.launcher.capabilities.runs_on_host:
            if not info.get("namespaces"):
                log.warning("process sandbox: no private namespaces per session (needs root or user namespaces): "
                            "sessions share /tmp and the network namespace")
            if not info.get("setuid"):
                log.warning("process sandbox: not root, so sessions share one uid (weaker process and file isolation)")

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.shutdown()

    async def shutdown(self) -> None:
        """Stop every worker (their sessions die with them)."""
        if self._closed:
            return
        self._closed = True
        for task in self._launching.values():
            task.cancel()
        workers = [w for w in self.workers if w is not None]
        await asyncio.gather(*(w.kill("the pool shut down") for w in workers), return_exceptions=True)
        await self.launcher.close()

    def _limits(self) -> dict[str, Any]:
        cfg = self.cfg
        return {
            "memory_mb": cfg.memory_mb, "pids": cfg.pids, "cpu_s": cfg.session_cpu_s,
            "output_limit": cfg.output_limit_bytes, "state_limit": cfg.state_limit_bytes,
            "message_limit": cfg.message_limit_bytes, "session_cpu_share": cfg.session_cpu_share,
            "open_timeout_s": cfg.open_timeout_s, "scratch_root": self.launcher.scratch_root,
            "scratch_mb": cfg.scratch_mb, "scratch_files": cfg.scratch_files,
            "hide_paths": list(self.launcher.hide_paths), "load_stretch": LOAD_STRETCH,
            # random uid ranges keep workers (and pools) from sharing a uid, hence rlimits and kill(-1) sweeps
            "uid_base": random.randrange(100_000 // UID_SLOTS + 1, 2_000_000_000 // UID_SLOTS) * UID_SLOTS
            if self.launcher.can_setuid else 0,
            "uid_slots": UID_SLOTS,
            "unshare_net": not self.launcher.capabilities.isolates_network,
            "bind_shared": self.launcher.capabilities.runs_on_host,
            "spares": cfg.spare_sessions,
            "cgroups_wanted": (["memory", "pids"] + (["cpu"] if self.launcher.capabilities.session_cpu_groups else [])
                               + (["cpuset"] if cfg.busy_session_cores else []))
            if cfg.session_cgroups else [],
            "busy_session_cores": cfg.busy_session_cores,
        }

    async def _launch(self, index: int) -> WorkerConnection:
        last: Exception | None = None
        for attempt in range(LAUNCH_ATTEMPTS):
            transport = await self.launcher.launch(index, self.images[index])
            worker = WorkerConnection(transport, index)
            try:
                reply = await worker.request({"op": "hello", "limits": self._limits()}, timeout=60)
                worker.info = reply.get("info", {})
                worker.on_dead = self._on_worker_dead
                return worker
            except (Overdue, WorkerGone) as err:
                last = err
                await worker.kill("it failed its hello")
                log.warning("sandbox worker %s failed to start (attempt %d): %r", worker.name, attempt + 1, err)
        raise SandboxError(f"cannot start a sandbox worker on the {self.backend} backend: {last!r}")

    async def _worker(self, index: int) -> WorkerConnection:
        """The live worker in slot `index`, launching (once, shared) a replacement if needed."""
        current = self.workers[index]
        if current is not None and current.alive:
            return current
        if self._closed:
            raise SandboxError("the sandbox pool is shut down")
        task = self._launching.get(index)
        if task is None:
            if current is not None:
                self.replaced += 1
                self._background(self._retire(current))
            task = asyncio.get_running_loop().create_task(self._launch(index))
            self._launching[index] = task
            task.add_done_callback(lambda t, i=index: self._launched(i, t))
        return await asyncio.shield(task)

    async def _retire(self, worker: WorkerConnection) -> None:
        await worker.settled()
        log.warning("replacing sandbox worker %s: %s", worker.name, worker.death)
        await worker.kill(worker.death)

    def _launched(self, index: int, task: asyncio.Task[WorkerConnection]) -> None:
        self._launching.pop(index, None)
        if not task.cancelled() and task.exception() is None:
            self.workers[index] = task.result()

    async def _pick_worker(self, key: str, image: str | None = None) -> WorkerConnection:
        slots = [i for i, slot_image in enumerate(self.images) if slot_image == image]
        if not slots:  # the first session of a derived image: one worker of its own, kept like the others
            self.workers.append(None)
            self.images.append(image)
            slots = [len(self.workers) - 1]
        live = on_least_loaded_engine([w for w in (self.workers[i] for i in slots) if w is not None and w.alive])
        if image is not None and live and len(slots) < self.cfg.pool_size and min(len(w.sessions) for w in live):
            # a derived image's sessions spread like the pool's own: while every worker of it is busy, one more (up
            # to pool_size) starts in the background; this session goes to the least busy meanwhile
            self.workers.append(None)
            self.images.append(image)
            self._background(self._replace_quietly(len(self.workers) - 1))
        if live:  # the least busy, preferring one that has the environment loaded already
            return min(live, key=lambda w: (len(w.sessions) + (0 if key in w.loaded else 2), w.index))
        dead = [i for i in slots if self.workers[i] is None or not self.workers[i].alive]
        return await self._worker(dead[0])

    def _on_worker_dead(self, worker: WorkerConnection) -> None:
        """A worker died (crash, OOM kill, container removed): start its replacement right away."""
        if not self._closed and self.workers[worker.index] is worker:
            self._background(self._replace_quietly(worker.index))

    def _background(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)  # keep a reference: the loop holds tasks only weakly
        task.add_done_callback(self._tasks.discard)

    async def _replace_quietly(self, index: int) -> None:
        try:
            await self._worker(index)
        except (SandboxError, asyncio.CancelledError):
            pass

    # ---------------------------------------------------------------- templates
    def template(self, env: Environment, placement: tuple[str | None, str | None] = (None, None)) -> Template:
        """The environment's payload and content address, serialized once per environment object; `placement`:
        where its declared requirements are (`place`)."""
        hit = self._templates.get(env.id)
        if hit is not None and hit.env is env:
            self._templates.move_to_end(env.id)
            return hit
        # key order kept: tool code iterates its state's dicts (BFCL's file system lists a directory in its order)
        blob = json.dumps(payload(env, placement[1]), ensure_ascii=False, separators=(",", ":")).encode()
        made = Template(hashlib.sha256(blob).hexdigest(), blob, env, placement[0])
        self._templates[env.id] = made
        while len(self._templates) > TEMPLATE_MEMO:
            self._templates.popitem(last=False)
        return made

    async def _load(self, worker: WorkerConnection, template: Template) -> Loaded:
        """Make sure `worker` has a zygote for `template` (one load per worker and version, shared by waiters)."""
        loaded = worker.loaded.get(template.key)
        if loaded is None:
            loaded = worker.loaded[template.key] = Loaded(asyncio.get_running_loop().create_future())
            loaded.ready.add_done_callback(_retrieved)
            self._background(self._send_load(worker, template, loaded))
        loaded.last_used = next(self._uses)
        await asyncio.shield(loaded.ready)
        return loaded

    async def _send_load(self, worker: WorkerConnection, template: Template, loaded: Loaded) -> None:
        deadline = max(60.0, self._open_deadline())
        try:
            reply = await worker.request({"op": "load", "key": template.key}, timeout=deadline, body=template.blob)
        except (Overdue, WorkerGone) as err:
            failure: Exception = err if isinstance(err, WorkerGone) else Overloaded(f"{worker.name} loaded nothing in {deadline:g} s")
            if isinstance(err, Overdue):
                self._background(worker.probe(self.cfg.worker_stall_s))
        else:
            if reply.get("ok"):
                loaded.rss_kb = int(reply.get("rss_kb") or 0)
                if not loaded.ready.done():
                    loaded.ready.set_result(None)
                self._evict(worker)
                return
            failure = SpawnFailure(f"the worker could not load the environment: {reply.get('error')}")
        if worker.loaded.get(template.key) is loaded:
            del worker.loaded[template.key]
        if not loaded.ready.done():
            loaded.ready.set_exception(failure)

    def _evict(self, worker: WorkerConnection) -> None:
        """Unload the least recently used unused versions while the worker's zygotes exceed their budget."""
        budget_kb = self.cfg.template_cache_mb * 1024
        idle = sorted((v.last_used, k) for k, v in worker.loaded.items() if v.sessions == 0 and v.ready.done())
        total = sum(v.rss_kb for v in worker.loaded.values())
        for _, key in idle:
            if total <= budget_kb:
                break
            total -= worker.loaded.pop(key).rss_kb
            self._background(self._quiet(worker, {"op": "unload", "key": key}))

    async def _quiet(self, worker: WorkerConnection, msg: dict[str, Any]) -> None:
        try:
            await worker.request(msg, timeout=GRACE_S + 10)
        except (Overdue, WorkerGone):
            pass

    def _open_deadline(self) -> float:
        return self.cfg.open_timeout_s * LOAD_STRETCH + GRACE_S

    # ---------------------------------------------------------------- placement
    async def place(self, env: Environment) -> tuple[str | None, str]:
        """(derived image or None, directory) of `env`'s declared requirements, installed once per set and pool
        (`runtime.deps`). Raises RequirementUnavailable naming a requirement no wheel satisfies."""
        wanted = tuple(sorted(env.requirements))
        task = self._placements.get(wanted)
        if task is None:
            task = self._placements[wanted] = asyncio.get_running_loop().create_task(self.launcher.place(list(wanted)))
            task.add_done_callback(_retrieved)
        try:
            return await asyncio.shield(task)
        except Unavailable as err:
            raise RequirementUnavailable(env.name, err.requirement, err.detail) from None


def _retrieved(future: asyncio.Future[Any]) -> None:
    """Mark a shared future's failure as read. Its waiters read it through `asyncio.shield`, but a waiter cancelled
    before it fails (a caller's own deadline) no longer does, and asyncio then logs "exception was never retrieved"
    for a failure every later waiter still gets."""
    if not future.cancelled():
        future.exception()
