"""Environment synthesis: tools verified in the sandbox, bad code rejected with reasons, self-test with the F1 reward."""

from __future__ import annotations

import asyncio
import json

import pytest

from arenaforge.environments.reward import answer_matches
from arenaforge.environments.runtime import create_pool, run_calls
from arenaforge.schemas.models import Environment
from arenaforge.tracks.envs.build_tools import IMPLEMENT_TOOL, ToolBuilder
from arenaforge.tracks.envs.check_env import self_test
from arenaforge.tracks.envs.decompose_qa import QASpec, QASynthesizer
from arenaforge.tracks.envs.knowledge import load_sample
from arenaforge.tracks.envs.synthesize_env import synthesize_environments
from arenaforge.tracks.envs.tool_impl import check_doc, stdlib_only
from tests.support.envs_fakes import EnvsResponder, model_cfg, sandbox_cfg
from tests.support.models import http_model as chat_model
from tests.support.models import offline_model
from tests.support.requirements import require_docker


@pytest.fixture(scope="module")
def sample():
    src = load_sample()
    yield src
    src.close()


@pytest.fixture(scope="module")
def instances(sample):
    return asyncio.run(QASynthesizer(offline_model()).synthesize(sample, QASpec(n=8, max_hops=3, seed=11))).instances


async def _with_pool(fn, **cfg):
    pool = await create_pool(sandbox_cfg(**cfg))
    try:
        return await fn(pool)
    finally:
        await pool.shutdown()


def test_offline_environments_verify_in_the_sandbox(sample, instances) -> None:
    async def go(pool):
        result = await synthesize_environments(ToolBuilder(offline_model(), sample), pool, instances, max_attempts=1)
        envs = [d.environment() for d in result.drafts]
        replays = [await run_calls(pool, env, env.calls) for env in envs]
        probes = {}
        for d in result.drafts:  # other valid arguments never return a gold answer of the same tool
            env = d.environment()
            probes[env.id] = [(t, await run_calls(pool, env, [(t.name, p) for p in t.probes])) for t in d.tools]
        return result, envs, replays, probes

    result, envs, replays, probes = asyncio.run(_with_pool(go))
    assert not result.rejections and len(envs) == len(instances)
    for env, obs in zip(envs, replays, strict=True):
        assert stdlib_only(env.code) == []
        assert env.data_var == "DATA" and set(env.initial_state) == {t.name for t in env.tools}
        assert len(env.gold_answers) == sum(s.needs_tool for s in next(q for q in instances if q.id == env.qa_id).sub_qas)
        for call, o in zip(env.calls, obs, strict=True):
            assert o.outcome == "ok" and answer_matches(call.answer, o.output)
        for tool, outs in probes[env.id]:
            assert tool.probes, f"{tool.name} has no probe arguments"
            golds = [c.answer for c in tool.calls]
            assert not any(o.outcome == "ok" and any(answer_matches(g, o.output) for g in golds) for o in outs)
    docs = [t for env in envs for t in env.tools]
    assert all(check_doc(t.model_dump()) for t in docs)
    assert any("fields" in t.parameters["properties"] or "decimals" in t.parameters["properties"] for t in docs)


def test_self_test_scores_gold_empty_and_random(sample, instances) -> None:
    async def go(pool):
        result = await synthesize_environments(ToolBuilder(offline_model(), sample), pool, instances[:4], max_attempts=0)
        good = result.drafts[0].environment()
        broken = good.model_copy(update={"gold_answers": ["not an answer anywhere"] * len(good.gold_answers)})
        return await asyncio.gather(self_test(pool, good), self_test(pool, broken))

    (good_checks, details), (broken_checks, _) = asyncio.run(_with_pool(go))
    assert all(good_checks.values()), details
    assert "gold 1.000" in details[0] and "no calls 0.000" in details[0]
    assert broken_checks["self_test_gold_f1"] is False


# "leak": code that returns the answer it was told whatever it is asked; the source says otherwise for other records
@pytest.mark.parametrize(("bad", "reason"), [("loop", "timeout"), ("leak", "wrong_answer")])
def test_bad_generated_code_is_rejected_with_its_reason(sample, scripted_openai, bad, reason) -> None:
    from arenaforge.tracks.envs.decompose_qa import QASynthesizer

    scripted_openai.responder = EnvsResponder()
    with chat_model(model_cfg(scripted_openai.url)) as model:
        qas = asyncio.run(QASynthesizer(model).synthesize(sample, QASpec(n=2, seed=0))).instances
        scripted_openai.responder = EnvsResponder(bad_code=bad)

        async def go(pool):
            return await synthesize_environments(ToolBuilder(model, sample), pool, qas, max_attempts=1)

        result = asyncio.run(_with_pool(go, call_timeout_s=0.5))
    assert not result.drafts
    assert {r.reason for r in result.rejections} == {reason}
    assert all("attempt 1" in r.detail for r in result.rejections)  # regenerated once, then given up


def test_openai_tools_and_non_json_answers(sample, scripted_openai) -> None:
    from arenaforge.tracks.envs.decompose_qa import QASynthesizer

    scripted_openai.responder = EnvsResponder()
    with chat_model(model_cfg(scripted_openai.url)) as model:
        qas = asyncio.run(QASynthesizer(model).synthesize(sample, QASpec(n=3, seed=0))).instances

        async def go(pool):
            ok = await synthesize_environments(ToolBuilder(model, sample), pool, qas, max_attempts=0)
            scripted_openai.responder = EnvsResponder(not_json_steps=(IMPLEMENT_TOOL,))
            bad = await synthesize_environments(ToolBuilder(model, sample), pool, qas[:1], max_attempts=1)
            return ok, bad

        ok, bad = asyncio.run(_with_pool(go))
    assert len(ok.drafts) == 3 and not ok.rejections
    env = ok.drafts[0].environment()
    assert all("verbose" in t.parameters["properties"] for t in env.tools)  # complexity augmentation kept
    probes = ok.drafts[0].tools[0].probes  # other records of the source, each with the source's answer
    assert probes and all(p.answer for p in probes)
    assert not bad.drafts and bad.rejections[0].reason == "invalid_model_output"


@pytest.mark.docker
def test_accepted_environments_pass_self_test_in_docker(sample, instances) -> None:
    require_docker()

    async def go(pool):
        assert pool.backend == "docker"
        result = await synthesize_environments(ToolBuilder(offline_model(), sample), pool, instances, max_attempts=1)
        envs: list[Environment] = [d.environment() for d in result.drafts]
        return envs, await asyncio.gather(*(self_test(pool, env) for env in envs))

    envs, tested = asyncio.run(_with_pool(go, backend="docker"))
    assert len(envs) == len(instances)
    for checks, details in tested:
        assert all(checks.values()), details
    assert json.dumps(envs[0].initial_state)
