"""The openai backend over real HTTP against the scripted server."""

from __future__ import annotations

import asyncio
import json
import socket

import pytest

from arenaforge.schemas.config import ModelConfig
from arenaforge.schemas.errors import (
    FailureKind,
    ParseError,
    ProviderError,
    ProviderOverloaded,
    ProviderRefused,
    ProviderUnreachable,
)
from arenaforge.services.models import ChatRequest, complete_json
from arenaforge.services.models.limiter import AdaptiveLimiter
from arenaforge.testing.scripted_openai import Reply, chat_completion
from arenaforge.tracks.sft.chains import PROPOSE_CHAINS
from arenaforge.tracks.sft.score_queries import SCORE_QUERY
from tests.support.models import http_model as chat_model
from tests.support.models import http_step

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
GEO = http_step("geo", SCHEMA)


def _cfg(url: str, **kw) -> ModelConfig:
    base = dict(backend="openai", base_url=url, model="scripted", max_retries=3, backoff_base_s=0.01, backoff_max_s=0.05)
    base.update(kw)
    return ModelConfig(**base)


def _ask(model, step="t", messages=None, **kw):
    req = ChatRequest(step=step, messages=messages or [{"role": "user", "content": "hi"}], **kw)
    return asyncio.run(model.complete(req))


def test_tool_call_response_round_trips(scripted_openai):
    scripted_openai.script([chat_completion(tool_calls=[{"name": "get_weather", "arguments": {"city": "Oslo"}}])])
    with chat_model(_cfg(scripted_openai.url)) as model:
        tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}}]
        resp = _ask(model, tools=tools)
    call = resp.message.tool_calls[0]
    assert call.function.name == "get_weather"
    assert json.loads(call.function.arguments) == {"city": "Oslo"}
    assert scripted_openai.chat_requests()[0]["tools"] == tools


def test_structured_output_reasks_on_invalid_json_then_validates(scripted_openai):
    scripted_openai.script([chat_completion(content="not json"), chat_completion(content='{"town": 1}'),
                            chat_completion(content='```json\n{"city": "Oslo"}\n```')])
    with chat_model(_cfg(scripted_openai.url, max_reasks=2)) as model:
        parsed = asyncio.run(complete_json(model, GEO, [{"role": "user", "content": "where?"}]))
    assert parsed == {"city": "Oslo"}
    reqs = scripted_openai.chat_requests()
    assert len(reqs) == 3
    assert "invalid" in reqs[1]["messages"][-1]["content"] and "JSON" in reqs[1]["messages"][-1]["content"]
    assert "schema violation" in reqs[2]["messages"][-1]["content"]
    assert reqs[0]["response_format"]["json_schema"]["schema"] == SCHEMA


def test_structured_output_gives_up_with_parse_error(scripted_openai):
    scripted_openai.responder = lambda req: chat_completion(content="[1, 2")
    with chat_model(_cfg(scripted_openai.url, max_reasks=1)) as model:
        with pytest.raises(ParseError, match="still invalid after 1 re-asks"):
            asyncio.run(complete_json(model, GEO, [{"role": "user", "content": "x"}]))
    assert len(scripted_openai.chat_requests()) == 2


@pytest.mark.parametrize("status", [408, 429, 502, 503, 504])
def test_retries_statuses_that_can_succeed(scripted_openai, status):
    scripted_openai.script([Reply(status=status), Reply(status=status), chat_completion(content="fine")])
    with chat_model(_cfg(scripted_openai.url)) as model:
        resp = _ask(model)
    assert resp.message.content == "fine"
    assert resp.attempts == 3


@pytest.mark.parametrize(("status", "error", "kind"), [
    (400, ProviderRefused, FailureKind.PROVIDER_BAD_REQUEST),  # this request is refused whatever we do
    (404, ProviderRefused, FailureKind.PROVIDER_BAD_REQUEST),
    (500, ProviderError, FailureKind.PROVIDER_FAILED),  # a server error: a retry would get the same
])
def test_statuses_that_cannot_succeed_fail_at_once_with_their_kind(scripted_openai, status, error, kind):
    scripted_openai.responder = lambda req: Reply(status=status)
    with chat_model(_cfg(scripted_openai.url)) as model:
        with pytest.raises(error) as info:
            _ask(model)
    assert type(info.value) is error and info.value.kind == kind and f"HTTP {status}" in str(info.value)
    assert len(scripted_openai.chat_requests()) == 1


def test_overload_that_persists_is_provider_overloaded_in_one_line(scripted_openai):
    scripted_openai.responder = lambda req: Reply(status=429)
    with chat_model(_cfg(scripted_openai.url, max_retries=2)) as model:
        with pytest.raises(ProviderOverloaded) as info:
            _ask(model)
    assert "after 3 attempt(s)" in str(info.value) and "\n" not in str(info.value)
    assert len(scripted_openai.chat_requests()) == 3 and info.value.kind == FailureKind.PROVIDER_OVERLOADED


def test_retry_after_is_capped_by_backoff_max(scripted_openai):
    # a server asking for an hour's pause must not stall the run: the pause is capped by backoff_max_s
    scripted_openai.script([Reply(status=429, headers={"Retry-After": "3600"}), chat_completion(content="fine")])
    with chat_model(_cfg(scripted_openai.url, backoff_max_s=0.05, retry_budget_s=30)) as model:
        resp = _ask(model)
    assert resp.message.content == "fine" and resp.attempts == 2


def test_unreachable_endpoint_is_typed_and_declared_dead():
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with chat_model(_cfg(f"http://127.0.0.1:{port}/v1", max_retries=1, backoff_max_s=30)) as model:
        async def two():
            first = await model.complete(ChatRequest(step="s", messages=[{"role": "user", "content": "a"}]))
            return first
        with pytest.raises(ProviderUnreachable, match="failed 2 time") as info:
            asyncio.run(two())
        assert info.value.kind == FailureKind.PROVIDER_UNREACHABLE
        # the endpoint is now taken for dead: the next request fails at once instead of spending its own budget
        with pytest.raises(ProviderUnreachable, match="is unreachable"):
            _ask(model)


def test_truncated_body_is_retried(scripted_openai):
    scripted_openai.script([Reply(body='{"id": "chatcmpl-1", "choices": [{"mess'), chat_completion(content="whole")])
    with chat_model(_cfg(scripted_openai.url)) as model:
        resp = _ask(model)
    assert resp.message.content == "whole" and resp.attempts == 2


def test_json_that_is_not_a_chat_completion_is_a_parse_error(scripted_openai):
    scripted_openai.responder = lambda req: Reply(body={"unexpected": True})
    with chat_model(_cfg(scripted_openai.url, max_retries=0)) as model:
        with pytest.raises(ParseError, match="not a chat completion") as info:
            _ask(model)
    assert "\n" not in str(info.value)


def test_cache_makes_rerun_free_and_usage_is_recorded(scripted_openai, tmp_warehouse):
    scripted_openai.responder = lambda req: chat_completion(content=req["messages"][-1]["content"].upper())
    prompts = [f"q{i}" for i in range(5)]

    def run_all():
        with chat_model(_cfg(scripted_openai.url), tmp_warehouse, run_id="run-x") as model:
            async def go():
                return await asyncio.gather(*[model.complete(ChatRequest(step="s", messages=[{"role": "user", "content": p}])) for p in prompts])
            return asyncio.run(go())

    first = run_all()
    assert [r.message.content for r in first] == ["Q0", "Q1", "Q2", "Q3", "Q4"]
    assert len(scripted_openai.chat_requests()) == 5
    second = run_all()
    assert len(scripted_openai.chat_requests()) == 5, "a cached re-run must make no calls"
    assert all(r.cached for r in second) and [r.message.content for r in second] == ["Q0", "Q1", "Q2", "Q3", "Q4"]
    assert tmp_warehouse.count("llm_cache") == 5
    _, rows = tmp_warehouse.query("SELECT cost_class, count(*), sum(prompt_tokens) FROM llm_calls GROUP BY 1 ORDER BY 1")
    assert rows == [("cached", 5, 0), ("sent", 5, 50)], "a cache hit spends no tokens"


def test_cache_key_covers_model_params_messages_schema():
    base = ChatRequest(step="a", messages=[{"role": "user", "content": "x"}])
    assert base.cache_key("m") == ChatRequest(step="other-step", messages=base.messages).cache_key("m")
    assert base.cache_key("m") != base.cache_key("m2")
    assert base.cache_key("m") != base.model_copy(update={"temperature": 0.1}).cache_key("m")
    assert base.cache_key("m") != base.model_copy(update={"response_schema": SCHEMA}).cache_key("m")
    assert base.cache_key("m") != ChatRequest(step="a", messages=[{"role": "user", "content": "y"}]).cache_key("m")


def test_adaptive_concurrency_grows_when_healthy_and_halves_on_429(scripted_openai):
    scripted_openai.responder = lambda req: Reply(body=chat_completion(content="ok"), delay_s=0.05)
    cfg = _cfg(scripted_openai.url, concurrency_initial=2, concurrency_max=32)
    with chat_model(cfg) as model:
        async def go():
            reqs = [model.complete(ChatRequest(step="s", messages=[{"role": "user", "content": str(i)}])) for i in range(120)]
            await asyncio.gather(*reqs)
        asyncio.run(go())
    assert scripted_openai.max_in_flight > 8, "the limit should grow past its initial 2 while healthy"
    assert scripted_openai.max_in_flight <= 32

    limiter = AdaptiveLimiter(initial=16, maximum=64)
    limiter.on_rate_limited()
    assert limiter.limit == 8 and not limiter.slow_start
    limiter.on_success()
    assert 8 < limiter.limit < 9


def test_limiter_hands_slots_over_in_order_and_takes_back_a_cancelled_waiters_slot():
    async def go() -> tuple[list[int], int, int]:
        limiter = AdaptiveLimiter(initial=2, maximum=2)
        order: list[int] = []
        release = asyncio.Event()

        async def call(i: int) -> None:
            async with limiter.slot():
                order.append(i)
                assert limiter.in_flight <= 2
                await release.wait()

        tasks = [asyncio.create_task(call(i)) for i in range(6)]
        await asyncio.sleep(0.01)
        assert order == [0, 1] and limiter.in_flight == 2
        tasks[2].cancel()  # waiting: must leave the queue without taking a slot
        await asyncio.sleep(0.01)
        release.set()
        await asyncio.gather(*tasks, return_exceptions=True)
        return order, limiter.in_flight, limiter.peak

    order, in_flight, peak = asyncio.run(go())
    assert order == [0, 1, 3, 4, 5], "waiters get slots first come, first served; the cancelled one never runs"
    assert in_flight == 0 and peak == 2


def test_limiter_serves_a_higher_priority_waiter_first():
    from arenaforge.services.models.limiter import request_priority

    async def go() -> list[str]:
        limiter = AdaptiveLimiter(initial=1, maximum=1)
        order: list[str] = []
        release = asyncio.Event()

        async def call(name: str, *levels: int) -> None:
            with request_priority(*levels):
                async with limiter.slot():
                    order.append(name)
                    await release.wait()

        first = asyncio.create_task(call("first", 0))
        while limiter.in_flight == 0:  # the slot is held before the others queue
            await asyncio.sleep(0)
        queued = [asyncio.create_task(call(name, *levels)) for name, levels in
                  [("new-a", (0,)), ("new-b", (0,)), ("later-stage", (2,)), ("middle-stage", (1,)),
                   ("later-stage-item-9", (2, -9)), ("later-stage-item-3", (2, -3))]]
        while len(limiter._waiters) < len(queued):
            await asyncio.sleep(0)
        queued[0].cancel()  # a cancelled waiter leaves the queue and never runs
        release.set()
        await asyncio.gather(first, *queued, return_exceptions=True)
        assert limiter.in_flight == 0
        return order

    # higher levels first, compared in turn (with equal leading levels, the shorter tuple first), then first come
    assert asyncio.run(go()) == ["first", "later-stage", "later-stage-item-3", "later-stage-item-9", "middle-stage",
                                 "new-b"]


def test_cache_key_is_the_hash_of_the_canonical_json_of_the_request():
    """Keys written before the orjson fast path (and before `tool_choice` existed) stay valid: same bytes as
    arenaforge.schemas.ids.canonical_json of the request's fields of that time."""
    from arenaforge.schemas.ids import canonical_json, sha256_hex

    req = ChatRequest(step="s", messages=[{"role": "user", "content": "Ünïcode, quotes \" and 1.5"}],
                      response_schema=SCHEMA, temperature=0.7, seed=3, max_tokens=128)
    expected = sha256_hex(canonical_json({"model": "m", **req.model_dump(mode="json", exclude={"step", "tool_choice"})}))
    assert req.cache_key("m") == expected
    assert req.model_copy(update={"tool_choice": "none"}).cache_key("m") != expected


def test_every_request_is_booked_with_its_cost_class_and_wasted_tokens(scripted_openai, tmp_warehouse):
    # one answer re-asked once (its 15 tokens are wasted), one server error, one answer that never validates
    scripted_openai.script([chat_completion(content="no json here"), chat_completion(content='{"city": "Oslo"}'),
                            Reply(status=500), chat_completion(content="[1"), chat_completion(content="[1")])
    with chat_model(_cfg(scripted_openai.url, max_reasks=1), tmp_warehouse, run_id="run-acc") as model:
        async def go():
            assert await complete_json(model, GEO, [{"role": "user", "content": "a"}]) == {"city": "Oslo"}
            with pytest.raises(ProviderError):
                await model.complete(ChatRequest(step="chat", messages=[{"role": "user", "content": "b"}]))
            with pytest.raises(ParseError):
                await complete_json(model, GEO, [{"role": "user", "content": "c"}])
        asyncio.run(go())
    _, rows = tmp_warehouse.query("SELECT step, cost_class, error_kind, reasks, prompt_tokens + completion_tokens, "
                                  "wasted_tokens FROM llm_calls WHERE run_id = 'run-acc' ORDER BY call_id")
    assert rows == [("geo", "sent", None, 1, 30, 15), ("chat", "failed", "provider_failed", 0, 0, 0),
                    ("geo", "failed", "invalid_output", 0, 30, 30)]


def test_every_request_carries_a_seed_and_the_steps_token_budget(scripted_openai):
    scripted_openai.responder = lambda req: chat_completion(content='{"city": "Oslo"}')
    with chat_model(_cfg(scripted_openai.url, seed=11, max_tokens=4096)) as model:
        async def go():
            await complete_json(model, SCORE_QUERY, [{"role": "user", "content": "a"}], SCHEMA)
            await complete_json(model, SCORE_QUERY, [{"role": "user", "content": "b"}], SCHEMA, seed=5)
            await model.complete(ChatRequest(step="free", messages=[{"role": "user", "content": "c"}]))
        asyncio.run(go())
    first, second, third = scripted_openai.chat_requests()
    assert (first["seed"], second["seed"], third["seed"]) == (11, 5, 11)
    assert first["max_tokens"] == SCORE_QUERY.max_tokens < 4096 and third["max_tokens"] == 4096


def test_request_timeout_starts_when_the_request_is_sent(scripted_openai):
    # one slot: the second request waits ~1.2 s in our own queue, then is answered 1.2 s after it is sent; its
    # timeout (2 s) counts only the second part, so both succeed with no retry
    scripted_openai.responder = lambda req: Reply(body=chat_completion(content="late"), delay_s=1.2)
    with chat_model(_cfg(scripted_openai.url, timeout_s=2.0, concurrency_initial=1, concurrency_max=1,
                         max_retries=0)) as model:
        async def go():
            return await asyncio.gather(*[model.complete(ChatRequest(step="s", messages=[
                {"role": "user", "content": str(i)}])) for i in range(2)])
        answers = asyncio.run(go())
    assert [a.message.content for a in answers] == ["late", "late"] and all(a.attempts == 1 for a in answers)
    assert scripted_openai.max_in_flight == 1 and len(scripted_openai.chat_requests()) == 2


def test_a_lazy_prompt_is_rendered_for_a_model_and_never_for_rules(scripted_openai):
    from tests.support.models import offline_model

    rendered: list[str] = []

    def prompt() -> str:
        rendered.append("where?")
        return "where?"

    scripted_openai.responder = lambda req: chat_completion(content='{"city": "Oslo"}')
    with chat_model(_cfg(scripted_openai.url)) as model:
        assert asyncio.run(complete_json(model, GEO, prompt)) == {"city": "Oslo"}
    assert rendered == ["where?"]
    assert scripted_openai.chat_requests()[0]["messages"] == [{"role": "user", "content": "where?"}]
    answer = asyncio.run(complete_json(offline_model(), PROPOSE_CHAINS, prompt, {"type": "object"}))
    assert answer == {"chains": []} and rendered == ["where?"]  # rules answered without the text
