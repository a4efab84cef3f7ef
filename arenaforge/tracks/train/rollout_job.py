"""`rollout`: a policy rolled out on warehouse environments; rollouts stored with the F1 reward."""

from __future__ import annotations

from typing import Any

from arenaforge.services.run_scope import RunScope
from arenaforge.tracks.train.env_selection import select_envs
from arenaforge.tracks.train.model_paths import local_model_path
from arenaforge.tracks.train.params import RolloutParams
from arenaforge.tracks.train.policy_engines import load_tokenizer, policy_engine
from arenaforge.tracks.train.rollout.episodes import env_failure_rejections


async def rollout_job(scope: RunScope, params: RolloutParams) -> dict[str, Any]:
    """Roll out a policy on warehouse environments; rollouts are stored with the F1 reward (in the scope's run)."""
    from arenaforge.tracks.train.rollout.episodes import run_rollouts

    wh, counts = scope.wh, scope.counts
    envs = select_envs(wh, params.envs)
    path = local_model_path(params.model_path)
    tokenizer = load_tokenizer(path)
    engine = policy_engine(params, path, tokenizer)
    episodes = await run_rollouts(engine, tokenizer, await scope.sandbox(), envs,
                                  params.episode.rollout_config(params.seed), params.samples, params.concurrency)
    rollouts = [e.rollout.model_copy(update={"run_id": scope.run_id}) for e in episodes]
    rejections = env_failure_rejections(rollouts)
    counts["rollouts"] = wh.upsert([*rollouts, *rejections]) - len(rejections)
    counts["env_failures"] = sum(r.status == "env_failure" for r in rollouts)
    scored = [r for r in rollouts if r.status != "env_failure"]
    return {"run_id": scope.run_id, "rollouts": len(rollouts), "env_failures": counts["env_failures"],
            "mean_f1": sum(r.reward.f1 for r in scored) / len(scored) if scored else 0.0}
