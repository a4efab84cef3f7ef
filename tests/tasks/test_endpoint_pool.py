"""`model.endpoints`: several scripted OpenAI-compatible servers over real HTTP used as one model.

Routing by least outstanding requests, a killed replica's requests in flight re-sent elsewhere exactly once
(one usage row per request, nothing lost), an ejected replica back after its health check passes, and a
typed failure when no replica answers.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from arenaforge.schemas.config import ModelConfig
from arenaforge.schemas.errors import ConfigError, ProviderUnreachable
from arenaforge.services.models import ChatRequest, open_chat_model
from arenaforge.services.models.endpoint_pool import EndpointPool
from arenaforge.testing.scripted_openai import Reply, ScriptedOpenAI, chat_completion
from arenaforge.warehouse import Warehouse

HELD_S = 600.0  # a reply this slow never comes before its server is killed


def echo(req: dict) -> Reply:
    """Answer with the question, so each answer can be matched to its request."""
    return Reply(body=chat_completion(content=json.dumps({"echo": req["messages"][-1]["content"]})))


@contextmanager
def servers(n: int) -> Iterator[list[ScriptedOpenAI]]:
    started = []
    try:
        for _ in range(n):
            server = ScriptedOpenAI()
            server.responder = echo
            server.start()
            started.append(server)
        yield started
    finally:
        for server in started:
            server.stop()


def _cfg(urls: list[str], **kw) -> ModelConfig:
    base = dict(backend="openai", endpoints=urls, model="scripted", max_retries=2, backoff_base_s=0.01,
                backoff_max_s=0.05, cache=False)
    base.update(kw)
    return ModelConfig(**base)


SCHEMA = {"type": "object", "properties": {"echo": {"type": "string"}}, "required": ["echo"]}


async def _ask_all(cfg: ModelConfig, questions: list[str], workers: int, wh: Warehouse | None = None,
                   between=None) -> tuple[dict[str, str], EndpointPool]:
    """Each worker asks its share of `questions` one after another; the answers by question, and the pool."""
    answers: dict[str, str] = {}
    queue = list(reversed(questions))
    async with open_chat_model(cfg, wh, "run-1") as model:
        assert isinstance(model.sender, EndpointPool)  # behind the run's cache and usage ledger

        async def worker() -> None:
            while queue:
                q = queue.pop()
                resp = await model.complete(ChatRequest(step="t", messages=[{"role": "user", "content": q}],
                                                        response_schema=SCHEMA))
                answers[q] = resp.parsed["echo"]
                if between is not None:
                    between(model)

        await asyncio.gather(*(worker() for _ in range(workers)))
        stats = model.stats()
    model.stats_at_close = stats  # type: ignore[attr-defined]
    return answers, model


def _asked(server: ScriptedOpenAI) -> list[str]:
    return [r["messages"][-1]["content"] for r in server.chat_requests()]


def test_least_outstanding_routing_sends_less_to_a_slow_replica(tmp_path: Path):
    with servers(3) as (slow, fast_a, fast_b):
        slow.capacity = None
        slow.responder = lambda req: Reply(body=echo(req).body, delay_s=0.3)
        questions = [f"q{i}" for i in range(120)]
        wh = Warehouse(tmp_path / "w.duckdb")
        answers, pool = asyncio.run(_ask_all(_cfg([s.url for s in (slow, fast_a, fast_b)]), questions, workers=6,
                                             wh=wh))
        served = [len(s.chat_requests()) for s in (slow, fast_a, fast_b)]
    assert answers == {q: q for q in questions}
    assert sum(served) == 120 and served[0] < served[1] and served[0] < served[2], served
    _, rows = wh.query("SELECT count(*), count(DISTINCT key), count(*) FILTER (WHERE cost_class = 'sent') FROM llm_calls")
    assert rows == [(120, 120, 120)]


def test_a_killed_replica_loses_nothing_and_its_requests_are_resent_exactly_once(tmp_path: Path):
    with servers(3) as (victim, a, b):
        hold = threading.Event()

        def held_after_five(req: dict) -> Reply:
            if len(victim.chat_requests()) <= 5:
                return echo(req)
            hold.set()
            return Reply(body=echo(req).body, delay_s=HELD_S)

        victim.responder = held_after_five
        killer = threading.Thread(target=lambda: hold.wait(120) and victim.kill())
        killer.start()
        questions = [f"q{i}" for i in range(90)]
        wh = Warehouse(tmp_path / "w.duckdb")
        answers, pool = asyncio.run(_ask_all(_cfg([s.url for s in (victim, a, b)]), questions, workers=8, wh=wh))
        killer.join()
    stats = pool.stats_at_close
    on_victim, elsewhere = Counter(_asked(victim)), Counter(_asked(a)) + Counter(_asked(b))
    answered_by_victim = stats.per_endpoint[0]["answered"]
    cut = [q for q in on_victim if q in elsewhere]  # reached the victim, cut by the kill, answered elsewhere
    assert hold.is_set() and answers == {q: q for q in questions}, "every request answered, with its own answer"
    assert max(elsewhere.values()) == 1 and max(on_victim.values()) == 1, "re-sent exactly once, never twice"
    assert len(elsewhere) == len(questions) - answered_by_victim == len(questions) - (len(on_victim) - len(cut))
    # re-sent: the requests cut in flight, and those routed to the victim that found it gone (never reached it)
    assert 1 <= len(cut) <= stats.resent and stats.resent_failed == 0
    assert [e["ejections"] for e in stats.per_endpoint] == [1, 0, 0]
    _, rows = wh.query("SELECT count(*), count(DISTINCT key), count(*) FILTER (WHERE cost_class = 'sent') FROM llm_calls")
    assert rows == [(90, 90, 90)], "one usage row per request, whichever replica answered"


def test_an_ejected_replica_takes_requests_again_after_its_health_check_passes():
    with servers(2) as (flaky, steady):
        port = int(flaky.url.split(":")[2].split("/")[0])
        flaky.kill()
        revived = ScriptedOpenAI()
        revived.responder = echo

        async def revive_once_ejected(model: EndpointPool) -> None:
            if model.endpoints[0].ejections and revived._loop is None:
                await asyncio.to_thread(revived.start, port)  # the same address, back up

        try:
            cfg = _cfg([flaky.url, steady.url], health_interval_s=0)
            answers: dict[str, str] = {}

            async def until_back() -> EndpointPool:
                # ask until the revived replica answers: its first health check races the revival and fails, and the
                # next comes 0.1 s later, which a fixed number of fast requests could outrun (CI, 2026-12-06)
                deadline = time.monotonic() + 60  # a safety net only
                async with open_chat_model(cfg) as model:
                    while not model.endpoints[0].answered:
                        assert time.monotonic() < deadline, f"not back after {len(answers)} requests: {model.stats()}"
                        q = f"q{len(answers)}"
                        resp = await model.complete(ChatRequest(step="t", messages=[{"role": "user", "content": q}],
                                                                response_schema=SCHEMA))
                        answers[q] = resp.parsed["echo"]
                        await revive_once_ejected(model)
                    model.stats_at_close = model.stats()
                return model

            pool = asyncio.run(until_back())
        finally:
            revived.stop()
    first = pool.stats_at_close.per_endpoint[0]
    assert first["ejections"] == 1 and first["returns"] == 1 and first["answered"] >= 1 and first["healthy"]
    assert all(answers[q] == q for q in answers) and len(revived.chat_requests()) >= 1


def test_no_replica_answering_is_a_typed_failure_with_one_usage_row(tmp_path: Path):
    wh = Warehouse(tmp_path / "w.duckdb")
    cfg = _cfg(["http://127.0.0.1:9/v1", "http://127.0.0.1:7/v1"])

    async def ask() -> None:
        async with open_chat_model(cfg, wh, "run-1") as model:
            await model.complete(ChatRequest(step="t", messages=[{"role": "user", "content": "hi"}]))

    with pytest.raises(ProviderUnreachable) as err:
        asyncio.run(ask())
    assert "127.0.0.1:9" in str(err.value) and "127.0.0.1:7" in str(err.value)
    _, rows = wh.query("SELECT count(*), min(cost_class), min(error_kind) FROM llm_calls")
    assert rows == [(1, "failed", "provider_unreachable")]


def test_endpoints_listed_twice_is_a_config_error():
    with pytest.raises(ConfigError, match="twice"):
        _cfg(["http://127.0.0.1:1/v1", "http://127.0.0.1:1/v1"]).endpoint_urls()
