"""`eval`: a policy rolled out on held-out environments; one EvalRun row plus its rollouts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from arenaforge.schemas.config import Config
from arenaforge.schemas.models import Environment, Rollout
from arenaforge.tasks.rollout.episodes import env_failure_rejections
from arenaforge.tasks.train.env_selection import select_envs
from arenaforge.tasks.train.job_config import config_for
from arenaforge.tasks.train.job_sandbox import sandbox_pool
from arenaforge.tasks.train.model_paths import local_model_path
from arenaforge.tasks.train.params import EpisodeParams, EvalParams, PolicyParams
from arenaforge.tasks.train.policy_engines import load_tokenizer, policy_engine
from arenaforge.warehouse import Warehouse, recorded_run

EVAL_COLUMNS = ("f1", "recall", "precision", "calls_per_task", "format_errors_per_task", "episodes")


async def eval_job(params: EvalParams) -> dict[str, Any]:
    """Evaluate a policy on held-out environments (default: the test split); one EvalRun row plus its rollouts."""
    cfg = config_for(params)
    wh = Warehouse.from_config(cfg.warehouse)
    envs = select_envs(wh, params.envs)
    if any(e.native is not None for e in envs):  # an imported suite compares whole results and states: never cut them
        cfg = cfg.model_copy(update={"sandbox": cfg.sandbox.model_copy(
            update={"output_limit_bytes": max(cfg.sandbox.output_limit_bytes, 8 << 20)})})
    return await evaluate_policy(cfg, wh, params, local_model_path(params.model_path), envs, params.episode,
                                 samples=params.samples, seed=params.seed, concurrency=params.concurrency,
                                 flow_params=params.model_dump(mode="json"), suite=params.envs.suite)


async def evaluate_policy(cfg: Config, wh: Warehouse, policy: PolicyParams, path: str, envs: Sequence[Environment],
                    episode: EpisodeParams, *, samples: int, seed: int, concurrency: int,
                    label: str | None = None, flow_params: dict[str, Any] | None = None,
                    suite: str | None = None, rollouts_out: list[Rollout] | None = None) -> dict[str, Any]:
    """Roll out the policy at `path` on `envs` (an `eval` run); the EvalRun's numbers and ids. `rollouts_out`
    receives this run's rollouts (the warehouse keeps an identical rollout once, under the run that first made it)."""
    from arenaforge.tasks.rollout.evaluate import EvalConfig, evaluate

    tokenizer = load_tokenizer(path)
    run_params = flow_params or {"model_path": path, "label": label, "env_ids": [e.id for e in envs]}
    with recorded_run(wh, "eval", run_params) as (run, counts):
        engine = policy_engine(policy, path, tokenizer)
        eval_cfg = EvalConfig(samples=samples, concurrency=concurrency, rollout=episode.rollout_config(seed))
        async with sandbox_pool(cfg) as pool:
            summary, rollouts = await evaluate(engine, tokenizer, pool, envs, eval_cfg, run.id, label, suite)
        if rollouts_out is not None:
            rollouts_out.extend(rollouts)
        rejections = env_failure_rejections(rollouts, "eval")
        counts["rollouts"] = wh.upsert([summary, *rollouts, *rejections]) - 1 - len(rejections)
        counts["episodes"] = summary.episodes
    return {"run_id": run.id, "eval_id": summary.id, "policy": path, **({"label": label} if label else {}),
            **{k: getattr(summary, k) for k in EVAL_COLUMNS}, "statuses": summary.statuses,
            "failure_reasons": summary.failure_reasons,
            **({"suite": suite, "native": summary.native} if suite or summary.native is not None else {})}
