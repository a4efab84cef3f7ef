"""`train grpo`: evaluate the start, warm-start (optional), GRPO, evaluate again; or hand the job to verl."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from arenaforge.schemas.errors import ConfigError
from arenaforge.schemas.models import Rollout
from arenaforge.services.policy.registry import engine_kind
from arenaforge.services.run_scope import RunScope
from arenaforge.tracks.train.env_selection import matching_envs, select_envs
from arenaforge.tracks.train.evaluation import eval_run_params, evaluate_policy
from arenaforge.tracks.train.job_config import out_dir_for
from arenaforge.tracks.train.model_paths import BASE_POLICIES, local_model_path
from arenaforge.tracks.train.params import GrpoParams
from arenaforge.tracks.train.policy_engines import engine_factory
from arenaforge.tracks.train.verl_handoff import verl_job
from arenaforge.tracks.train.warmstart_jobs import warmstart_sft

log = logging.getLogger("arenaforge.train")


async def grpo_job(scope: RunScope, params: GrpoParams,
                   eval_rollouts: dict[str, list[Rollout]] | None = None) -> dict[str, Any]:
    """GRPO on one node as the scope's (`train-grpo`) run, or — with verl.ray_address / verl.spec_only — the verl job
    hand-off. The evaluations and the warm start are runs of their own (`scope.stage_run`), on the scope's pool.

    `eval_rollouts` receives each evaluated stage's rollouts by label (for paired comparisons: the warehouse keeps an
    identical rollout once, under the run that first made it)."""
    cfg, wh = scope.cfg, scope.wh
    envs = select_envs(wh, params.envs)
    out = out_dir_for(cfg, params.out_dir, params.experiment)
    engine = engine_kind(params.engine)
    if params.warmstart_steps and (not engine.warm_start or params.verl.ray_address or params.verl.spec_only):
        raise ConfigError("--warmstart-steps trains a local copy (engines hf, vllm-local); for a vllm server or verl "
                          "run `train warmstart` + `train sft` and serve/pass that checkpoint")
    if params.verl.ray_address or params.verl.spec_only:
        return verl_job(scope, params, envs, out)
    from arenaforge.tracks.train.checkpoints import CheckpointManager
    from arenaforge.tracks.train.curves import write_run_curves
    from arenaforge.tracks.train.run_grpo import train_grpo_in
    from arenaforge.tracks.train.splits import ensure_splits

    path = local_model_path(params.model_path)
    held_out = params.envs.model_copy(update={"split": "test", "env_ids": [], "limit": params.eval_limit})
    test_envs = matching_envs(wh, held_out) if params.evaluate else []
    if params.evaluate and not test_envs:
        log.info("no test environments in this warehouse's split: nothing to evaluate on")
    evals: dict[str, dict[str, Any]] = {}
    eval_episode = params.episode.model_copy(update={"temperature": 0.0})

    async def stage_eval(label: str, model: str) -> None:
        if test_envs:
            log.info(f"evaluating {label} on {len(test_envs)} test environments")
            with scope.stage_run("eval", eval_run_params(model, label, test_envs)) as stage:
                evals[label] = await evaluate_policy(stage, params, model, test_envs, eval_episode, samples=1,
                                                     seed=params.seed, concurrency=params.concurrency, label=label,
                                                     rollouts_out=None if eval_rollouts is None else
                                                     eval_rollouts.setdefault(label, []))
            log.info(f"{label}: test F1 {evals[label]['f1']:.3f}")

    await stage_eval("untrained" if params.model_path in (None, *BASE_POLICIES) else "start", path)
    warm: dict[str, Any] = {}
    if params.warmstart_steps:
        with scope.stage_run("train-warmstart", params.model_dump(mode="json")) as stage:
            warm = await warmstart_sft(stage, params, envs, path, out.with_name(f"{out.name}-warmstart"))
        path = warm["checkpoint"]
        await stage_eval("warm start", path)
    factory = engine_factory(params.model_copy(update={"model_path": path}))
    structures = {env_id: row.stratum for env_id, row in
                  ensure_splits(wh, scheme=params.envs.scheme, test_share=params.envs.test_share,
                                seed=params.envs.split_seed).items()}
    trained = params.model_copy(update={"skip_forced_tokens": params.skip_forced_tokens and engine.skips_forced_tokens})
    summary = await train_grpo_in(scope, trained, str(out), path, factory, envs, structures)
    scope.counts["steps"] = summary.last_step - summary.first_step + 1
    scope.counts["checkpoints"] = len(summary.checkpoints)
    final = str(CheckpointManager(out).checkpoints()[-1].path)
    await stage_eval("warm start + GRPO" if warm else "GRPO", final)
    curves = write_run_curves(wh, cfg.out_dir, "train-grpo", summary.experiment, scope.run_id, warm.get("run_id"))
    last = summary.metrics[-1] if summary.metrics else {}
    steps = summary.metrics
    return {"run_id": scope.run_id, "experiment": summary.experiment, "first_step": summary.first_step,
            "last_step": summary.last_step, "resumed_from": summary.resumed_from, "checkpoints": summary.checkpoints,
            "final_checkpoint": final, "last_metrics": last,
            "skipped_steps": int(sum(m.get("skipped", 0) for m in steps)),
            "zero_variance_share": _mean_of(steps, "zero_variance_share"),
            **({"warmstart": warm} if warm else {}), **({"eval": evals} if evals else {}),
            **({"curves_png": str(curves)} if curves else {})}


def _mean_of(rows: Sequence[dict[str, float]], key: str) -> float | None:
    values = [r[key] for r in rows if key in r]
    return round(sum(values) / len(values), 4) if values else None
