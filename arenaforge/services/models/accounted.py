"""The warehouse cache and usage ledger around any model that sends requests.

`Accounted(sender, wh, run_id)` is the ChatModel a run gets for an HTTP provider, whether the sender is
one endpoint (`providers/openai_compatible.py`) or a pool of them (`endpoint_pool.py`): a request
answered before is served from `llm_cache` without a call, and every request, whatever became of it,
has one `llm_calls` row with its cost class (`sent`, `cached` or `failed`). Keeping this in one place
means a pool books one row per request however often it was re-sent, exactly as one endpoint does.
"""

from __future__ import annotations

import time
from typing import Any, Protocol

from arenaforge.schemas.errors import ProviderError
from arenaforge.services.models.base import ChatRequest, ChatResponse
from arenaforge.services.models.cache import ResponseCache, UsageLedger
from arenaforge.warehouse.db import Warehouse


class Sender(Protocol):
    name: str
    kind: str
    decides_by: str

    async def complete(self, request: ChatRequest) -> ChatResponse: ...
    async def aclose(self) -> None: ...


class Accounted:
    """ChatModel: `sender`'s answers, cached in and booked to the warehouse (see module docstring)."""

    def __init__(self, sender: Sender, wh: Warehouse | None, run_id: str | None, cache: bool = True) -> None:
        self.sender = sender
        self.name, self.kind, self.decides_by = sender.name, sender.kind, sender.decides_by
        self.cache = ResponseCache(wh, sender.name) if (wh is not None and cache) else None
        self.ledger = UsageLedger(wh, run_id) if wh is not None else None

    def __getattr__(self, attribute: str) -> Any:
        """What is the sender's (its limiter, negotiated modes, pool stats) is read from it."""
        if attribute == "sender":  # not set yet (e.g. while unpickling): no recursion
            raise AttributeError(attribute)
        return getattr(self.sender, attribute)

    async def complete(self, request: ChatRequest) -> ChatResponse:
        key = request.cache_key(self.name)
        started = time.perf_counter()
        if self.cache is not None:
            hit = self.cache.get(key)
            if hit is not None:
                self._book(key, request, hit, started, "cached")
                return hit
        try:
            response = await self.sender.complete(request)
        except ProviderError as err:
            self._book(key, request, None, started, "failed", err)
            raise
        if self.cache is not None:
            self.cache.put(key, request.model_dump(mode="json"), response)
        self._book(key, request, response, started, "sent")
        return response

    def _book(self, key: str, request: ChatRequest, response: ChatResponse | None, started: float,
              cost_class: str, err: ProviderError | None = None) -> None:
        if self.ledger is not None:
            self.ledger.record(key, request.step, self.name, response, time.perf_counter() - started, cost_class,
                               error=err)

    def close(self) -> None:
        """Flush the cache and usage rows to the warehouse (blocks until they are written)."""
        for writer in (self.cache, self.ledger):
            if writer is not None:
                writer.close()

    async def aclose(self) -> None:
        await self.sender.aclose()
