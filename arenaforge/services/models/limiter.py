"""Adaptive (AIMD) concurrency limit per endpoint, as NeMo Data Designer does it.

Slow start: +1 per success (the limit doubles every round) until the first 429, then additive
increase: +1/limit per success (about +1 per round of `limit` calls), up to `maximum`.
Multiplicative decrease: halve on every 429. So a healthy endpoint is driven to `maximum`
in-flight calls and a throttling one settles just under its real capacity.

Waiters are served by priority, then first come, first served. A pipeline raises the priority of a
work item's later stages (`with request_priority(2): ...` in the task that runs them; tasks it starts
inherit it), so those requests overtake new work's first requests instead of queueing behind them;
further levels order work within a stage (`request_priority(2, -position)`: the earlier item first).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import heapq
import itertools
from collections.abc import AsyncIterator, Iterator

_PRIORITY: contextvars.ContextVar[tuple[int, ...]] = contextvars.ContextVar("request_priority", default=(0,))


@contextlib.contextmanager
def request_priority(*levels: int) -> Iterator[None]:
    """Requests sent in this context (and tasks started from it) wait for a slot at `levels`, compared in turn:
    higher first (e.g. `(stage, -position)`: later stages first, and within a stage the earlier work item)."""
    token = _PRIORITY.set(levels)
    try:
        yield
    finally:
        _PRIORITY.reset(token)


class AdaptiveLimiter:
    """In-flight cap for one endpoint within one event loop.

    A freed slot is handed straight to the first waiter (highest priority, then oldest; its future resolves with the slot
    already counted), so under load a slot costs one loop pass to reuse, not the three a
    Condition's notify, lock re-acquire and predicate check take; at 128 calls in flight that
    gap was about a tenth of every slot's time.
    """

    def __init__(self, initial: int, maximum: int, minimum: int = 1) -> None:
        self.minimum = minimum
        self.maximum = max(maximum, minimum)
        self.limit = float(min(max(initial, minimum), self.maximum))
        self.in_flight = 0
        self.peak = 0
        self.slow_start = True
        self._waiters: list[tuple[tuple[int, ...], int, asyncio.Future[None]]] = []  # heap: (-levels, arrival, future)
        self._arrivals = itertools.count()

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        await self._acquire()
        try:
            yield
        finally:
            self.in_flight -= 1
            self._grant()

    async def _acquire(self) -> None:
        if not self._waiters and self.in_flight < int(self.limit):
            self._take()
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = (tuple(-level for level in _PRIORITY.get()), next(self._arrivals), waiter)
        heapq.heappush(self._waiters, entry)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():  # granted, then cancelled: give the slot back
                self.in_flight -= 1
                self._grant()
            elif entry in self._waiters:  # rare: leave the queue (a linear scan, then the heap rebuilt)
                self._waiters.remove(entry)
                heapq.heapify(self._waiters)
            raise

    def _take(self) -> None:
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)

    def _grant(self) -> None:
        """Hand free slots to waiters, highest priority first, then oldest."""
        while self._waiters and self.in_flight < int(self.limit):
            waiter = heapq.heappop(self._waiters)[2]
            if not waiter.done():
                self._take()
                waiter.set_result(None)

    def on_success(self) -> None:
        step = 1.0 if self.slow_start else 1.0 / self.limit
        self.limit = min(float(self.maximum), self.limit + step)
        self._grant()  # the limit may have grown by a slot

    def on_rate_limited(self) -> None:
        self.slow_start = False
        self.limit = max(float(self.minimum), self.limit / 2)
