"""The `openai` provider: any OpenAI-compatible chat endpoint (vLLM, OpenAI), `POST /chat/completions`.

Transport: one aiohttp session per event loop, JSON in and out, no SDK. The openai SDK's
per-request machinery (options model, httpx request building, response wrapping) cost ~3 ms
of CPU per call, which on a 2-core client capped 128 calls in flight at ~330/s against an
endpoint answering after 300 ms (`arenaforge bench models`); the wire format is simple and
stable, so the client speaks it directly.

Retry policy (the only one in the stack: Prefect tasks wrapping model steps use retries=0):
up to `max_retries` retries on timeouts, connection errors, 408, 409, 429 and 5xx, sleeping
`uniform(0, min(backoff_max, base * 2**attempt))` ("full jitter"), or the server's Retry-After
when it sends one. Other 4xx fail at once.

Structured output: when a request carries `response_schema`, the answer is parsed as JSON and
validated against it; an invalid answer is re-asked at most `max_reasks` times with the
validation error, then the step gets a `ParseError` (a rejected row, not a crash).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import random
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson

from arenaforge.schemas.config import ModelConfig
from arenaforge.schemas.contracts import validate_against
from arenaforge.schemas.errors import ParseError, ProviderError
from arenaforge.schemas.models import ChatMessage, Usage
from arenaforge.tasks.models.base import ChatRequest, ChatResponse
from arenaforge.tasks.models.cache import ResponseCache, UsageLedger
from arenaforge.tasks.models.limiter import AdaptiveLimiter
from arenaforge.warehouse.db import Warehouse

NAME = "openai"

_RETRY_STATUS = frozenset({408, 409, 429})  # and every 5xx, as OpenAI's own clients do
_SCHEMA_NAME = re.compile(r"[^A-Za-z0-9_-]")  # what OpenAI accepts in a json_schema name
_FENCE = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*```\s*$", re.DOTALL)

_REQUEST_COUNTER = itertools.count()


def parse_json_answer(content: str | None) -> Any:
    """JSON from a model answer, tolerating a ```json fence; raises ValueError."""
    if content is None:
        raise ValueError("the answer has no text content")
    text = content.strip()
    fenced = _FENCE.match(text)
    if fenced:
        text = fenced.group(1)
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise ValueError(f"not valid JSON ({err.msg} at line {err.lineno} column {err.colno})") from None


class _HTTPStatusError(Exception):
    def __init__(self, status: int, body: bytes, retry_after: str | None) -> None:
        self.status = status
        self.retry_after = retry_after
        try:
            detail = json.loads(body)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            detail = body.decode(errors="replace")
        super().__init__(f"HTTP {status}: {detail}")

    @property
    def retryable(self) -> bool:
        return self.status in _RETRY_STATUS or self.status >= 500


class _Transient(Exception):
    """A timeout or a broken connection: worth another try."""


def _retry_after(err: Exception) -> float | None:
    value = getattr(err, "retry_after", None)
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


class OpenAICompatibleModel:
    """ChatModel over an OpenAI-compatible endpoint with caching, usage, retries and adaptive concurrency.

    The model owns its endpoint's HTTP session and concurrency limiter, made in the event loop of the
    run that uses it (one loop per flow run): every stage of a run shares one connection pool and one
    concurrency budget for the endpoint.
    """

    kind = "openai"

    def __init__(self, cfg: ModelConfig, wh: Warehouse | None = None, run_id: str | None = None) -> None:
        if not cfg.base_url:
            raise ProviderError("model.backend = openai needs model.base_url (e.g. http://127.0.0.1:8000/v1)")
        self.cfg = cfg
        self.name = cfg.model
        # answers cached in the warehouse (a re-run makes no calls) and one usage row per call
        self.cache = ResponseCache(wh, cfg.model) if (wh is not None and cfg.cache) else None
        self.ledger = UsageLedger(wh, run_id) if wh is not None else None
        self._url = cfg.base_url.rstrip("/") + "/chat/completions"
        self._http: aiohttp.ClientSession | None = None
        self._limiter: AdaptiveLimiter | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closer: tuple[Any, Any] | None = None

    def _bind(self) -> None:
        """Make the session and limiter in the running loop (asyncio and aiohttp objects belong to one loop)."""
        loop = asyncio.get_running_loop()
        if self._loop is loop and self._http is not None:
            return
        connector = aiohttp.TCPConnector(limit=self.cfg.concurrency_max, ttl_dns_cache=300)
        self._http = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=self.cfg.timeout_s),
            headers={"Authorization": f"Bearer {self.cfg.api_key or 'EMPTY'}", "Content-Type": "application/json"})
        self._limiter = AdaptiveLimiter(self.cfg.concurrency_initial, self.cfg.concurrency_max)
        self._loop = loop
        self._close_when_loop_ends(self._http)

    def _session(self) -> aiohttp.ClientSession:
        self._bind()
        assert self._http is not None
        return self._http

    @property
    def limiter(self) -> AdaptiveLimiter:
        """This run's concurrency limiter for the endpoint."""
        self._bind()
        assert self._limiter is not None
        return self._limiter

    def _close_when_loop_ends(self, session: aiohttp.ClientSession) -> None:
        """Close `session` inside its own loop when it shuts down.

        asyncio.run() finalises pending async generators before closing the loop, so a
        suspended generator's `finally` is the last moment the session can be closed on the
        loop it belongs to (otherwise aiohttp warns about an unclosed session at exit).
        """

        async def closer() -> Any:
            try:
                yield
            finally:
                await session.close()

        agen = closer()
        self._closer = (agen, asyncio.get_running_loop().create_task(agen.__anext__()))

    def close(self) -> None:
        """Flush the cache and usage rows to the warehouse (blocks until they are written)."""
        for writer in (self.cache, self.ledger):
            if writer is not None:
                writer.close()

    async def aclose(self) -> None:
        """Close the HTTP session inside the loop that made it."""
        session, self._http = self._http, None
        self._loop = None
        if session is not None:
            await session.close()

    async def _post(self, body: bytes, idempotency_key: str) -> Any:
        """One POST /chat/completions: the decoded JSON body, or _HTTPStatusError / _Transient."""
        try:
            async with self._session().post(self._url, data=body, headers={"Idempotency-Key": idempotency_key}) as resp:
                payload = await resp.read()
                if resp.status >= 400:
                    raise _HTTPStatusError(resp.status, payload, resp.headers.get("retry-after"))
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, asyncio.TimeoutError) as err:
            raise _Transient(f"{type(err).__name__}: {err}" if str(err) else type(err).__name__) from None
        return orjson.loads(payload)

    async def complete(self, request: ChatRequest) -> ChatResponse:
        key = request.cache_key(self.name)
        started = time.perf_counter()
        if self.cache is not None:
            hit = self.cache.get(key)
            if hit is not None:
                self._account(key, request, hit, started)
                return hit
        response = await self._complete_uncached(request)
        if self.cache is not None:
            self.cache.put(key, request.model_dump(mode="json"), response)
        self._account(key, request, response, started)
        return response

    def _account(self, key: str, request: ChatRequest, response: ChatResponse, started: float) -> None:
        if self.ledger is not None:
            self.ledger.record(key, request.step, self.name, response, time.perf_counter() - started)

    async def _complete_uncached(self, request: ChatRequest) -> ChatResponse:
        messages = list(request.messages)
        attempts_total = 0
        usage = Usage()
        for reask in range(self.cfg.max_reasks + 1):
            raw, attempts = await self._send(messages, request)
            attempts_total += attempts
            usage = _add_usage(usage, raw)
            message = _assistant_message(raw, request.step, self.cfg.base_url)
            if request.response_schema is None:
                return ChatResponse(message=message, usage=usage, attempts=attempts_total, reasks=reask)
            problem, parsed = self._check(message.content, request.response_schema)
            if problem is None:
                return ChatResponse(message=message, parsed=parsed, usage=usage, attempts=attempts_total, reasks=reask)
            messages = messages + [
                {"role": "assistant", "content": message.content or ""},
                {"role": "user", "content": f"Your answer was invalid: {problem}. "
                 "Reply again with only a JSON value that satisfies the schema."},
            ]
        raise ParseError(
            f"{request.step}: answer from {self.name} still invalid after {self.cfg.max_reasks} re-asks: {problem}"
        )

    @staticmethod
    def _check(content: str | None, schema: dict[str, Any]) -> tuple[str | None, Any]:
        try:
            parsed = parse_json_answer(content)
        except ValueError as err:
            return str(err), None
        problem = validate_against(schema, parsed)
        return (None, parsed) if problem is None else (f"schema violation at {problem}", None)

    async def _send(self, messages: list[dict[str, Any]], request: ChatRequest) -> tuple[Any, int]:
        params: dict[str, Any] = {
            "model": self.name,
            "messages": messages,
            "temperature": self.cfg.temperature if request.temperature is None else request.temperature,
            "max_tokens": request.max_tokens or self.cfg.max_tokens,
        }
        if request.seed is not None:
            params["seed"] = request.seed
        if request.tools:
            params["tools"] = request.tools
            if request.tool_choice is not None:
                params["tool_choice"] = request.tool_choice
        if request.response_schema is not None:
            params["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": _SCHEMA_NAME.sub("_", request.step)[:64], "schema": request.response_schema},
            }
        limiter = self.limiter
        body = orjson.dumps(params)  # several times faster than json.dumps on a prompt-sized body
        idem = next(_REQUEST_COUNTER)
        last: Exception | None = None
        for attempt in range(self.cfg.max_retries + 1):
            try:
                async with limiter.slot():
                    # Our own idempotency key (a counter + attempt): a uuid4 per request reads
                    # os.urandom, which costs ~1.5 ms a call on these VMs.
                    raw = await self._post(body, f"af-{idem}-{attempt}")
                limiter.on_success()
                return raw, attempt + 1
            except (_Transient, _HTTPStatusError) as err:
                if isinstance(err, _HTTPStatusError) and not err.retryable:
                    raise ProviderError(f"{self.cfg.base_url} refused the request ({_short(err)})") from None
                last = err
                if isinstance(err, _HTTPStatusError) and err.status == 429:
                    limiter.on_rate_limited()
                if attempt == self.cfg.max_retries:
                    break
                cap = min(self.cfg.backoff_max_s, self.cfg.backoff_base_s * 2**attempt)
                await asyncio.sleep(_retry_after(err) or random.uniform(0, cap))
            except ValueError as err:  # the body is not JSON
                raise ParseError(
                    f"{request.step}: {self.cfg.base_url} answered something that is not a chat completion "
                    f"({type(err).__name__}: {_short(err)})"
                ) from None
        kind = "timeout or connection error" if isinstance(last, _Transient) else "error"
        raise ProviderError(
            f"{self.cfg.base_url} failed {self.cfg.max_retries + 1} times; last {kind}: {_short(last)}"
        )


def _short(err: Exception | None) -> str:
    return str(err).splitlines()[0][:200] if err else ""


def _assistant_message(raw: Any, step: str, url: str | None) -> ChatMessage:
    """The first choice's message of a chat.completion body, validated; ParseError otherwise."""
    try:
        message = raw["choices"][0]["message"]
        return ChatMessage(
            role="assistant",
            content=message.get("content"),
            tool_calls=[
                {"id": tc["id"], "type": "function",
                 "function": {"name": tc["function"]["name"], "arguments": tc["function"].get("arguments") or "{}"}}
                for tc in message.get("tool_calls") or []
            ] or None,
        )
    except (KeyError, IndexError, TypeError, AttributeError, ValueError) as err:
        raise ParseError(
            f"{step}: {url} answered something that is not a chat completion ({type(err).__name__}: {_short(err)})"
        ) from None


def _add_usage(total: Usage, raw: Any) -> Usage:
    u = raw.get("usage") if isinstance(raw, dict) else None
    if not isinstance(u, dict):
        return total
    return Usage(
        prompt_tokens=total.prompt_tokens + (u.get("prompt_tokens") or 0),
        completion_tokens=total.completion_tokens + (u.get("completion_tokens") or 0),
        total_tokens=total.total_tokens + (u.get("total_tokens") or 0),
    )


@contextlib.asynccontextmanager
async def open(cfg: ModelConfig, wh: Warehouse | None = None, run_id: str | None = None  # noqa: A001
               ) -> AsyncIterator[OpenAICompatibleModel]:
    """The endpoint's model with its warehouse response cache and usage ledger, flushed and closed on exit."""
    model = OpenAICompatibleModel(cfg, wh, run_id)
    try:
        yield model
    finally:
        await model.aclose()
        await asyncio.to_thread(model.close)
