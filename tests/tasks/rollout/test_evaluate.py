"""Evaluation: mean F1/recall/precision/calls, failures reported and not scored."""

from __future__ import annotations

import asyncio

from arenaforge.schemas.kinds_training import EvalRun
from arenaforge.tasks.policy.scripted import ScriptedEngine
from arenaforge.tasks.rollout.evaluate import EvalConfig, evaluate
from tests.support.rl import InProcessPool, solving_policy, tiny_env, tiny_model_path


def test_evaluate_scores_and_reports_failures(tmp_warehouse):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_path())
    good, lazy, broken = tiny_env(), tiny_env(country="Sylvania", capital="Ostia"), tiny_env(country="Latveria")
    envs = [good, lazy, broken]

    def respond(prompt, index):
        env = next(e for e in envs if e.question in prompt)
        return solving_policy(env)(prompt, index) if env is not lazy else "I do not know."

    pool = InProcessPool()
    original_call = pool.call

    async def call(session, tool, args):  # the sandbox dies on Latveria's second call
        if args.get("city") == "Quaxton" and "Latveria" in str(session["DATA"]):
            from arenaforge.schemas.errors import SandboxError
            raise SandboxError("worker killed")
        return await original_call(session, tool, args)

    pool.call = call
    summary, rollouts = asyncio.run(evaluate(ScriptedEngine(tok, respond), tok, pool, envs, EvalConfig(), "run_e"))
    assert summary.episodes == 2 and summary.f1 == 0.5 and summary.recall == 0.5 and summary.calls_per_task == 1.0
    assert summary.statuses == {"finished": 2, "env_failure": 1}
    assert summary.failure_reasons == {"env_failure: call: worker killed": 1}
    tmp_warehouse.upsert([summary, *rollouts])
    assert tmp_warehouse.load(EvalRun)[0].f1 == 0.5
