"""`eval`: a policy rolled out on held-out environments; one EvalRun row plus its rollouts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from arenaforge.schemas.config import Config
from arenaforge.schemas.models import Environment, Rollout
from arenaforge.services.run_scope import RunScope, recorded_scope
from arenaforge.tracks.train.env_selection import select_envs
from arenaforge.tracks.train.model_paths import local_model_path
from arenaforge.tracks.train.params import EpisodeParams, EvalParams, PolicyParams
from arenaforge.tracks.train.policy_engines import load_tokenizer, policy_engine
from arenaforge.tracks.train.rollout.episodes import env_failure_rejections
from arenaforge.warehouse import Warehouse

EVAL_COLUMNS = ("f1", "recall", "precision", "calls_per_task", "format_errors_per_task", "episodes")


async def eval_job(scope: RunScope, params: EvalParams) -> dict[str, Any]:
    """Evaluate a policy on held-out environments (default: the test split); one EvalRun row plus its rollouts."""
    envs = select_envs(scope.wh, params.envs)
    if any(e.native is not None for e in envs):  # an imported suite compares whole results and states: never cut them
        scope.cfg = widened_output(scope.cfg)  # before the scope's pool starts: this stage is its first use
    return await evaluate_policy(scope, params, local_model_path(params.model_path), envs, params.episode,
                                 samples=params.samples, seed=params.seed, concurrency=params.concurrency,
                                 suite=params.envs.suite)


def widened_output(cfg: Config) -> Config:
    """`cfg` with the sandbox's output limit raised to 8 MiB (an imported suite's whole results and states)."""
    return cfg.model_copy(update={"sandbox": cfg.sandbox.model_copy(
        update={"output_limit_bytes": max(cfg.sandbox.output_limit_bytes, 8 << 20)})})


def eval_run_params(path: str, label: str | None, envs: Sequence[Environment]) -> dict[str, Any]:
    """The `runs` params of an evaluation that is a stage of another run (a training run's, a benchmark's)."""
    return {"model_path": path, "label": label, "env_ids": [e.id for e in envs]}


async def evaluate_as_run(cfg: Config, wh: Warehouse, policy: PolicyParams, path: str, envs: Sequence[Environment],
                          episode: EpisodeParams, **options: Any) -> dict[str, Any]:
    """`evaluate_policy` as an `eval` run of its own in a training scope of its own (a benchmark's evaluations)."""
    params = eval_run_params(path, options.get("label"), envs)
    async with recorded_scope(cfg, wh, "eval", params, training=True) as scope:
        return await evaluate_policy(scope, policy, path, envs, episode, **options)


async def evaluate_policy(scope: RunScope, policy: PolicyParams, path: str, envs: Sequence[Environment],
                          episode: EpisodeParams, *, samples: int, seed: int, concurrency: int,
                          label: str | None = None, suite: str | None = None,
                          rollouts_out: list[Rollout] | None = None) -> dict[str, Any]:
    """Roll out the policy at `path` on `envs` as the scope's (`eval`) run; the EvalRun's numbers and ids.
    `rollouts_out` receives this run's rollouts (the warehouse keeps an identical rollout once, under the run that
    first made it)."""
    from arenaforge.tracks.train.rollout.evaluate import EvalConfig, evaluate

    tokenizer = load_tokenizer(path)
    engine = policy_engine(policy, path, tokenizer)
    eval_cfg = EvalConfig(samples=samples, concurrency=concurrency, rollout=episode.rollout_config(seed))
    summary, rollouts = await evaluate(engine, tokenizer, await scope.sandbox(), envs, eval_cfg, scope.run_id, label,
                                       suite)
    if rollouts_out is not None:
        rollouts_out.extend(rollouts)
    rejections = env_failure_rejections(rollouts, "eval")
    scope.counts["rollouts"] = scope.wh.upsert([summary, *rollouts, *rejections]) - 1 - len(rejections)
    scope.counts["episodes"] = summary.episodes
    return {"run_id": scope.run_id, "eval_id": summary.id, "policy": path, **({"label": label} if label else {}),
            **{k: getattr(summary, k) for k in EVAL_COLUMNS}, "statuses": summary.statuses,
            "failure_reasons": summary.failure_reasons,
            **({"suite": suite, "native": summary.native} if suite or summary.native is not None else {})}
