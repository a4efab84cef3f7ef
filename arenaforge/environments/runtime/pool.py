"""The warm pool: long-lived workers, many sessions per worker, every call ends in a ToolObservation.

    async with await create_pool(cfg) as pool:
        session = await pool.open(env)
        obs = await pool.call(session, "get_order", {"order_id": "W1"})
        await pool.close(session)

A pool keeps `pool_size` workers (containers, or subprocesses on the process backend). Each
worker is a fork server (`worker.py`) holding one child process per session, so a session's
state persists across its calls and no session can see another's. Calls of one session are
serialised; calls of different sessions run in parallel, capped by `max_concurrency`.

Failures are observations, never exceptions: a tool that raises, loops, hogs memory, floods
output, crashes or kills itself yields error/timeout/limit and the session restarts from its
initial state. A worker that dies or stops answering is replaced; sessions on it re-open on a
live worker at their next call. Exceptions are kept for misuse (a closed session, a pool shut
down) and for infrastructure that cannot work at all (`SandboxError`); code that fails to load
raises `EnvLoadError`, whose message carries the traceback.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from arenaforge.schemas.config import SandboxConfig
from arenaforge.schemas.errors import SandboxError
from arenaforge.schemas.models import Environment, GoldCall, ToolObservation

from arenaforge.environments.runtime.transports import (
    DockerLauncher,
    Launcher,
    ProcessLauncher,
    Transport,
    docker_engine_answers,
)

log = logging.getLogger("arenaforge.sandbox")

GRACE_S = 5.0  # the worker enforces call timeouts; the pool gives up on a worker this much later
UID_SLOTS = 4096  # session uids per worker (each session runs as its own uid when the worker is root)
LAUNCH_ATTEMPTS = 3


class EnvLoadError(SandboxError):
    """An environment's tool code could not be loaded (syntax error, import failure, missing class)."""

    def __init__(self, env_name: str, detail: str) -> None:
        super().__init__(f"environment {env_name!r}: tool code failed to load:\n{detail}")
        self.detail = detail


class _WorkerGone(Exception):
    pass


FLUSH_HIGH_WATER = 1 << 20
WATCH_TICK_S = 0.25


class _Worker:
    """Pool-side end of one worker: request ids, pending replies, liveness."""

    def __init__(self, transport: Transport, index: int) -> None:
        self.transport = transport
        self.index = index
        self.name = transport.name
        self.pending: dict[int, asyncio.Future[dict]] = {}
        self.ids = itertools.count(1)
        self.sessions: set[str] = set()
        self.alive = True
        self.death = ""
        self.info: dict[str, Any] = {}
        self.outbuf: list[bytes] = []
        self.flush_scheduled = False
        self.deadlines: dict[int, float] = {}
        self.on_dead: Callable[[_Worker], None] | None = None
        self.reader = asyncio.get_running_loop().create_task(self._read())
        self.watcher = asyncio.get_running_loop().create_task(self._watch())

    async def _read(self) -> None:
        why = "the worker closed its output"
        try:
            while True:
                line = await self.transport.readline()
                if not line:
                    break
                try:
                    msg = json.loads(line)
                except json.JSONDecodeError:
                    why = f"the worker sent a malformed reply: {line[:200]!r}"
                    break
                fut = self.pending.pop(msg.get("id"), None)
                if fut is not None and not fut.done():
                    fut.set_result(msg)
        except Exception as err:  # noqa: BLE001 - whatever broke the stream, the worker is unusable
            why = f"reading from the worker failed: {err!r}"
        self._mark_dead(why)

    def _mark_dead(self, why: str) -> None:
        if not self.alive:
            return
        self.alive = False
        self.death = why
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(_WorkerGone(why))
        self.pending.clear()
        if self.on_dead is not None:
            self.on_dead(self)

    async def request(self, msg: dict[str, Any], timeout: float) -> dict:
        if not self.alive:
            raise _WorkerGone(self.death)
        loop = asyncio.get_running_loop()
        rid = next(self.ids)
        msg["id"] = rid
        data = (json.dumps(msg, ensure_ascii=False) + "\n").encode()  # TypeError/ValueError: not JSON
        fut: asyncio.Future[dict] = loop.create_future()
        self.pending[rid] = fut
        self.deadlines[rid] = loop.time() + timeout
        # requests written in the same loop iteration go out as one write (fewer syscalls and engine frames)
        self.outbuf.append(data)
        if not self.flush_scheduled:
            self.flush_scheduled = True
            loop.call_soon(self._flush)
        try:
            if self.transport.buffered() > FLUSH_HIGH_WATER:
                await self.transport.drain()
            return await fut
        except (ConnectionError, OSError) as err:
            self._mark_dead(f"writing to the worker failed: {err!r}")
            raise _WorkerGone(self.death) from err
        finally:
            self.pending.pop(rid, None)
            self.deadlines.pop(rid, None)

    async def _watch(self) -> None:
        """Fail requests past their deadline (one sweep per tick is cheaper than a timer per call)."""
        loop = asyncio.get_running_loop()
        while self.alive:
            await asyncio.sleep(WATCH_TICK_S)
            now = loop.time()
            for rid, deadline in list(self.deadlines.items()):
                fut = self.pending.get(rid)
                if now > deadline and fut is not None and not fut.done():
                    fut.set_exception(asyncio.TimeoutError())

    def _flush(self) -> None:
        self.flush_scheduled = False
        if not self.outbuf or not self.alive:
            return
        data, self.outbuf = b"".join(self.outbuf), []
        try:
            self.transport.write(data)
        except (ConnectionError, OSError, RuntimeError) as err:
            self._mark_dead(f"writing to the worker failed: {err!r}")

    async def kill(self, why: str) -> None:
        self._mark_dead(why)
        self.reader.cancel()
        self.watcher.cancel()
        await self.transport.kill()


@dataclass(eq=False)
class Session:
    """One episode's handle: the environment, its worker and its serialising lock."""

    id: str
    env: Environment
    payload: dict[str, Any]
    opened_at: float
    worker: _Worker | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    closed: bool = False
    calls: int = 0
    resets: int = 0

    @property
    def tools(self) -> list[str]:
        return [t.name for t in self.env.tools]


def _payload(env: Environment) -> dict[str, Any]:
    return {
        "code": env.code,
        "style": env.style,
        "class_name": env.class_name,
        "data_var": env.data_var,
        "initial_state": env.initial_state,
        "tools": [t.name for t in env.tools],
    }


class Pool:
    """Warm workers running tool code; see the module docstring."""

    def __init__(self, cfg: SandboxConfig, launcher: Launcher) -> None:
        self.cfg = cfg
        self.launcher = launcher
        self.backend = launcher.backend
        self.workers: list[_Worker | None] = [None] * cfg.pool_size
        self._sem = asyncio.Semaphore(cfg.max_concurrency)
        self._sids = itertools.count(1)
        self._launching: dict[int, asyncio.Task[_Worker]] = {}
        self._closed = False
        self._tasks: set[asyncio.Task[Any]] = set()
        self._sessions: dict[str, Session] = {}
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
            if not info.get("net_isolated"):
                log.warning("process sandbox: no private network namespace (unshare not permitted); tools can reach the network")
            if not info.get("setuid"):
                log.warning("process sandbox: not root, so sessions share one uid (weaker process and file isolation)")

    async def __aenter__(self) -> "Pool":
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
            "memory_mb": cfg.memory_mb,
            "pids": cfg.pids,
            "cpu_s": cfg.session_cpu_s,
            "output_limit": cfg.output_limit_bytes,
            "open_timeout_s": cfg.open_timeout_s,
            "scratch_root": self.launcher.scratch_root,
            # random uid ranges keep workers (and pools) from sharing a uid, hence rlimits and kill(-1) sweeps
            "uid_base": random.randrange(100_000 // UID_SLOTS + 1, 2_000_000_000 // UID_SLOTS) * UID_SLOTS
            if self.launcher.can_setuid
            else 0,
            "uid_slots": UID_SLOTS,
            "unshare_net": self.backend == "process",
        }

    async def _launch(self, index: int) -> _Worker:
        last: Exception | None = None
        for attempt in range(LAUNCH_ATTEMPTS):
            transport = await self.launcher.launch(index)
            worker = _Worker(transport, index)
            try:
                reply = await worker.request({"op": "hello", "limits": self._limits()}, timeout=30)
                worker.info = reply.get("info", {})
                worker.on_dead = self._on_worker_dead
                return worker
            except (asyncio.TimeoutError, _WorkerGone) as err:
                last = err
                await worker.kill("it failed its hello")
                log.warning("sandbox worker %s failed to start (attempt %d): %r", worker.name, attempt + 1, err)
        raise SandboxError(f"cannot start a sandbox worker on the {self.backend} backend: {last!r}")

    async def _worker(self, index: int) -> _Worker:
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

    def _launched(self, index: int, task: asyncio.Task[_Worker]) -> None:
        self._launching.pop(index, None)
        if not task.cancelled() and task.exception() is None:
            self.workers[index] = task.result()

    async def _pick_worker(self) -> _Worker:
        live = [w for w in self.workers if w is not None and w.alive]
        if live:
            return min(live, key=lambda w: (len(w.sessions), w.index))
        dead = [i for i, w in enumerate(self.workers) if w is None or not w.alive]
        return await self._worker(dead[0])

    def _on_worker_dead(self, worker: _Worker) -> None:
        """A worker died (crash, OOM kill, container removed): start its replacement right away."""
        if not self._closed and self.workers[worker.index] is worker:
            self._background(self._replace_quietly(worker.index))

    def _background(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)  # keep a reference: the loop holds tasks only weakly
        task.add_done_callback(self._tasks.discard)

    async def _retire(self, worker: _Worker, why: str) -> None:
        if worker.alive:
            log.warning("killing sandbox worker %s: %s", worker.name, why)
            await worker.kill(why)

    async def _replace_quietly(self, index: int) -> None:
        try:
            await self._worker(index)
        except (SandboxError, asyncio.CancelledError):
            pass

    # ---------------------------------------------------------------- sessions
    async def open(self, env: Environment) -> Session:
        """A fresh session of `env`: its code loaded, its initial state in place. Raises EnvLoadError."""
        if self._closed:
            raise SandboxError("the sandbox pool is shut down")
        session = Session(id=f"s{next(self._sids)}", env=env, payload=_payload(env), opened_at=time.monotonic())
        async with self._sem:
            await self._attach(session)
        self._sessions[session.id] = session
        return session

    async def _attach(self, session: Session) -> None:
        """Open `session` on a live worker, retrying once elsewhere if that worker dies meanwhile."""
        for _ in range(2):
            worker = await self._pick_worker()
            worker.sessions.add(session.id)
            session.worker = worker
            try:
                reply = await worker.request(
                    {"op": "open", "sid": session.id, "env": session.payload}, timeout=self.cfg.open_timeout_s + GRACE_S
                )
            except _WorkerGone:
                worker.sessions.discard(session.id)
                continue
            except asyncio.TimeoutError:
                worker.sessions.discard(session.id)
                await self._retire(worker, "it stopped answering while loading tool code")
                continue
            if not reply.get("ok"):
                worker.sessions.discard(session.id)
                session.worker = None
                raise EnvLoadError(session.env.name, reply.get("error") or "unknown error")
            return
        raise SandboxError("sandbox workers died while loading the environment")

    async def call(
        self, session: Session, tool: str, args: dict[str, Any] | None = None, *, timeout_s: float | None = None
    ) -> ToolObservation:
        """Run one tool call in the session; always returns an observation."""
        if session.closed:
            raise SandboxError(f"session {session.id} is closed")
        if self._closed:
            raise SandboxError("the sandbox pool is shut down")
        started = time.monotonic()
        timeout = float(timeout_s or self.cfg.call_timeout_s)
        async with session.lock:
            if started - session.opened_at > self.cfg.session_timeout_s:
                return ToolObservation(
                    outcome="timeout",
                    error=f"the session exceeded its {self.cfg.session_timeout_s:g} s wall-clock limit",
                    duration_s=time.monotonic() - started,
                )
            async with self._sem:
                note = ""
                worker = session.worker
                if worker is None or not worker.alive:
                    if worker is not None:
                        worker.sessions.discard(session.id)
                        note = f"\n(note: the sandbox worker was replaced: {worker.death}; session state was reset)"
                    try:
                        await self._attach(session)
                    except EnvLoadError as err:
                        return ToolObservation(outcome="error", error=err.detail, duration_s=time.monotonic() - started)
                    session.resets += 1
                    worker = session.worker
                assert worker is not None
                msg = {"op": "call", "sid": session.id, "tool": tool, "args": args or {}, "timeout": timeout}
                try:
                    reply = await worker.request(msg, timeout=timeout + GRACE_S + self.cfg.open_timeout_s)
                except (TypeError, ValueError) as err:
                    return ToolObservation(outcome="error", error=f"TypeError: arguments are not JSON: {err}")
                except _WorkerGone as err:
                    session.resets += 1
                    return ToolObservation(
                        outcome="limit",
                        error=f"the sandbox worker died during the call ({err}); the session restarts from its initial state",
                        duration_s=time.monotonic() - started,
                    )
                except asyncio.TimeoutError:
                    await self._retire(worker, "it stopped answering")
                    session.resets += 1
                    return ToolObservation(
                        outcome="timeout",
                        error=f"the call exceeded its {timeout:g} s limit and its worker stopped answering; "
                        "the session restarts from its initial state",
                        duration_s=time.monotonic() - started,
                    )
        session.calls += 1
        error = reply.get("error")
        if reply.get("reset"):
            session.resets += 1
            note += f"\n(note: {reply['reset']})"
        if note:
            error = (error or "") + note if reply.get("outcome") != "ok" else error
        return ToolObservation(
            outcome=reply.get("outcome", "error"),
            output=reply.get("output") or "",
            error=error,
            truncated=bool(reply.get("truncated")),
            duration_s=time.monotonic() - started,
        )

    async def close(self, session: Session) -> None:
        """End a session: its processes are killed and its scratch directory removed."""
        if session.closed:
            return
        session.closed = True
        self._sessions.pop(session.id, None)
        worker = session.worker
        session.worker = None
        if worker is None or not worker.alive:
            return
        worker.sessions.discard(session.id)
        async with session.lock:
            try:
                await worker.request({"op": "close", "sid": session.id}, timeout=GRACE_S + 10)
            except _WorkerGone:
                pass
            except asyncio.TimeoutError:
                await self._retire(worker, "it stopped answering a close")

    async def ping(self) -> list[dict[str, Any]]:
        """Each live worker's self-report (pid, uid, sessions, network isolation)."""
        out = []
        for index in range(len(self.workers)):
            worker = await self._worker(index)
            try:
                reply = await worker.request({"op": "ping"}, timeout=10)
                out.append({"worker": worker.name, **reply.get("info", {})})
            except (_WorkerGone, asyncio.TimeoutError) as err:
                out.append({"worker": worker.name, "error": repr(err)})
        return out

    def stats(self) -> dict[str, Any]:
        return {
            "backend": self.backend,
            "workers": sum(1 for w in self.workers if w is not None and w.alive),
            "sessions": len(self._sessions),
            "replaced": self.replaced,
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
                "no Docker engine answers: using the process sandbox backend (rlimits and namespaces, weaker isolation); "
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
    session = await pool.open(env)
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
        return out
    finally:
        await pool.close(session)

