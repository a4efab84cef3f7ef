"""Adaptive (AIMD) concurrency limit per endpoint, as NeMo Data Designer does it.

Slow start: +1 per success (the limit doubles every round) until the first 429, then additive
increase: +1/limit per success (about +1 per round of `limit` calls), up to `maximum`.
Multiplicative decrease: halve on every 429. So a healthy endpoint is driven to `maximum`
in-flight calls and a throttling one settles just under its real capacity.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator


class AdaptiveLimiter:
    def __init__(self, initial: int, maximum: int, minimum: int = 1) -> None:
        self.minimum = minimum
        self.maximum = max(maximum, minimum)
        self.limit = float(min(max(initial, minimum), self.maximum))
        self.in_flight = 0
        self.peak = 0
        self.slow_start = True
        self._cond: asyncio.Condition | None = None

    def _condition(self) -> asyncio.Condition:
        if self._cond is None:
            self._cond = asyncio.Condition()
        return self._cond

    @contextlib.asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        cond = self._condition()
        async with cond:
            await cond.wait_for(lambda: self.in_flight < int(self.limit))
            self.in_flight += 1
            self.peak = max(self.peak, self.in_flight)
        try:
            yield
        finally:
            async with cond:
                self.in_flight -= 1
                cond.notify(1)  # one slot freed: wake one waiter, not the whole queue

    def on_success(self) -> None:
        step = 1.0 if self.slow_start else 1.0 / self.limit
        grown = min(float(self.maximum), self.limit + step)
        if int(grown) > int(self.limit) and self._cond is not None:
            self._wake()
        self.limit = grown

    def on_rate_limited(self) -> None:
        self.slow_start = False
        self.limit = max(float(self.minimum), self.limit / 2)

    def _wake(self) -> None:
        cond = self._cond
        if cond is None:
            return

        async def _notify() -> None:
            async with cond:
                cond.notify(1)  # the limit grew by one slot

        with contextlib.suppress(RuntimeError):
            asyncio.get_running_loop().create_task(_notify())
