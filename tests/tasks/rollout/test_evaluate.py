"""Evaluation: mean F1/recall/precision/calls, failures reported and not scored."""

from __future__ import annotations

from arenaforge.schemas.kinds_training import EvalRun
from arenaforge.testing.scripted_policy import ScriptedEngine
from arenaforge.tracks.train.params import EpisodeParams
from arenaforge.tracks.train.rollout.evaluate import EvalConfig, evaluate
from tests.support.rl import dying_before, solving_policy, tiny_env, tiny_model_path, with_pool


def test_evaluate_scores_and_reports_failures(tmp_warehouse):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_path())
    good, lazy, broken = tiny_env(), tiny_env(country="Sylvania", capital="Ostia"), tiny_env(country="Latveria")
    envs = [good, lazy, broken]

    policies = {good.id: solving_policy(good), broken.id: dying_before(solving_policy(broken), {"get_population"})}

    def respond(prompt, index):  # the sandbox's worker is killed as Latveria's episode makes its second call
        env = next(e for e in envs if e.question in prompt)
        return policies[env.id](prompt, index) if env is not lazy else "I do not know."

    cfg = EvalConfig(EpisodeParams(temperature=0.0).rollout_config(), concurrency=1)  # one episode at a time: the kill fails Latveria's episode only
    summary, rollouts = with_pool(lambda pool: evaluate(ScriptedEngine(tok, respond), tok, pool, envs, cfg, "run_e"))
    assert summary.episodes == 2 and summary.f1 == 0.5 and summary.recall == 0.5 and summary.calls_per_task == 1.0
    assert summary.statuses == {"finished": 2, "env_failure": 1}
    [reason] = summary.failure_reasons
    assert reason.startswith("env_failure: call: sandbox failure (") and summary.failure_reasons[reason] == 1
    tmp_warehouse.upsert([summary, *rollouts])
    assert tmp_warehouse.load(EvalRun)[0].f1 == 0.5
