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

import itertools
import json
import time
from collections.abc import Sequence
from typing import Any

from arenaforge.environments.runtime.connection import Overdue, WorkerGone
from arenaforge.environments.runtime.errors import (
    FAILURES,
    EnvironmentFailure,
    EnvLoadError,
    Overloaded,
    SessionLost,
    UntrustedCodeRefused,
    WorkerLost,
)
from arenaforge.environments.runtime.handles import Session, model_written, observation
from arenaforge.environments.runtime.launchers import open_launcher
from arenaforge.environments.runtime.transports import Launcher
from arenaforge.environments.runtime.worker.execution import STATE_TOOL
from arenaforge.environments.runtime.workers import GRACE_S, LOAD_STRETCH, WorkerSlots
from arenaforge.schemas.config import SandboxConfig
from arenaforge.schemas.errors import SandboxError
from arenaforge.schemas.models import Environment, GoldCall, ToolObservation

__all__ = ["Pool", "Session", "create_pool", "model_written", "replay", "run_calls"]


class Pool(WorkerSlots):
    """Warm workers running tool code, and the sessions on them; see the module docstring."""

    def __init__(self, cfg: SandboxConfig, launcher: Launcher) -> None:
        super().__init__(cfg, launcher)
        self._sids = itertools.count(1)
        self._sessions: dict[str, Session] = {}

    # ---------------------------------------------------------------- sessions
    async def open(self, env: Environment) -> Session:
        """A fresh session of `env`: its code loaded, its initial state in place. Raises EnvLoadError."""
        if self._closed:
            raise SandboxError("the sandbox pool is shut down")
        if (not self.launcher.capabilities.isolates_model_code and not self.cfg.process_allows_model_code
                and model_written(env)):
            raise UntrustedCodeRefused(
                f"environment {env.name!r} has model-written code and the {self.backend} sandbox backend cannot "
                "isolate it well (docs/SANDBOX.md): start Docker (scripts/start-docker.sh) or set "
                "sandbox.process_allows_model_code")
        placement = await self.place(env) if env.requirements else (None, None)
        session = Session(id=f"s{next(self._sids)}", env=env, template=self.template(env, placement),
                          opened_at=time.monotonic())
        async with self._sem:
            await self._attach(session)
        self._sessions[session.id] = session
        return session

    async def _attach(self, session: Session) -> None:
        """Open `session` on a live worker, loading its template there first if needed."""
        key = session.template.key
        last: BaseException | None = None
        for _ in range(3):
            worker = await self._pick_worker(key, session.template.image)
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
        if tool == STATE_TOOL or (session.env.tool_turns and tool in session.tools):  # else nothing to hide: no list per call
            visible = [t.name for t in session.env.visible_tools(session.turn)]
            if tool == STATE_TOOL or tool not in visible:
                return ToolObservation(outcome="error", error=f"unknown tool {tool!r}; available: {', '.join(visible)}")
        return await self._call(session, tool, args, timeout_s=timeout_s)

    async def state(self, session: Session) -> Any:
        """The session's state, for the harness only (never an agent tool, never counted as a call): each namespace's
        public instance attributes or state global as JSON (`worker.execution.Tools.snapshot`). Raises SandboxError
        when the state could not be read or is larger than `state_limit_bytes`."""
        # its own limit, counted by the worker in CPU time only (`deadlines.RequestClock`): at 50 sessions on one
        # worker a ~4 MB state waited past its limit to be written out, and the late read reset the session
        timeout = max(self.cfg.state_timeout_s, self.cfg.call_timeout_s)
        obs = await self._call(session, STATE_TOOL, {}, timeout_s=timeout, count=False)
        if obs.outcome != "ok" or obs.truncated:
            reason = "is larger than sandbox.state_limit_bytes" if obs.truncated else f"could not be read: {obs.error}"
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
                    await worker.settled()  # (why it died: its exit status comes just after its output closed)
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
        return observation(reply, time.monotonic() - started)

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
            **({"engines": self.launcher.stats()} if hasattr(self.launcher, "stats") else {}),
        }


async def create_pool(cfg: SandboxConfig | None = None) -> Pool:
    """A started pool on the backend `cfg.backend` names (`launchers.open_launcher`: auto is docker when an engine
    answers, else process, warned)."""
    cfg = cfg or SandboxConfig()
    pool = Pool(cfg, await open_launcher(cfg))
    try:
        await pool.start()
    except BaseException:
        await pool.shutdown()
        raise
    return pool


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
