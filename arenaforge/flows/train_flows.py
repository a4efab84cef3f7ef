"""Prefect flows of the training capability: `rollout`, `train-grpo`, `train-sft`, `warmstart`, `eval`.

Composition only: each flow takes one params model (typed forms in the UI), runs the matching
job from `arenaforge.tasks.train.jobs` as one task, and leaves a summary artifact. Jobs record their own
`runs` row and write records at step boundaries, so a killed run loses at most one step and a
re-run of `train-grpo`/`train-sft` resumes from the newest checkpoint. Retries stay off here:
a training step is not idempotent mid-flight, and the jobs resume instead.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, task
from prefect.cache_policies import NO_CACHE

from arenaforge.flows.artifacts import SANDBOX, step_curves, summary_table
from arenaforge.schemas.kinds_training import TrainStep
from arenaforge.tasks.train import jobs
from arenaforge.tasks.train.jobs import EvalParams, GrpoParams, RolloutParams, SftParams, WarmstartParams

rollout_task = task(jobs.rollout_job, name="rollouts", cache_policy=NO_CACHE, tags=[SANDBOX])
grpo_task = task(jobs.grpo_job, name="grpo-steps", cache_policy=NO_CACHE, tags=[SANDBOX])
sft_task = task(jobs.sft_job, name="sft-steps", cache_policy=NO_CACHE)
warmstart_task = task(jobs.warmstart_job, name="warmstart-data", cache_policy=NO_CACHE, tags=[SANDBOX])
eval_task = task(jobs.eval_job, name="evaluate", cache_policy=NO_CACHE, tags=[SANDBOX])


def _summarise(title: str, result: dict[str, Any]) -> dict[str, Any]:
    summary_table(title, {k: v for k, v in result.items() if not isinstance(v, (dict, list))},
                  key=f"{title}-{result.get('run_id', '')}")
    return result


def _curves(title: str, result: dict[str, Any], params: Any) -> dict[str, Any]:
    """This run's per-step loss/reward as a plot artifact (PNG also under the config's out_dir)."""
    if result.get("run_id"):
        cfg = jobs.config_for(params)
        steps = jobs.warehouse_for(cfg).load(TrainStep, where="run_id = ?", params=[result["run_id"]])
        experiment = result.get("experiment", "")
        step_curves(steps, key=f"{title}-{experiment}-curves", out_dir=cfg.out_dir, title=f"{title} {experiment}")
    return result


@flow(name="rollout")
def rollout(params: RolloutParams) -> dict[str, Any]:
    return _summarise("rollout", rollout_task(params))


@flow(name="train-grpo")
def train_grpo(params: GrpoParams) -> dict[str, Any]:
    """GRPO on one node, or the verl job (submitted as a Ray job when verl.ray_address is set)."""
    return _curves("train-grpo", _summarise("train-grpo", grpo_task(params)), params)


@flow(name="train-sft")
def train_sft(params: SftParams) -> dict[str, Any]:
    return _curves("train-sft", _summarise("train-sft", sft_task(params)), params)


@flow(name="warmstart")
def warmstart(params: WarmstartParams) -> dict[str, Any]:
    """Warm-start SFT data: each environment's gold calls replayed in the sandbox, as messages+tools JSONL."""
    return _summarise("warmstart", warmstart_task(params))


@flow(name="eval")
def evaluate(params: EvalParams) -> dict[str, Any]:
    return _summarise("eval", eval_task(params))
