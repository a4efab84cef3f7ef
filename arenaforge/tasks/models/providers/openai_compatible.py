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
the tools go into the prompt (`tasks/models/prompted_tools.py`), also remembered per endpoint.

Accounting: every request has a `llm_calls` row with its cost class: `sent` (tokens spent), `cached`
(answered from the warehouse cache, no tokens spent) or `failed` (its error kind; tokens spent on
answers that were thrown away are `wasted_tokens`).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import random
import re
import time
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import orjson

from arenaforge.schemas.config import ModelConfig
from arenaforge.schemas.contracts import validate_against
from arenaforge.schemas.errors import (
    ParseError,
    ProviderError,
    ProviderOverloaded,
    ProviderRefused,
    ProviderUnreachable,
)
from arenaforge.schemas.models import ChatMessage, Usage
from arenaforge.tasks.models import prompted_tools
from arenaforge.tasks.models.base import ChatRequest, ChatResponse
from arenaforge.tasks.models.cache import ResponseCache, UsageLedger
from arenaforge.tasks.models.endpoint_pool import EndpointPool
from arenaforge.tasks.models.limiter import AdaptiveLimiter
from arenaforge.warehouse.db import Warehouse

NAME = "openai"
log = logging.getLogger(__name__)

_RETRY_STATUS = frozenset({408, 429, 502, 503, 504})
_OVERLOAD_STATUS = frozenset({429, 503})
_SCHEMA_NAME = re.compile(r"[^A-Za-z0-9_-]")  # what OpenAI accepts in a json_schema name
_FENCE = re.compile(r"```(?:json)?\s*(.*?)\s*```", re.DOTALL)
_TRAILING_COMMA = re.compile(r",\s*([}\]])")
# Words an endpoint uses when it refuses a response_format it does not support.
_FORMAT_REFUSAL = re.compile(r"response_format|json_schema|json_object|grammar", re.IGNORECASE)
# ... and when it cannot call tools (vLLM without --enable-auto-tool-choice --tool-call-parser).
_TOOLS_REFUSAL = re.compile(r"tool.choice|tool-call-parser|tools? param|tools? (?:are |is )?not supported|"
                            r"does not support tools", re.IGNORECASE)
# ... and a sampling parameter it does not take (OpenAI's reasoning models: max_completion_tokens, temperature 1).
_PARAM_RENAMED = re.compile(r"Unsupported parameter: '(\w+)'.*?Use '(\w+)' instead", re.IGNORECASE)
_PARAM_REFUSED = re.compile(r"Unsupported (?:parameter|value): '(\w+)'", re.IGNORECASE)
_OPTIONAL_PARAMS = frozenset({"temperature", "seed", "max_tokens"})  # a request still means the same without them
MODES = ("json_schema", "json_object", "prompt")

_REQUEST_COUNTER = itertools.count()


def parse_json_answer(content: str | None) -> Any:
    """JSON from a model answer: the whole text, a fenced block, or the first JSON value inside prose
    (a trailing comma forgiven); raises ValueError."""
    if content is None:
        raise ValueError("the answer has no text content")
    text = content.strip()
    candidates = [text]
    candidates += _FENCE.findall(text)
    start = min((i for i in (text.find("{"), text.find("[")) if i >= 0), default=-1)
    if start >= 0:
        end = max(text.rfind("}"), text.rfind("]"))
        if end > start:
            candidates.append(text[start:end + 1])
    first_error: json.JSONDecodeError | None = None
    for candidate in candidates:
        for variant in (candidate, _TRAILING_COMMA.sub(r"\1", candidate)):
            try:
                return json.loads(variant)
            except json.JSONDecodeError as err:
                first_error = first_error or err
    assert first_error is not None
    raise ValueError(f"not valid JSON ({first_error.msg} at line {first_error.lineno} column {first_error.colno})")


class _HTTPStatusError(Exception):
    def __init__(self, status: int, body: bytes, retry_after: str | None) -> None:
        self.status = status
        self.retry_after = retry_after
        try:
            detail = json.loads(body)["error"]["message"]
        except (ValueError, KeyError, TypeError):
            detail = body.decode(errors="replace")
        self.detail = str(detail)
        super().__init__(f"HTTP {status}: {self.detail}")


class _ToolsRefused(Exception):
    """The endpoint cannot take native tool calls."""


class _Transient(Exception):
    """A timeout, a broken connection or a truncated body: worth another try."""

    def __init__(self, message: str, unreachable: bool = True) -> None:
        super().__init__(message)
        self.unreachable = unreachable  # False: the endpoint answered, but the body was cut


def _retry_after(err: Exception) -> float | None:
    value = getattr(err, "retry_after", None)
    try:
        return float(value) if value is not None else None
    except ValueError:
        return None


class OpenAICompatibleModel:
    """ChatModel over an OpenAI-compatible endpoint with caching, usage, retries and adaptive concurrency.

    The model owns its endpoint's HTTP session and concurrency limiter, made in the event loop of the
    run that uses it (one loop per flow run): every stage of a run shares one connection pool, one
    concurrency budget and one negotiated structured-output mode for the endpoint.
    """

    kind = NAME
    decides_by = "model"

    def __init__(self, cfg: ModelConfig, wh: Warehouse | None = None, run_id: str | None = None,
                 fail_fast: bool = False) -> None:
        if not cfg.base_url:
            raise ProviderRefused("model.backend = openai needs model.base_url (e.g. http://127.0.0.1:8000/v1)")
        self.cfg = cfg
        self.name = cfg.model
        # answers cached in the warehouse (a re-run makes no calls) and one usage row per request
        self.cache = ResponseCache(wh, cfg.model) if (wh is not None and cfg.cache) else None
        self.ledger = UsageLedger(wh, run_id) if wh is not None else None
        self.mode = "json_schema" if cfg.structured_output == "auto" else cfg.structured_output
        self.tool_mode = "prompt" if cfg.tool_calling == "prompt" else "native"
        self._renamed: dict[str, str] = {}  # parameter -> the name this endpoint takes instead
        self._dropped: set[str] = set()  # optional parameters this endpoint refuses
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

    # ------------------------------------------------------------------ the seam
    async def complete(self, request: ChatRequest) -> ChatResponse:
        key = request.cache_key(self.name)
        started = time.perf_counter()
        if self.cache is not None:
            hit = self.cache.get(key)
            if hit is not None:
                self._account(key, request, hit, started, "cached")
                return hit
        try:
            response = await self._complete_uncached(request)
        except ProviderError as err:
            self._account(key, request, None, started, "failed", err)
            raise
        if self.cache is not None:
            self.cache.put(key, request.model_dump(mode="json"), response)
        self._account(key, request, response, started, "sent")
        return response

    def _account(self, key: str, request: ChatRequest, response: ChatResponse | None, started: float,
                 cost_class: str, err: ProviderError | None = None) -> None:
        if self.ledger is not None:
            self.ledger.record(key, request.step, self.name, response, time.perf_counter() - started, cost_class,
                               error=err)

    async def _complete_uncached(self, request: ChatRequest) -> ChatResponse:
        if request.tools and self.tool_mode == "native":
            try:
                return await self._complete_turns(request)
            except _ToolsRefused as err:
                if self.cfg.tool_calling != "auto":
                    raise ProviderRefused(f"{self.cfg.base_url} refused tool calls ({_short(err)})") from None
                if self.tool_mode == "native":
                    self.tool_mode = "prompt"
                    log.warning("%s refused native tool calls (%s); tools go into the prompt from now on",
                                self.cfg.base_url, _short(err))
        if request.tools:
            return await self._complete_prompted_tools(request)
        return await self._complete_turns(request)

    async def _complete_prompted_tools(self, request: ChatRequest) -> ChatResponse:
        """A tool turn for an endpoint without tool calls: tools in the prompt, the turn as validated JSON."""
        assert request.tools is not None
        prompted = request.model_copy(update={
            "messages": prompted_tools.render(request.messages, request.tools, request.tool_choice),
            "tools": None, "tool_choice": None,
            "response_schema": prompted_tools.turn_schema(request.tools, request.tool_choice)})
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
            turn = _usage(raw)
            usage = _add(usage, turn)
            message = _assistant_message(raw, request.step, self.cfg.base_url)
            if request.response_schema is None:
                return ChatResponse(message=message, usage=usage, attempts=attempts_total, reasks=reask,
                                    wasted_tokens=wasted)
            problem, parsed = self._check(message.content, request.response_schema)
            if problem is None:
                return ChatResponse(message=message, parsed=parsed, usage=usage, attempts=attempts_total, reasks=reask,
                                    wasted_tokens=wasted)
            wasted += turn.total_tokens
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

    @staticmethod
    def _check(content: str | None, schema: dict[str, Any]) -> tuple[str | None, Any]:
        try:
            parsed = parse_json_answer(content)
        except ValueError as err:
            return str(err), None
        problem = validate_against(schema, parsed)
        return (None, parsed) if problem is None else (f"schema violation at {problem}", None)

    # ------------------------------------------------------------------ one request, with retries
    def _params(self, messages: list[dict[str, Any]], request: ChatRequest) -> dict[str, Any]:
        wire = [_wire_message(m) for m in messages]
        params: dict[str, Any] = {
            "model": self.name,
            "messages": wire,
            "temperature": self.cfg.temperature if request.temperature is None else request.temperature,
            "max_tokens": min(request.max_tokens or self.cfg.max_tokens, self.cfg.max_tokens),
            # a seed on every request: sampling is reproducible where the endpoint honours it
            "seed": request.seed if request.seed is not None else self.cfg.seed,
        }
        if request.tools:
            params["tools"] = request.tools
            if request.tool_choice is not None:  # only when the step needs it: vLLM refuses "auto" unless configured
                params["tool_choice"] = request.tool_choice
        for name in self._dropped:
            params.pop(name, None)
        for old, new in self._renamed.items():
            if old in params:
                params[new] = params.pop(old)
        schema = request.response_schema
        if schema is not None:
            if self.mode == "json_schema":
                params["response_format"] = {"type": "json_schema",
                                             "json_schema": {"name": _SCHEMA_NAME.sub("_", request.step)[:64],
                                                             "schema": schema}}
            else:  # the schema goes into the prompt; json_object still asks for JSON where it is supported
                # "json" in lower case: OpenAI's json_object mode wants the word in the messages
                hint = ("Answer in json: a single JSON value that satisfies this JSON Schema, and nothing else:\n"
                        + json.dumps(schema, ensure_ascii=False))
                params["messages"] = prompted_tools.add_instruction(wire, hint)
                if self.mode == "json_object":
                    params["response_format"] = {"type": "json_object"}
        return params

    async def _send(self, messages: list[dict[str, Any]], request: ChatRequest) -> tuple[Any, int]:
        deadline = time.monotonic() + self.cfg.retry_budget_s
        idem = next(_REQUEST_COUNTER)
        last: Exception | None = None
        attempt = 0
        while True:
            self._check_alive()
            mode = self.mode
            body = orjson.dumps(self._params(messages, request))
            try:
                async with self.limiter.slot():
                    # our own idempotency key (a counter + attempt): a uuid4 per request reads os.urandom,
                    # which costs ~1.5 ms a call on these VMs
                    raw = await self._post(body, f"af-{idem}-{attempt}")
                self.limiter.on_success()
                self._failures_in_a_row = 0
                return raw, attempt + 1
            except _HTTPStatusError as err:
                # servers refuse an unsupported response_format with 400, 422 (llama-cpp-python) or even 500 (llama.cpp)
                if err.status in (400, 422, 500) and request.response_schema is not None and self._downgrade(mode, err):
                    continue  # negotiated a structured-output mode this endpoint accepts: send again at once
                if err.status in (400, 422, 500) and request.tools and _TOOLS_REFUSAL.search(err.detail):
                    raise _ToolsRefused(err.detail) from None
                if err.status == 400 and self._adapt_params(err):
                    continue
                if err.status not in _RETRY_STATUS:
                    raise _typed(err, self.cfg.base_url) from None
                if err.status in _OVERLOAD_STATUS:
                    self.limiter.on_rate_limited()
                last = err
            except _Transient as err:
                last = err
                if err.unreachable and self.fail_fast:
                    raise _typed(err, self.cfg.base_url) from None
                if err.unreachable:
                    self._failures_in_a_row += 1
                    if self._failures_in_a_row > self.cfg.max_retries:
                        self._dead_until = time.monotonic() + self.cfg.backoff_max_s
                        self._dead_reason = str(err)
            if attempt >= self.cfg.max_retries:
                break
            cap = min(self.cfg.backoff_max_s, self.cfg.backoff_base_s * 2**attempt)
            pause = min(_retry_after(last) or random.uniform(0, cap), self.cfg.backoff_max_s)
            if time.monotonic() + pause > deadline:
                break
            await asyncio.sleep(pause)
            attempt += 1
        raise _typed(last, self.cfg.base_url, attempts=attempt + 1) from None

    def _adapt_params(self, err: _HTTPStatusError) -> bool:
        """Rename or leave out a parameter the endpoint refused (remembered); whether anything changed."""
        renamed = _PARAM_RENAMED.search(err.detail)
        if renamed and renamed[1] not in self._renamed:
            self._renamed[renamed[1]] = renamed[2]
        elif (refused := _PARAM_REFUSED.search(err.detail)) and refused[1] in _OPTIONAL_PARAMS - self._dropped:
            self._dropped.add(refused[1])
        else:
            return False
        log.warning("%s: %s; adapted from now on", self.cfg.base_url, _short(err))
        return True

    def _check_alive(self) -> None:
        if time.monotonic() < self._dead_until:
            raise ProviderUnreachable(f"{self.cfg.base_url} is unreachable ({self._failures_in_a_row} connection "
                                      f"failures in a row; last: {_short(self._dead_reason)})")

    def _downgrade(self, mode: str, err: _HTTPStatusError) -> bool:
        """Move to the next structured-output mode when the endpoint refused this one; whether it did."""
        if self.cfg.structured_output != "auto" or not _FORMAT_REFUSAL.search(err.detail):
            return False
        if self.mode != mode:  # another request already negotiated past this mode
            return True
        index = MODES.index(mode)
        if index + 1 >= len(MODES):
            return False
        self.mode = MODES[index + 1]
        log.warning("%s refused response_format %s (%s); using %s from now on", self.cfg.base_url, mode,
                    _short(err), self.mode)
        return True

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
        """One POST /chat/completions: the decoded JSON body, or _HTTPStatusError / _Transient."""
        try:
            async with self._session().post(self._url, data=body, headers={"Idempotency-Key": idempotency_key}) as resp:
                payload = await resp.read()
                if resp.status >= 400:
                    raise _HTTPStatusError(resp.status, payload, resp.headers.get("retry-after"))
        except (TimeoutError, aiohttp.ClientConnectionError) as err:
            raise _Transient(f"{type(err).__name__}: {err}" if str(err) else type(err).__name__) from None
        except aiohttp.ClientPayloadError as err:
            raise _Transient(f"truncated body ({err})", unreachable=False) from None
        try:
            return orjson.loads(payload)
        except orjson.JSONDecodeError:
            # a 200 whose body is cut or garbled: the answer was lost on the way, worth another try
            raise _Transient(f"the body is not JSON ({len(payload)} bytes)", unreachable=False) from None


def _typed(err: Exception | None, url: str | None, attempts: int = 1) -> ProviderError:
    """The typed error a failed request ends with."""
    if isinstance(err, _HTTPStatusError):
        if err.status in _OVERLOAD_STATUS:
            return ProviderOverloaded(f"{url} stayed overloaded after {attempts} attempt(s): {_short(err)}")
        if err.status in _RETRY_STATUS:
            return ProviderUnreachable(f"{url} failed {attempts} time(s); last: {_short(err)}")
        if 400 <= err.status < 500:
            return ProviderRefused(f"{url} refused the request ({_short(err)})")
        return ProviderError(f"{url} answered with a server error ({_short(err)})")
    if isinstance(err, _Transient) and not err.unreachable:
        return ProviderError(f"{url} failed {attempts} time(s); last: {_short(err)}")
    return ProviderUnreachable(f"{url} failed {attempts} time(s); last timeout or connection error: {_short(err)}")


def _short(err: Exception | str | None) -> str:
    return str(err).splitlines()[0][:300] if err else ""


def _wire_message(message: dict[str, Any]) -> dict[str, Any]:
    """A chat message as every server accepts it: `content` always present (some chat templates index it)."""
    if message.get("content") is None:
        return {**message, "content": ""}
    return message


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


def _usage(raw: Any) -> Usage:
    u = raw.get("usage") if isinstance(raw, dict) else None
    if not isinstance(u, dict):
        return Usage()
    return Usage(prompt_tokens=u.get("prompt_tokens") or 0, completion_tokens=u.get("completion_tokens") or 0,
                 total_tokens=u.get("total_tokens") or 0)


def _add(total: Usage, more: Usage) -> Usage:
    return Usage(prompt_tokens=total.prompt_tokens + more.prompt_tokens,
                 completion_tokens=total.completion_tokens + more.completion_tokens,
                 total_tokens=total.total_tokens + more.total_tokens)


@contextlib.asynccontextmanager
async def open(cfg: ModelConfig, wh: Warehouse | None = None, run_id: str | None = None
               ) -> AsyncIterator[OpenAICompatibleModel]:
    """The endpoint's model with its warehouse response cache and usage ledger, flushed and closed on exit;
    with several `model.endpoints`, an `EndpointPool` of them."""
    urls = cfg.endpoint_urls()
    model: OpenAICompatibleModel | EndpointPool
    if len(urls) > 1:
        model = EndpointPool(cfg, urls, wh, run_id, member=lambda url: OpenAICompatibleModel(
            cfg.model_copy(update={"base_url": url, "endpoints": []}), fail_fast=True))
    else:
        model = OpenAICompatibleModel(cfg.model_copy(update={"base_url": urls[0] if urls else None}), wh, run_id)
    try:
        yield model
    finally:
        await model.aclose()
        await asyncio.to_thread(model.close)


__all__ = ["OpenAICompatibleModel", "parse_json_answer"]
