"""Warehouse writes of the streaming envs pipeline: records upserted in batches at a steady cadence.

Stages `add()` records as each QA moves on; one background task upserts whatever has queued every
`interval_s` (sooner once `max_batch` wait), one commit at a time, off the event loop. A DuckLake commit
costs ~30-100 ms and writers take turns through one lock, so one commit per record would stall the run;
one per interval keeps a killed run's loss to the records not yet flushed, which a re-run (content ids)
writes again exactly once.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any

from arenaforge.warehouse.db import Warehouse


class RecordWriter:
    """Batched, cadenced `Warehouse.upsert` of records; use as `async with RecordWriter(wh) as writer`."""

    def __init__(self, wh: Warehouse, interval_s: float = 1.0, max_batch: int = 2000) -> None:
        self.wh = wh
        self.interval_s = interval_s
        self.max_batch = max_batch
        self.pending: list[Any] = []
        self.commits = 0
        self.written = 0
        self._wake = asyncio.Event()
        self._closing = False
        self._task: asyncio.Task[None] | None = None

    def add(self, records: list[Any]) -> None:
        self.pending.extend(records)
        if len(self.pending) >= self.max_batch:
            self._wake.set()

    async def __aenter__(self) -> RecordWriter:
        self._task = asyncio.create_task(self._loop())
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._closing = True
        self._wake.set()
        if self._task is not None:
            if exc[0] is not None:  # a failed run still commits what it has, then re-raises its own error
                with contextlib.suppress(Exception):
                    await self._task
            else:
                await self._task

    async def _loop(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self.interval_s)
            self._wake.clear()
            await self._flush()
            if self._closing and not self.pending:
                return

    async def _flush(self) -> None:
        if not self.pending:
            return
        batch, self.pending = self.pending, []
        await asyncio.to_thread(self.wh.upsert, batch)
        self.commits += 1
        self.written += len(batch)
