"""The `openai` backend: any OpenAI-compatible chat endpoint (vLLM, OpenAI) through the openai SDK.

Retry policy (the only one in the stack: the SDK's own retries are off, and Prefect tasks
wrapping model steps use retries=0): up to `max_retries` retries on timeouts, connection
errors, 429 and 5xx, sleeping `uniform(0, min(backoff_max, base * 2**attempt))` ("full
jitter"), or the server's Retry-After when it sends one. Other 4xx fail at once.

Structured output: when a request carries `response_schema`, the answer is parsed as JSON and
validated against it; an invalid answer is re-asked at most `max_reasks` times with the
validation error, then the step gets a `ParseError` (a rejected row, not a crash).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import random
import re
import time
from typing import Any

import httpx2
import openai

from schemas.config import ModelConfig
from schemas.contracts import validate_against
from schemas.errors import ParseError, ProviderError
from schemas.models import ChatMessage, Usage
from tasks.models.base import ChatRequest, ChatResponse
from tasks.models.cache import ResponseCache, UsageLedger
from tasks.models.limiter import AdaptiveLimiter

_RETRYABLE = (openai.APITimeoutError, openai.APIConnectionError, openai.RateLimitError, openai.InternalServerError)
_FENCE = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*```\s*$", re.DOTALL)

_REQUEST_COUNTER = itertools.count()

# One limiter per (endpoint, event loop): asyncio primitives belong to the loop that made them.
_LIMITERS: dict[tuple[str, int], AdaptiveLimiter] = {}


def limiter_for(cfg: ModelConfig) -> AdaptiveLimiter:
    loop_id = id(asyncio.get_running_loop())
    key = (cfg.base_url or "", loop_id)
    if key not in _LIMITERS:
        _LIMITERS[key] = AdaptiveLimiter(cfg.concurrency_initial, cfg.concurrency_max)
    return _LIMITERS[key]


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


def _retry_after(err: Exception) -> float | None:
    response = getattr(err, "response", None)
    value = response.headers.get("retry-after") if response is not None else None
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


class OpenAIChatModel:
    """ChatModel over the openai SDK with caching, usage, retries and adaptive concurrency."""

    def __init__(self, cfg: ModelConfig, cache: ResponseCache | None = None, ledger: UsageLedger | None = None) -> None:
        if not cfg.base_url:
            raise ProviderError("model.backend = openai needs model.base_url (e.g. http://127.0.0.1:8000/v1)")
        self.cfg = cfg
        self.name = cfg.model
        self.cache = cache
        self.ledger = ledger
        self._clients: list[openai.AsyncOpenAI] = []
        self._client_loop: int | None = None
        self._closer: tuple[Any, Any] | None = None

    def _sdk(self) -> openai.AsyncOpenAI:
        """This event loop's client, on the SDK's aiohttp transport.

        httpx's connection pool scans every connection on each request and the SDK's default
        transport costs several ms of CPU per call; with 128 calls in flight on 2 cores that, not
        the endpoint, was the bottleneck. aiohttp keeps the per-call cost small.
        """
        loop_id = id(asyncio.get_running_loop())
        if not self._clients or self._client_loop != loop_id:
            limits = httpx2.Limits(max_connections=self.cfg.concurrency_max,
                                   max_keepalive_connections=self.cfg.concurrency_max)
            self._clients = [
                openai.AsyncOpenAI(
                    base_url=self.cfg.base_url,
                    api_key=self.cfg.api_key or "EMPTY",
                    timeout=self.cfg.timeout_s,
                    max_retries=0,
                    http_client=openai.DefaultAioHttpClient(limits=limits, timeout=self.cfg.timeout_s),
                )
            ]
            self._client_loop = loop_id
            self._close_when_loop_ends(self._clients)
        return self._clients[0]

    def _close_when_loop_ends(self, clients: list[openai.AsyncOpenAI]) -> None:
        """Close `clients` inside their own loop when it shuts down.

        asyncio.run() finalises pending async generators before closing the loop, so a
        suspended generator's `finally` is the last moment the HTTP sessions can be closed on
        the loop they belong to (otherwise aiohttp warns about unclosed sessions at exit).
        """

        async def closer() -> Any:
            try:
                yield
            finally:
                for client in clients:
                    await client.close()

        agen = closer()
        self._closer = (agen, asyncio.get_running_loop().create_task(agen.__anext__()))

    async def aclose(self) -> None:
        """Close the HTTP clients inside the loop that made them (avoids 'Event loop is closed' noise)."""
        clients, self._clients = self._clients, []
        for client in clients:
            await client.close()

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
        if request.response_schema is not None:
            params["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": request.step.replace("-", "_")[:64], "schema": request.response_schema},
            }
        limiter = limiter_for(self.cfg)
        idem = next(_REQUEST_COUNTER)
        last: Exception | None = None
        for attempt in range(self.cfg.max_retries + 1):
            try:
                async with limiter.slot():
                    # The low-level post skips the SDK's per-request TypedDict transform of the body
                    # (~7 ms of CPU per request), which alone capped throughput well below the limit.
                    # and cast_to=object keeps the JSON as plain data (no per-field model construction).
                    # Our own idempotency key (request hash + attempt): the SDK's uuid4 per request
                    # reads os.urandom, which costs ~1.5 ms a call on these VMs.
                    raw = await self._sdk().post("/chat/completions", body=params, cast_to=object,
                                                 options={"idempotency_key": f"af-{idem}-{attempt}"})
                limiter.on_success()
                return raw, attempt + 1
            except _RETRYABLE as err:
                last = err
                if isinstance(err, openai.RateLimitError):
                    limiter.on_rate_limited()
                if attempt == self.cfg.max_retries:
                    break
                cap = min(self.cfg.backoff_max_s, self.cfg.backoff_base_s * 2**attempt)
                await asyncio.sleep(_retry_after(err) or random.uniform(0, cap))
            except (openai.APIResponseValidationError, json.JSONDecodeError, TypeError, AttributeError) as err:
                raise ParseError(
                    f"{request.step}: {self.cfg.base_url} answered something that is not a chat completion "
                    f"({type(err).__name__}: {_short(err)})"
                ) from None
            except openai.APIStatusError as err:
                raise ProviderError(
                    f"{self.cfg.base_url} refused the request (HTTP {err.status_code}): {_short(err)}"
                ) from None
        raise ProviderError(
            f"{self.cfg.base_url} failed {self.cfg.max_retries + 1} times; last error: {type(last).__name__}: {_short(last)}"
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
