"""The pool's end of one worker: request ids, replies, deadlines, and whether the worker still lives.

A request whose reply does not come by its deadline fails with `Overdue`, and only that request:
a late reply is not a dead worker. The worker is declared dead only when its transport ends (the
process or container stopped) or when it answers no `ping` for `stall_s` seconds after an overrun
(`probe`): then every request still in flight fails with `WorkerGone`.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from arenaforge.environments.runtime import placement
from arenaforge.environments.runtime.transports import Transport

log = logging.getLogger("arenaforge.sandbox")

FLUSH_HIGH_WATER = 1 << 20
WATCH_TICK_S = 0.25


class WorkerGone(Exception):
    """The worker's process or container stopped (or stopped answering altogether)."""


class Overdue(Exception):
    """No reply by the request's deadline (the worker may still be alive: see `WorkerConnection.probe`)."""


@dataclass
class Loaded:
    """One environment version loaded on a worker: its zygote's readiness and how many sessions use it."""

    ready: asyncio.Future[None]
    sessions: int = 0
    rss_kb: int = 0
    last_used: int = 0


class WorkerConnection:
    def __init__(self, transport: Transport, index: int) -> None:
        self.transport = transport
        self.index = index
        self.name = transport.name
        self.pending: dict[int, asyncio.Future[dict]] = {}
        self.deadlines: dict[int, float] = {}
        self.ids = itertools.count(1)
        self.sessions: set[str] = set()
        self.loaded: dict[str, Loaded] = {}  # template key -> its zygote on this worker
        self.alive = True
        self.finished = False  # mark_dead ran: requests in flight were failed
        self.death = ""
        self.probing = False
        self.info: dict[str, Any] = {}
        self.outbuf: list[bytes] = []
        self.flush_scheduled = False
        self.on_dead: Callable[[WorkerConnection], None] | None = None
        loop = asyncio.get_running_loop()
        self.reader = loop.create_task(self._read())
        self.watcher = loop.create_task(self._watch())

    async def _read(self) -> None:
        why = "the worker closed its output"
        try:
            while True:
                line = await self.transport.readline()
                if not line:
                    break
                try:
                    msg = json.loads(line)
                except ValueError:
                    why = f"the worker sent a malformed reply: {line[:200]!r}"
                    break
                if isinstance(msg, dict) and "calm" in msg and "id" not in msg:
                    self._keep_calm(msg["calm"])
                    continue
                fut = self.pending.pop(msg.get("id"), None) if isinstance(msg, dict) else None
                if fut is not None and not fut.done():
                    fut.set_result(msg)
        except Exception as err:  # noqa: BLE001 - whatever broke the stream, the worker is unusable
            why = f"reading from the worker failed: {err!r}"
        if self.alive:
            # dead for new requests at once; those in flight fail once its exit status says why (`settled`)
            self.alive, self.death = False, why
            ended = await self.transport.ended()
            why = f"{why} ({ended})" if ended else why
        self.mark_dead(why)

    def _keep_calm(self, cores: object) -> None:
        """The worker runs its sessions that are not pinned off a busy one's cores: this process's thread keeps to
        the same cores (`placement`), where they are this host's."""
        if getattr(self.transport, "shares_host_cores", False) and isinstance(cores, list) \
                and all(isinstance(core, int) for core in cores):
            placement.keep_calm(self, cores)

    async def settled(self) -> None:
        """Once a dead worker's death is known in full (its exit status, read right after its output closed)."""
        if not self.finished and not self.reader.done():
            await asyncio.shield(self.reader)

    def mark_dead(self, why: str) -> None:
        if self.finished:
            return
        self.finished = True
        self.alive = False
        self.death = why
        placement.forget(self)
        for fut in self.pending.values():
            if not fut.done():
                fut.set_exception(WorkerGone(why))
        self.pending.clear()
        for loaded in self.loaded.values():
            if not loaded.ready.done():
                loaded.ready.set_exception(WorkerGone(why))
                loaded.ready.exception()  # retrieved: nobody may be waiting on it
        if self.on_dead is not None:
            self.on_dead(self)

    async def request(self, msg: dict[str, Any], timeout: float, body: bytes | None = None) -> dict:
        """Send `msg` (and `body`, raw bytes after the header); its reply, or WorkerGone / Overdue."""
        if not self.alive:
            raise WorkerGone(self.death)
        loop = asyncio.get_running_loop()
        rid = next(self.ids)
        msg["id"] = rid
        if body is not None:
            msg["body"] = len(body)
        data = (json.dumps(msg) + "\n").encode()  # headers are small: ASCII-escaped, anything a caller passes encodes
        fut: asyncio.Future[dict] = loop.create_future()
        self.pending[rid] = fut
        self.deadlines[rid] = loop.time() + timeout
        # requests written in the same loop iteration go out as one write (fewer syscalls and engine frames)
        self.outbuf.append(data if body is None else data + body)
        if not self.flush_scheduled:
            self.flush_scheduled = True
            loop.call_soon(self._flush)
        try:
            if self.transport.buffered() > FLUSH_HIGH_WATER:
                try:
                    await self.transport.drain()
                except (ConnectionError, OSError) as err:  # only the write path: a deadline is not an OSError here
                    self.mark_dead(f"writing to the worker failed: {err!r}")
            return await fut
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
                    fut.set_exception(Overdue("no reply by its deadline"))

    def _flush(self) -> None:
        self.flush_scheduled = False
        if not self.outbuf or not self.alive:
            return
        data, self.outbuf = b"".join(self.outbuf), []
        try:
            self.transport.write(data)
        except (ConnectionError, OSError, RuntimeError) as err:
            self.mark_dead(f"writing to the worker failed: {err!r}")

    async def probe(self, stall_s: float) -> None:
        """After an overrun: is the worker merely slow, or stopped? Only one that answers no ping is replaced."""
        if self.probing or not self.alive:
            return
        self.probing = True
        try:
            await self.request({"op": "ping"}, timeout=stall_s)
        except Overdue:
            log.warning("sandbox worker %s answered no ping for %.0f s: replacing it", self.name, stall_s)
            await self.kill(f"it answered nothing for {stall_s:g} s")
        except WorkerGone:
            pass
        finally:
            self.probing = False

    async def kill(self, why: str) -> None:
        self.mark_dead(why)
        self.reader.cancel()
        self.watcher.cancel()
        await self.transport.kill()
