"""The `openai` provider: any OpenAI-compatible chat endpoint (vLLM, llama-cpp-python's server, OpenAI).

Transport: one aiohttp session per run (its event loop), JSON in and out, no SDK: the openai SDK's
per-request machinery cost ~3 ms of CPU per call, which capped a 2-core client below what one
endpoint can serve (`arenaforge bench models`).

Retry policy (the only one in the stack: Prefect tasks wrapping model steps use retries=0). Only what
can succeed is retried: connection errors and timeouts, 408, 429, 502, 503, 504 and truncated bodies,
sleeping `uniform(0, min(backoff_max_s, backoff_base_s * 2**attempt))` ("full jitter"), or the
server's Retry-After, capped by `backoff_max_s`; at most `max_retries` retries and never past
`retry_budget_s` for one request. A 500 or another 4xx fails at once. A request's timeout starts when
it is sent (the concurrency limiter's queue is not counted). After `max_retries + 1` connection
failures in a row with no success in between, the endpoint is taken for dead for `backoff_max_s`:
requests fail at once instead of each spending its own budget. Failures are typed
(`ProviderUnreachable`, `ProviderOverloaded`, `ProviderRefused`, `ProviderError`).

Structured output, negotiated once per endpoint and remembered: `response_format: json_schema`;
when the endpoint refuses it, `json_object` with the schema in the prompt; when it refuses that too,
the schema in the prompt only and the answer parsed from the text with repair (fences, prose around
it, trailing commas). An answer that breaks the schema is re-asked at most `max_reasks` times with
the validation error, then the step gets a `ParseError`. Messages always carry `content`; a step's
`tool_choice` is sent with its tools. Tool calls are native until the endpoint refuses them; then
the tools go into the prompt (`services/models/prompted_tools.py`), also remembered per endpoint.

Accounting (`accounted.py`, around this model or a pool of them): every request has a `llm_calls`
row with its cost class: `sent` (tokens spent), `cached` (answered from the warehouse cache, no tokens
spent) or `failed` (its error kind; tokens spent on answers that were thrown away are `wasted_tokens`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import random
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson

from arenaforge.schemas.config import ModelConfig
from arenaforge.schemas.errors import ParseError, ProviderRefused, ProviderUnreachable
from arenaforge.schemas.models import Usage
from arenaforge.services.models import prompted_tools
from arenaforge.services.models.accounted import Accounted
from arenaforge.services.models.answers import add_usage, assistant_message, check_answer, usage_of
from arenaforge.services.models.base import ChatRequest, ChatResponse
from arenaforge.services.models.dialect import Dialect
from arenaforge.services.models.endpoint_pool import EndpointPool
from arenaforge.services.models.http_errors import (
    OVERLOAD_STATUS,
    RETRY_STATUS,
    HTTPStatusError,
    ToolsRefused,
    Transient,
    retry_after,
    short,
    typed_error,
)
from arenaforge.services.models.limiter import AdaptiveLimiter
from arenaforge.warehouse.db import Warehouse

NAME = "openai"
log = logging.getLogger(__name__)

_REQUEST_COUNTER = itertools.count()


class OpenAICompatibleModel:
    """ChatModel over an OpenAI-compatible endpoint with caching, usage, retries and adaptive concurrency.

    The model owns its endpoint's HTTP session and concurrency limiter, made in the event loop of the
    run that uses it (one loop per flow run): every stage of a run shares one connection pool, one
    concurrency budget and one negotiated structured-output mode for the endpoint.
    """

    kind = NAME
    decides_by = "model"

    def __init__(self, cfg: ModelConfig, fail_fast: bool = False) -> None:
        if not cfg.base_url:
            raise ProviderRefused("model.backend = openai needs model.base_url (e.g. http://127.0.0.1:8000/v1)")
        self.cfg = cfg
        self.name = cfg.model
        self.dialect = Dialect(cfg)  # structured-output mode, tool calls and parameters this endpoint takes
        self._url = cfg.base_url.rstrip("/") + "/chat/completions"
        self._http: aiohttp.ClientSession | None = None
        self._limiter: AdaptiveLimiter | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._closer: tuple[Any, Any] | None = None
        self._failures_in_a_row = 0
        self._dead_until = 0.0
        self._dead_reason = ""
        # in an endpoint pool: a connection error or timeout ends the request at once (ProviderUnreachable), so the
        # pool ejects this endpoint and re-sends the request to another one instead of retrying here
        self.fail_fast = fail_fast

    # ------------------------------------------------------------------ session and limiter
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
    def tool_mode(self) -> str:
        """"native" or "prompt": how this endpoint takes tools (negotiated)."""
        return self.dialect.tool_mode

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

    async def aclose(self) -> None:
        """Close the HTTP session inside the loop that made it."""
        session, self._http = self._http, None
        self._loop = None
        if session is not None:
            await session.close()

    # ------------------------------------------------------------------ the seam
    async def complete(self, request: ChatRequest) -> ChatResponse:
        if request.tools and self.dialect.tool_mode == "native":
            try:
                return await self._complete_turns(request)
            except ToolsRefused as err:
                if self.cfg.tool_calling != "auto":
                    raise ProviderRefused(f"{self.cfg.base_url} refused tool calls ({short(err)})") from None
                if self.dialect.tool_mode == "native":
                    self.dialect.tool_mode = "prompt"
                    log.warning("%s refused native tool calls (%s); tools go into the prompt from now on",
                                self.cfg.base_url, short(err))
        if request.tools:
            return await self._complete_prompted_tools(request)
        return await self._complete_turns(request)

    async def _complete_prompted_tools(self, request: ChatRequest) -> ChatResponse:
        """A tool turn for an endpoint without tool calls: tools in the prompt, the turn as validated JSON."""
        assert request.tools is not None
        prompted = request.model_copy(update={
            "messages": prompted_tools.render(request.messages, request.tools, request.tool_choice),
            "tools": None, "tool_choice": None,
            "response_schema": prompted_tools.turn_schema(request.tools, request.tool_choice, self.cfg.calls_per_turn)})
        response = await self._complete_turns(prompted)
        return response.model_copy(update={"message": prompted_tools.to_message(response.parsed, len(request.messages)), "parsed": None})

    async def _complete_turns(self, request: ChatRequest) -> ChatResponse:
        messages = list(request.messages)
        attempts_total = 0
        usage = Usage()
        wasted = 0
        problem = ""
        for reask in range(self.cfg.max_reasks + 1):
            raw, attempts = await self._send(messages, request)
            attempts_total += attempts
            turn = usage_of(raw)
            usage = add_usage(usage, turn)
            message = assistant_message(raw, request.step, self.cfg.base_url)
            if request.response_schema is None:
                return ChatResponse(message=message, usage=usage, attempts=attempts_total, reasks=reask,
                                    wasted_tokens=wasted)
            problem, parsed = check_answer(message.content, request.response_schema)
            if problem is None:
                return ChatResponse(message=message, parsed=parsed, usage=usage, attempts=attempts_total, reasks=reask,
                                    wasted_tokens=wasted)
            wasted += turn.total_tokens
            if _cut(raw) and self.dialect.mode == "json_schema":
                # cut by the answer budget while the engine enforced the schema: sample afresh (the next seed), not
                # shown the cut text (a small model shown its runaway answer copies it)
                seed = request.seed if request.seed is not None else self.cfg.seed
                request = request.model_copy(update={"seed": seed + 1})
                continue
            # the schema goes with the re-ask: a server that ignores response_format (transformers serve does) still
            # tells the model what to write
            messages = messages + [
                {"role": "assistant", "content": message.content or ""},
                {"role": "user", "content": f"Your answer was invalid: {problem}. Reply again with only a JSON value "
                 f"that satisfies this JSON Schema: {json.dumps(request.response_schema, ensure_ascii=False)}"},
            ]
        err = ParseError(f"{request.step}: answer from {self.name} still invalid after {self.cfg.max_reasks} re-asks: "
                         f"{problem}")
        err.usage, err.attempts = usage, attempts_total  # type: ignore[attr-defined]  (for the usage row)
        raise err

    # ------------------------------------------------------------------ one request, with retries
    async def _send(self, messages: list[dict[str, Any]], request: ChatRequest) -> tuple[Any, int]:
        deadline = time.monotonic() + self.cfg.retry_budget_s
        idem = next(_REQUEST_COUNTER)
        last: Exception | None = None
        attempt = 0
        while True:
            self._check_alive()
            mode = self.dialect.mode
            body = orjson.dumps(self.dialect.body(self.name, messages, request))
            try:
                async with self.limiter.slot():
                    # our own idempotency key (a counter + attempt): a uuid4 per request reads os.urandom,
                    # which costs ~1.5 ms a call on these VMs
                    raw = await self._post(body, f"af-{idem}-{attempt}")
                self.limiter.on_success()
                self._failures_in_a_row = 0
                return raw, attempt + 1
            except HTTPStatusError as err:
                # servers refuse an unsupported response_format with 400, 422 (llama-cpp-python) or even 500 (llama.cpp)
                if err.status in (400, 422, 500) and request.response_schema is not None and self.dialect.downgrade(mode, err):
                    continue  # negotiated a structured-output mode this endpoint accepts: send again at once
                if request.tools and self.dialect.refuses_tools(err):
                    raise ToolsRefused(err.detail) from None
                if err.status == 400 and self.dialect.adapt_params(err):
                    continue
                if err.status not in RETRY_STATUS:
                    raise typed_error(err, self.cfg.base_url) from None
                if err.status in OVERLOAD_STATUS:
                    self.limiter.on_rate_limited()
                last = err
            except Transient as err:
                last = err
                if err.unreachable and self.fail_fast:
                    raise typed_error(err, self.cfg.base_url) from None
                if err.unreachable:
                    self._failures_in_a_row += 1
                    if self._failures_in_a_row > self.cfg.max_retries:
                        self._dead_until = time.monotonic() + self.cfg.backoff_max_s
                        self._dead_reason = str(err)
            if attempt >= self.cfg.max_retries:
                break
            cap = min(self.cfg.backoff_max_s, self.cfg.backoff_base_s * 2**attempt)
            pause = min(retry_after(last) or random.uniform(0, cap), self.cfg.backoff_max_s)
            if time.monotonic() + pause > deadline:
                break
            await asyncio.sleep(pause)
            attempt += 1
        raise typed_error(last, self.cfg.base_url, attempts=attempt + 1) from None

    def _check_alive(self) -> None:
        if time.monotonic() < self._dead_until:
            raise ProviderUnreachable(f"{self.cfg.base_url} is unreachable ({self._failures_in_a_row} connection "
                                      f"failures in a row; last: {short(self._dead_reason)})")

    async def probe(self, timeout_s: float = 5.0) -> str | None:
        """Health check: GET /models; None when the endpoint answers, else why not."""
        try:
            async with self._session().get(self.cfg.base_url.rstrip("/") + "/models",
                                           timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
                await resp.read()
                return None if resp.status < 500 else f"HTTP {resp.status}"
        except (TimeoutError, aiohttp.ClientError) as err:
            return f"{type(err).__name__}: {err}" if str(err) else type(err).__name__

    async def _post(self, body: bytes, idempotency_key: str) -> Any:
        """One POST /chat/completions: the decoded JSON body, or HTTPStatusError / Transient."""
        try:
            async with self._session().post(self._url, data=body, headers={"Idempotency-Key": idempotency_key}) as resp:
                payload = await resp.read()
                if resp.status >= 400:
                    raise HTTPStatusError(resp.status, payload, resp.headers.get("retry-after"))
        except (TimeoutError, aiohttp.ClientConnectionError) as err:
            raise Transient(f"{type(err).__name__}: {err}" if str(err) else type(err).__name__) from None
        except aiohttp.ClientPayloadError as err:
            raise Transient(f"truncated body ({err})", unreachable=False) from None
        try:
            return orjson.loads(payload)
        except orjson.JSONDecodeError:
            # a 200 whose body is cut or garbled: the answer was lost on the way, worth another try
            raise Transient(f"the body is not JSON ({len(payload)} bytes)", unreachable=False) from None


@contextlib.asynccontextmanager
async def open(cfg: ModelConfig, wh: Warehouse | None = None, run_id: str | None = None) -> AsyncIterator[Accounted]:
    """The endpoint's model (with several `model.endpoints`, an `EndpointPool` of them) behind the warehouse
    response cache and usage ledger, flushed and closed on exit."""
    urls = cfg.endpoint_urls()
    sender: OpenAICompatibleModel | EndpointPool
    if len(urls) > 1:
        sender = EndpointPool(cfg, urls, member=lambda url: OpenAICompatibleModel(
            cfg.model_copy(update={"base_url": url, "endpoints": []}), fail_fast=True))
    else:
        sender = OpenAICompatibleModel(cfg.model_copy(update={"base_url": urls[0] if urls else None}))
    model = Accounted(sender, wh, run_id, cache=cfg.cache)
    try:
        yield model
    finally:
        await model.aclose()
        await asyncio.to_thread(model.close)


__all__ = ["OpenAICompatibleModel"]


def _cut(raw: Any) -> bool:
    """Whether the answer stopped at its token budget (finish_reason "length")."""
    choices = raw.get("choices") if isinstance(raw, dict) else None
    return bool(choices) and isinstance(choices[0], dict) and choices[0].get("finish_reason") == "length"
