"""The warm pool: long-lived workers, many sessions per worker, an outcome for every call.

    async with await create_pool(cfg) as pool:
        session = await pool.open(env)
        obs = await pool.call(session, "get_order", {"order_id": "W1"})
        await pool.close(session)

A pool keeps `pool_size` workers (containers, or subprocesses on the process backend). An
environment version (its code, shape and initial state, content-addressed) is sent to a worker
once and parsed once there, by a zygote; every session of it is a process forked from that zygote,
a copy-on-write snapshot of the parsed state. A session's state persists across its calls and no
session can see another's. Calls of one session are serialised; calls of different sessions run in
parallel, capped by `max_concurrency`.

Whose fault it is decides how it surfaces:
  - the tool's (raises, loops, hogs memory, floods output, crashes): an observation (error, timeout,
    limit), and the session restarts from its initial state;
  - the agent's (unknown tool, bad or oversized arguments): an error observation;
  - the environment's (code that does not load): `EnvLoadError` at open;
  - the sandbox's (overloaded, a worker died, state lost, confinement failed): a typed
    `EnvironmentFailure`, never an observation charged to the agent (see `runtime.errors`);
  - misuse (a closed session, a pool shut down): `SandboxError`.
"""

from __future__ import annotations

import asyncio
import hashlib
import itertools
import json
import logging
import random
import time
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import ValidationError

from arenaforge.environments.runtime.connection import Loaded, Overdue, WorkerConnection, WorkerGone
from arenaforge.environments.runtime.errors import (
    FAILURES,
    EnvironmentFailure,
    EnvLoadError,
    Overloaded,
    SessionLost,
    SpawnFailure,
    UntrustedCodeRefused,
    WorkerLost,
)
from arenaforge.environments.runtime.worker.execution import STATE_TOOL
from arenaforge.environments.runtime.transports import (
    DockerLauncher,
    Launcher,
    ProcessLauncher,
    docker_engine_answers,
)
from arenaforge.schemas.config import SandboxConfig
from arenaforge.schemas.errors import SandboxError
from arenaforge.schemas.models import Environment, GoldCall, ToolObservation

log = logging.getLogger("arenaforge.sandbox")

GRACE_S = 5.0  # the worker enforces deadlines; the pool gives up on a reply this much later
LOAD_STRETCH = 4.0  # a request starved of CPU may take this many times its limit (time spent waiting is given back)
UID_SLOTS = 4096  # session uids per worker (each session runs as its own uid when the worker is root)
LAUNCH_ATTEMPTS = 3
TEMPLATE_MEMO = 32  # environments whose serialized payload the pool keeps (to load them on other workers)
OUTCOMES = ("ok", "no_output", "error", "timeout", "limit")
MODEL_FREE_BACKENDS = ("offline", "import")  # provenance backends whose code no model wrote


@dataclass(eq=False)
class Template:
    """An environment's payload as the workers load it: the bytes and their content address."""

    key: str
    blob: bytes
    env: Environment  # the object it was made from (the memo is keyed by env.id, checked by identity)


@dataclass(eq=False)
class Session:
    """One episode's handle: the environment, its worker and its serialising lock."""

    id: str
    env: Environment
    template: Template
    opened_at: float
    worker: WorkerConnection | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    closed: bool = False
    calls: int = 0
    resets: int = 0
    turn: int = 0  # the episode's turn (0-based): which tools of a format-2 environment the agent may call

    @property
    def tools(self) -> list[str]:
        return [t.name for t in self.env.tools]


def _payload(env: Environment) -> dict[str, Any]:
    payload = {"code": env.code, "style": env.style, "class_name": env.class_name, "data_var": env.data_var,
               "initial_state": env.initial_state, "tools": [t.name for t in env.tools]}
    if env.modules:  # format 2: each module in its own namespace (the key is absent for format 1: same address)
        payload["modules"] = [m.model_dump(mode="json") for m in env.modules]
    return payload


def model_written(env: Environment) -> bool:
    """Whether the environment's provenance says a model (not a person or the offline generator) wrote its code."""
    prov = env.provenance
    return prov is not None and prov.backend not in MODEL_FREE_BACKENDS


def _observation(reply: dict[str, Any], duration: float) -> ToolObservation:
    """The reply as an observation; a malformed one is an error observation, never an exception."""
    texts = {k: reply.get(k) for k in ("output", "error", "traceback")}
    if reply.get("outcome") not in OUTCOMES or not all(v is None or isinstance(v, str) for v in texts.values()):
        return ToolObservation(outcome="error", error=f"the sandbox sent an invalid reply (outcome {reply.get('outcome')!r})",
                               duration_s=duration)
    try:
        return ToolObservation(outcome=reply["outcome"], output=texts["output"] or "", error=texts["error"],
                               traceback=texts["traceback"], truncated=reply.get("truncated") is True, duration_s=duration)
    except ValidationError as err:
        return ToolObservation(outcome="error", error=f"the sandbox sent an invalid reply: {err.errors()[0]['msg']}",
                               duration_s=duration)


class Pool:
    """Warm workers running tool code; see the module docstring."""

    def __init__(self, cfg: SandboxConfig, launcher: Launcher) -> None:
        self.cfg = cfg
        self.launcher = launcher
        self.backend = launcher.backend
        self.workers: list[WorkerConnection | None] = [None] * cfg.pool_size
        self._sem = asyncio.Semaphore(cfg.max_concurrency)
        self._sids = itertools.count(1)
        self._uses = itertools.count(1)
        self._launching: dict[int, asyncio.Task[WorkerConnection]] = {}
        self._closed = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._sessions: dict[str, Session] = {}
        self._templates: OrderedDict[str, Template] = OrderedDict()
        self.replaced = 0
        self.info: dict[str, Any] = {}

    # ---------------------------------------------------------------- lifecycle
    async def start(self) -> None:
        await asyncio.gather(*(self._worker(i) for i in range(self.cfg.pool_size)))
        info = dict(next((w.info for w in self.workers if w is not None), {}))
        if self.backend == "docker":
            info["net_isolated"] = True  # network_mode none
        self.info = {"backend": self.backend, **info}
        if self.backend == "process":
            if not info.get("namespaces"):
                log.warning("process sandbox: no private namespaces per session (needs root or user namespaces): "
                            "sessions share /tmp and the network namespace")
            if not info.get("setuid"):
                log.warning("process sandbox: not root, so sessions share one uid (weaker process and file isolation)")

    async def __aenter__(self) -> Pool:
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
            "output_limit": cfg.output_limit_bytes, "message_limit": cfg.message_limit_bytes,
            "open_timeout_s": cfg.open_timeout_s, "scratch_root": self.launcher.scratch_root,
            "scratch_mb": cfg.scratch_mb, "hide_paths": list(self.launcher.hide_paths), "load_stretch": LOAD_STRETCH,
            # random uid ranges keep workers (and pools) from sharing a uid, hence rlimits and kill(-1) sweeps
            "uid_base": random.randrange(100_000 // UID_SLOTS + 1, 2_000_000_000 // UID_SLOTS) * UID_SLOTS
            if self.launcher.can_setuid else 0,
            "uid_slots": UID_SLOTS,
            "unshare_net": self.backend == "process",
        }

    async def _launch(self, index: int) -> WorkerConnection:
        last: Exception | None = None
        for attempt in range(LAUNCH_ATTEMPTS):
            transport = await self.launcher.launch(index)
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
                log.warning("replacing sandbox worker %s: %s", current.name, current.death)
                self._background(current.kill(current.death))
            task = asyncio.get_running_loop().create_task(self._launch(index))
            self._launching[index] = task
            task.add_done_callback(lambda t, i=index: self._launched(i, t))
        return await asyncio.shield(task)

    def _launched(self, index: int, task: asyncio.Task[WorkerConnection]) -> None:
        self._launching.pop(index, None)
        if not task.cancelled() and task.exception() is None:
            self.workers[index] = task.result()

    async def _pick_worker(self, key: str) -> WorkerConnection:
        live = [w for w in self.workers if w is not None and w.alive]
        if live:  # the least busy, preferring one that has the environment loaded already
            return min(live, key=lambda w: (len(w.sessions) + (0 if key in w.loaded else 2), w.index))
        dead = [i for i, w in enumerate(self.workers) if w is None or not w.alive]
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
    def template(self, env: Environment) -> Template:
        """The environment's payload and content address, serialized once per environment object."""
        hit = self._templates.get(env.id)
        if hit is not None and hit.env is env:
            self._templates.move_to_end(env.id)
            return hit
        # key order kept: tool code iterates its state's dicts (BFCL's file system lists a directory in its order)
        blob = json.dumps(_payload(env), ensure_ascii=False, separators=(",", ":")).encode()
        made = Template(hashlib.sha256(blob).hexdigest(), blob, env)
        self._templates[env.id] = made
        while len(self._templates) > TEMPLATE_MEMO:
            self._templates.popitem(last=False)
        return made

    async def _load(self, worker: WorkerConnection, template: Template) -> Loaded:
        """Make sure `worker` has a zygote for `template` (one load per worker and version, shared by waiters)."""
        loaded = worker.loaded.get(template.key)
        if loaded is None:
            loaded = worker.loaded[template.key] = Loaded(asyncio.get_running_loop().create_future())
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

    # ---------------------------------------------------------------- sessions
    def _open_deadline(self) -> float:
        return self.cfg.open_timeout_s * LOAD_STRETCH + GRACE_S

    async def open(self, env: Environment) -> Session:
        """A fresh session of `env`: its code loaded, its initial state in place. Raises EnvLoadError."""
        if self._closed:
            raise SandboxError("the sandbox pool is shut down")
        if self.backend == "process" and not self.cfg.process_allows_model_code and model_written(env):
            raise UntrustedCodeRefused(
                f"environment {env.name!r} has model-written code and the process sandbox backend cannot isolate it "
                "well (docs/SANDBOX.md): start Docker (scripts/start-docker.sh) or set sandbox.process_allows_model_code")
        session = Session(id=f"s{next(self._sids)}", env=env, template=self.template(env), opened_at=time.monotonic())
        async with self._sem:
            await self._attach(session)
        self._sessions[session.id] = session
        return session

    async def _attach(self, session: Session) -> None:
        """Open `session` on a live worker, loading its template there first if needed."""
        key = session.template.key
        last: BaseException | None = None
        for _ in range(3):
            worker = await self._pick_worker(key)
            worker.sessions.add(session.id)  # counted at once, so concurrent opens spread over the workers
            try:
                loaded = await self._load(worker, session.template)
                reply = await worker.request({"op": "open", "sid": session.id, "key": key}, timeout=self._open_deadline())
            except EnvironmentFailure:
                worker.sessions.discard(session.id)
                raise
            except WorkerGone as err:
                worker.sessions.discard(session.id)
                last = err
                continue
            except Overdue:
                worker.sessions.discard(session.id)
                self._background(self._quiet(worker, {"op": "close", "sid": session.id}))
                self._background(worker.probe(self.cfg.worker_stall_s))
                raise Overloaded(f"{worker.name} did not open the session within {self._open_deadline():g} s") from None
            if reply.get("ok"):
                session.worker = worker
                loaded.sessions += 1
                return
            worker.sessions.discard(session.id)
            if reply.get("missing"):  # its zygote is gone (unloaded or crashed): load it again
                if worker.loaded.get(key) is loaded:
                    del worker.loaded[key]
                continue
            if reply.get("failure"):
                raise FAILURES.get(reply["failure"], EnvironmentFailure)(reply.get("error") or reply["failure"])
            raise EnvLoadError(session.env.name, reply.get("error") or "unknown error")
        raise WorkerLost(f"sandbox workers died while opening the environment: {last}")

    def _detach(self, session: Session) -> None:
        worker, session.worker = session.worker, None
        if worker is not None:
            worker.sessions.discard(session.id)
            loaded = worker.loaded.get(session.template.key)
            if loaded is not None:
                loaded.sessions = max(0, loaded.sessions - 1)

    async def call(
        self, session: Session, tool: str, args: dict[str, Any] | None = None, *, timeout_s: float | None = None
    ) -> ToolObservation:
        """Run one tool call in the session: an observation, or an EnvironmentFailure when the sandbox failed.

        A tool hidden at the session's `turn` (format 2 `tool_turns`) is unknown to the agent, as is the harness's
        state request: both are an `error` observation, and nothing runs."""
        visible = [t.name for t in session.env.visible_tools(session.turn)]
        if tool == STATE_TOOL or (session.env.tool_turns and tool in session.tools and tool not in visible):
            return ToolObservation(outcome="error", error=f"unknown tool {tool!r}; available: {', '.join(visible)}")
        return await self._call(session, tool, args, timeout_s=timeout_s)

    async def state(self, session: Session) -> Any:
        """The session's state, for the harness only (never an agent tool, never counted as a call): each namespace's
        public instance attributes or state global as JSON (`worker.execution.Tools.snapshot`). Raises SandboxError
        when the state could not be read or is larger than `output_limit_bytes`."""
        obs = await self._call(session, STATE_TOOL, {}, count=False)
        if obs.outcome != "ok" or obs.truncated:
            reason = "is larger than sandbox.output_limit_bytes" if obs.truncated else f"could not be read: {obs.error}"
            raise SandboxError(f"the state of session {session.id} ({session.env.name}) {reason}")
        return json.loads(obs.output)

    async def _call(self, session: Session, tool: str, args: dict[str, Any] | None = None, *,
                    timeout_s: float | None = None, count: bool = True) -> ToolObservation:
        if session.closed:
            raise SandboxError(f"session {session.id} is closed")
        if self._closed:
            raise SandboxError("the sandbox pool is shut down")
        started = time.monotonic()
        timeout = float(timeout_s or self.cfg.call_timeout_s)
        try:
            body = json.dumps(args or {}, ensure_ascii=False).encode()
        except (TypeError, ValueError) as err:
            return ToolObservation(outcome="error", error=f"TypeError: the arguments are not JSON: {err}")
        if len(body) > self.cfg.message_limit_bytes:
            return ToolObservation(outcome="error", error=f"the arguments are {len(body)} bytes; the sandbox accepts at "
                                   f"most {self.cfg.message_limit_bytes} (sandbox.message_limit_bytes)")
        async with session.lock:
            if started - session.opened_at > self.cfg.session_timeout_s:
                return ToolObservation(outcome="timeout", duration_s=time.monotonic() - started,
                                       error=f"the session exceeded its {self.cfg.session_timeout_s:g} s wall-clock limit")
            async with self._sem:
                worker = session.worker
                if worker is not None and not worker.alive:  # it died between calls: say so once, run nothing
                    self._detach(session)
                    session.resets += 1
                    raise SessionLost(f"the sandbox worker was replaced ({worker.death}); the session's state was "
                                      "lost and its next call starts from the initial state")
                if worker is None:
                    await self._attach(session)
                    worker = session.worker
                assert worker is not None
                msg = {"op": "call", "sid": session.id, "tool": tool, "timeout": timeout}
                deadline = (timeout + self.cfg.open_timeout_s) * LOAD_STRETCH + GRACE_S
                try:
                    reply = await worker.request(msg, timeout=deadline, body=body)
                except WorkerGone as err:
                    self._detach(session)
                    session.resets += 1
                    raise WorkerLost(f"the sandbox worker died during the call ({err}); the session restarts from "
                                     "its initial state") from None
                except Overdue:
                    self._detach(session)
                    session.resets += 1
                    self._background(self._quiet(worker, {"op": "close", "sid": session.id}))
                    self._background(worker.probe(self.cfg.worker_stall_s))
                    raise Overloaded(f"{worker.name} did not answer the call within {deadline:g} s; the session's "
                                     "state is discarded") from None
        if reply.get("failure"):
            session.resets += 1
            raise FAILURES.get(reply["failure"], EnvironmentFailure)(reply.get("error") or reply["failure"])
        session.calls += count
        return _observation(reply, time.monotonic() - started)

    async def close(self, session: Session) -> None:
        """End a session: its processes are killed and its private files removed."""
        if session.closed:
            return
        session.closed = True
        self._sessions.pop(session.id, None)
        worker = session.worker
        self._detach(session)
        if worker is None or not worker.alive:
            return
        async with session.lock:
            try:
                await worker.request({"op": "close", "sid": session.id}, timeout=GRACE_S + 10)
            except WorkerGone:
                pass
            except Overdue:
                self._background(worker.probe(self.cfg.worker_stall_s))

    async def ping(self) -> list[dict[str, Any]]:
        """Each live worker's self-report (pid, uid, sessions, templates, isolation)."""
        out = []
        for index in range(len(self.workers)):
            worker = await self._worker(index)
            try:
                reply = await worker.request({"op": "ping"}, timeout=10)
                out.append({"worker": worker.name, **reply.get("info", {})})
            except (WorkerGone, Overdue) as err:
                out.append({"worker": worker.name, "error": repr(err)})
        return out

    def stats(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "workers": sum(1 for w in self.workers if w is not None and w.alive),
            "sessions": len(self._sessions),
            "replaced": self.replaced,
            "templates": sum(len(w.loaded) for w in self.workers if w is not None and w.alive),
        }


LAUNCHERS = {"docker": DockerLauncher, "process": ProcessLauncher}


async def create_pool(cfg: SandboxConfig | None = None) -> Pool:
    """A started pool. backend auto: docker when an engine answers (and its image builds), else process (warned)."""
    cfg = cfg or SandboxConfig()
    backend = cfg.backend
    if backend == "auto":
        backend = "docker" if await asyncio.to_thread(docker_engine_answers) else "process"
        if backend == "process":
            log.warning(
                "no Docker engine answers: using the process sandbox backend (weaker isolation, docs/SANDBOX.md); "
                "run scripts/start-docker.sh for containers"
            )
    try:
        launcher = await _prepare(backend, cfg)
    except SandboxError as err:
        if cfg.backend != "auto" or backend != "docker":
            raise
        log.warning("the docker sandbox backend is unusable (%s): falling back to the process backend", err)
        launcher = await _prepare("process", cfg)
    pool = Pool(cfg, launcher)
    try:
        await pool.start()
    except BaseException:
        await pool.shutdown()
        raise
    return pool


async def _prepare(backend: str, cfg: SandboxConfig) -> Launcher:
    launcher = LAUNCHERS[backend](cfg)
    try:
        await launcher.prepare()
    except SandboxError:
        raise
    except Exception as err:  # noqa: BLE001 - the engine's own errors are translated at this boundary
        raise SandboxError(f"cannot prepare the {backend} sandbox backend: {err}") from err
    return launcher


async def run_calls(
    pool: Pool, env: Environment, calls: Sequence[GoldCall | tuple[str, dict[str, Any]] | dict[str, Any]]
) -> list[ToolObservation]:
    """Run `calls` in order in a fresh session of `env` (closed afterwards). Raises EnvLoadError if the code won't load."""
    return (await replay(pool, env, calls, read_state=False))[0]


async def replay(
    pool: Pool, env: Environment, calls: Sequence[GoldCall | tuple[str, dict[str, Any]] | dict[str, Any]],
    read_state: bool = True,
) -> tuple[list[ToolObservation], Any]:
    """Run `calls` in order in a fresh session of `env` with every tool visible (a replay is not an episode) and
    read the session's final state (`Pool.state`, None when `read_state` is false); the session is closed afterwards."""
    session = await pool.open(env)
    if env.tool_turns:
        session.turn = max(env.tool_turns.values())
    try:
        out = []
        for call in calls:
            if isinstance(call, GoldCall):
                tool, args = call.tool, call.arguments
            elif isinstance(call, tuple):
                tool, args = call
            else:
                tool, args = call["tool"], call.get("arguments", call.get("args", {}))
            out.append(await pool.call(session, tool, args))
        return out, (await pool.state(session) if read_state else None)
    finally:
        await pool.close(session)
