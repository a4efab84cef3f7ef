"""Evaluating on an imported suite (issue 15): episodes in the real sandbox are scored with the suite's own metric
(`EvalRun.native`) beside our F1. BFCL multi-turn episodes play every user turn, with missed tools revealed at
their turn; a policy that replays the gold calls passes BFCL's checks, one that answers without calls fails them
for the reason BFCL gives. A user's own class: the final-state hash."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

from arenaforge.environments.runtime import create_pool
from arenaforge.schemas.config import SandboxConfig
from arenaforge.schemas.models import Environment
from arenaforge.testing.scripted_policy import ScriptedEngine
from arenaforge.tracks.train.env_selection import matching_envs
from arenaforge.tracks.train.params import EnvSelection, EpisodeParams
from arenaforge.tracks.train.rollout.episodes import user_turns
from arenaforge.tracks.train.rollout.evaluate import EvalConfig, evaluate
from tests.support.requirements import require_bfcl
from tests.support.rl import call_text, tiny_model_path

EVAL = EvalConfig(rollout=EpisodeParams(temperature=0.0, max_turns=12, max_length=400_000, max_tokens_per_turn=4096).rollout_config())


def user_turn_index(env: Environment, prompt: str) -> int:
    """The latest user turn the prompt has reached (each turn's message is in the prompt once it was given)."""
    return max(k for k, text in enumerate(user_turns(env)) if text[:80] in prompt)  # (tool JSON may not round-trip)


def gold_policy(envs: list[Environment]):
    """One gold call per step, the current user turn's, then a short answer; the turn comes from the prompt."""

    def respond(prompt: str, _index: int) -> str:
        env = next(e for e in envs if e.question in prompt)
        done = prompt.count("<tool_response>")
        turn = user_turn_index(env, prompt)
        budget = sum(t["calls"] for t in env.native.turns[: turn + 1]) if env.native.turns else len(env.calls)
        if done < budget:
            call = env.calls[done]
            return call_text(call.tool, **call.arguments)
        return "Done."

    return respond


def run_eval(envs: list[Environment], respond, suite: str):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_path())

    async def scenario():
        cfg = SandboxConfig(backend="process", pool_size=2, output_limit_bytes=8 << 20, call_timeout_s=30.0)
        async with await create_pool(cfg) as pool:
            return await evaluate(ScriptedEngine(tok, respond), tok, pool, envs, EVAL, "run_native", suite=suite)

    return asyncio.run(scenario())


def test_bfcl_multi_turn_episodes_scored_the_way_bfcl_scores_them(tmp_warehouse) -> None:
    require_bfcl()
    from arenaforge.tracks.envs.import_bfcl import import_suite, locate

    async def imported():
        async with await create_pool(SandboxConfig(backend="process", pool_size=2, output_limit_bytes=8 << 20)) as pool:
            return await import_suite(pool, locate(), ["base", "miss_func"], limit=3)

    envs, _ = asyncio.run(imported())
    tmp_warehouse.upsert(envs)
    chosen = matching_envs(tmp_warehouse, EnvSelection(suite="bfcl_multi_turn_miss_func"))
    assert chosen and {e.native.suite for e in chosen} == {"bfcl_multi_turn_miss_func"} and any(e.tool_turns for e in chosen)

    for suite in ("bfcl_multi_turn_base", "bfcl_multi_turn_miss_func"):  # (miss_func tasks share base's first turns)
        chosen = [e for e in envs if e.native.suite == suite]
        summary, rollouts = run_eval(chosen, gold_policy(chosen), suite)
        assert summary.native == 1.0 and summary.suite == suite and summary.episodes == len(chosen) == 3
        assert all(r.native_passed for r in rollouts) and summary.f1 > 0
    lazy, lazy_rollouts = run_eval(chosen, lambda prompt, i: "I cannot help with that.", suite)
    assert lazy.native == 0.0 and lazy.f1 == 0.0
    assert all("multi_turn:empty_turn_model_response (turn 0)" == r.native_reason for r in lazy_rollouts)
    tmp_warehouse.upsert([summary, *rollouts])
    assert tmp_warehouse.get(type(summary), summary.id).native == 1.0


def test_a_users_class_is_scored_by_its_final_state(tmp_path: Path) -> None:
    from arenaforge.tracks.envs.import_python import import_environment, python_environment, read_calls, read_source
    from tests.tasks.envs.test_import_python import BANK, CALLS, STATE

    (tmp_path / "bank.py").write_text(BANK)
    (tmp_path / "calls.json").write_text(json.dumps(CALLS))
    sources = [read_source(f"{tmp_path / 'bank.py'}:Bank")]
    draft = python_environment(sources, initial_state=STATE, calls=read_calls(tmp_path / "calls.json"),
                               init_args={"fee": 1.5}, question="Pay the rent from A1 to A2, freeze A2, tell me A1's balance.")

    async def imported():
        async with await create_pool(SandboxConfig(backend="process", pool_size=1)) as pool:
            return await import_environment(pool, draft, "my-bank", sources)

    env = asyncio.run(imported())
    summary, rollouts = run_eval([env], gold_policy([env]), "my-bank")
    assert (summary.native, summary.f1) == (1.0, 0.5)  # F1: the one gold answer found with 3 calls (p = 1/3, r = 1)
    skipped = env.calls[1:]  # no transfer: the balance is read, the state is not the gold one

    def partial(prompt: str, _index: int) -> str:
        done = prompt.count("<tool_response>")
        return call_text(skipped[done].tool, **skipped[done].arguments) if done < len(skipped) else "Done."

    wrong, wrong_rollouts = run_eval([env], partial, "my-bank")
    assert wrong.native == 0.0 and wrong_rollouts[0].native_reason == "final state differs from the gold calls' final state"
