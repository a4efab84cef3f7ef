"""Several OpenAI-compatible endpoints serving one model (`model.endpoints`), used as one ChatModel.

Routing: each request goes to the healthy endpoint with the fewest outstanding requests (sent or
queued for one of its concurrency slots) relative to its adaptive limit, ties taken in turn. Each
endpoint is a member client (`providers/openai_compatible.py`) with its own AIMD limit (halved on
429/503, grown on success), negotiated formats and retries of 429/5xx; a connection error or timeout
ends a member's request at once, so the pool decides what happens next.

Health: a request that fails for a connection error or a timeout ejects its endpoint (passive check)
and is re-sent to another healthy endpoint exactly once; it fails only if that one fails too. An
ejected endpoint is checked with GET /models `health_interval_s` after it failed, then at doubling
intervals up to `backoff_max_s`, and takes requests again as soon as a check passes. When every
endpoint is ejected, a request checks them all at once and goes to the first that answers.

Accounting and the response cache wrap the whole pool (`accounted.py`), not its members: one
`llm_calls` row per request whichever endpoint answered and however often it was re-sent, so records
and usage rows are the same as with one endpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from arenaforge.schemas.config import ModelConfig
from arenaforge.schemas.errors import ProviderError, ProviderUnreachable
from arenaforge.services.models.base import ChatRequest, ChatResponse
from arenaforge.services.models.limiter import AdaptiveLimiter

log = logging.getLogger(__name__)


class Member(Protocol):
    """What the pool needs of one endpoint's client (OpenAICompatibleModel with fail_fast=True, no warehouse)."""

    limiter: AdaptiveLimiter

    async def complete(self, request: ChatRequest) -> ChatResponse: ...
    async def probe(self, timeout_s: float = 5.0) -> str | None: ...
    async def aclose(self) -> None: ...


@dataclass(eq=False)
class Endpoint:
    url: str
    client: Member
    outstanding: int = 0
    healthy: bool = True
    next_check: float = 0.0
    check_interval: float = 0.0
    checking: asyncio.Task[None] | None = None
    last_error: str = ""
    answered: int = 0
    ejections: int = 0
    returns: int = 0

    def load(self) -> float:
        return self.outstanding / max(1.0, self.client.limiter.limit)


@dataclass
class PoolStats:
    resent: int = 0  # requests re-sent to another endpoint after theirs failed
    resent_failed: int = 0  # ... that failed there too
    per_endpoint: list[dict[str, Any]] = field(default_factory=list)


class EndpointPool:
    """ChatModel over several endpoints of one model (see module docstring)."""

    kind = "openai"
    decides_by = "model"

    def __init__(self, cfg: ModelConfig, urls: list[str], member: Callable[[str], Member]) -> None:
        self.cfg = cfg
        self.name = cfg.model
        self.endpoints = [Endpoint(url=url, client=member(url)) for url in urls]
        self.resent = 0
        self.resent_failed = 0
        self._turn = itertools.count()

    # ------------------------------------------------------------------ the seam
    async def complete(self, request: ChatRequest) -> ChatResponse:
        """Send to the least busy healthy endpoint; on a connection failure, eject it and re-send once elsewhere."""
        first = await self._pick(exclude=None)
        try:
            return await self._send(first, request)
        except ProviderUnreachable as err:
            self._eject(first, err)
            failure = err
        self.resent += 1
        second = await self._pick(exclude=first, failure=failure)
        try:
            return await self._send(second, request)
        except ProviderUnreachable as err:
            self._eject(second, err)
            self.resent_failed += 1
            raise ProviderUnreachable(f"{err}; re-sent there after {first.url} failed: {first.last_error}") from None

    async def _send(self, endpoint: Endpoint, request: ChatRequest) -> ChatResponse:
        endpoint.outstanding += 1
        try:
            response = await endpoint.client.complete(request)
        finally:
            endpoint.outstanding -= 1
        endpoint.answered += 1
        return response

    # ------------------------------------------------------------------ routing and health
    async def _pick(self, exclude: Endpoint | None, failure: ProviderUnreachable | None = None) -> Endpoint:
        self._schedule_checks()
        candidates = [e for e in self.endpoints if e.healthy and e is not exclude]
        if not candidates:  # every other endpoint is ejected: check them now rather than fail at once
            others = [e for e in self.endpoints if e is not exclude]
            await asyncio.gather(*(self._check_now(e) for e in others))
            candidates = [e for e in others if e.healthy]
        if not candidates:
            reasons = "; ".join(f"{e.url}: {e.last_error}" for e in self.endpoints)
            raise ProviderUnreachable(f"no endpoint of {len(self.endpoints)} is reachable ({reasons})") from failure
        turn = next(self._turn)
        # least outstanding relative to the endpoint's current limit; ties in turn so idle endpoints share the start
        return min(candidates, key=lambda e: (e.load(), (self.endpoints.index(e) - turn) % len(self.endpoints)))

    def _eject(self, endpoint: Endpoint, err: ProviderUnreachable) -> None:
        endpoint.last_error = str(err).splitlines()[0][:300]
        if not endpoint.healthy:
            return
        endpoint.healthy = False
        endpoint.ejections += 1
        endpoint.check_interval = self.cfg.health_interval_s
        endpoint.next_check = time.monotonic() + endpoint.check_interval
        log.warning("endpoint %s ejected (%s); requests go to the others until it passes a health check",
                    endpoint.url, endpoint.last_error)

    def _schedule_checks(self) -> None:
        """Start a health check of every ejected endpoint whose time has come (one at a time per endpoint)."""
        now = time.monotonic()
        for endpoint in self.endpoints:
            if not endpoint.healthy and endpoint.checking is None and now >= endpoint.next_check:
                endpoint.checking = asyncio.get_running_loop().create_task(self._check(endpoint))

    async def _check_now(self, endpoint: Endpoint) -> None:
        if endpoint.healthy:
            return
        if endpoint.checking is None:
            endpoint.checking = asyncio.get_running_loop().create_task(self._check(endpoint))
        await asyncio.shield(endpoint.checking)

    async def _check(self, endpoint: Endpoint) -> None:
        try:
            problem = await endpoint.client.probe(min(5.0, self.cfg.timeout_s))
            if problem is None:
                endpoint.healthy = True
                endpoint.returns += 1
                log.warning("endpoint %s passed its health check and takes requests again", endpoint.url)
            else:
                endpoint.last_error = problem
                endpoint.check_interval = min(max(endpoint.check_interval * 2, 0.1), self.cfg.backoff_max_s)
                endpoint.next_check = time.monotonic() + endpoint.check_interval
        finally:
            endpoint.checking = None

    # ------------------------------------------------------------------ reporting and closing
    def stats(self) -> PoolStats:
        return PoolStats(resent=self.resent, resent_failed=self.resent_failed, per_endpoint=[
            {"url": e.url, "healthy": e.healthy, "answered": e.answered, "ejections": e.ejections,
             "returns": e.returns, "limit": round(e.client.limiter.limit, 1), "peak_in_flight": e.client.limiter.peak}
            for e in self.endpoints])

    async def aclose(self) -> None:
        for endpoint in self.endpoints:
            if endpoint.checking is not None:
                endpoint.checking.cancel()
                with contextlib.suppress(asyncio.CancelledError, ProviderError):
                    await endpoint.checking
        await asyncio.gather(*(e.client.aclose() for e in self.endpoints))
