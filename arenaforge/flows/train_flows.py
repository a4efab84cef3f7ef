"""Prefect flows of the training capability: `rollout`, `train-grpo`, `train-sft`, `warmstart`, `eval`.

Composition only: each flow takes one params model (typed forms in the UI), opens the run's training scope
(`open_job_scope`: config, warehouse, sandbox pool and the run's `runs` row, finished by the scope), runs the
matching job from `arenaforge.tracks.train` (`<name>_job.py`) in it as one task, and leaves artifacts under
stable keys: `<flow>-summary` (the run's numbers; for train-grpo the test-split table untrained / warm start /
warm start + GRPO) and `<flow>-curves` (warm-start loss and GRPO curves, skipped steps marked; the jobs draw
them from the steps they recorded). The jobs log one line per step on the `arenaforge` logger; the flows
forward it to the run's log, so the UI shows reward, F1, zero-variance share, skipped steps and loss while it
trains. Jobs write records at step boundaries, so a killed run loses at most one step and a re-run of
`train-grpo`/`train-sft` resumes from the newest checkpoint.
Retries stay off here: a training step is not idempotent mid-flight, and the jobs resume instead.
"""

from __future__ import annotations

import base64
import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from arenaforge.flows.artifacts import SANDBOX, in_prefect_run, markdown_table, summary_table
from arenaforge.schemas.config import Config
from arenaforge.tracks.train.evaluation import eval_job
from arenaforge.tracks.train.grpo_job import grpo_job
from arenaforge.tracks.train.job_config import config_for, open_job_scope
from arenaforge.tracks.train.params import EvalParams, GrpoParams, RolloutParams, SftParams, WarmstartParams
from arenaforge.tracks.train.rollout_job import rollout_job
from arenaforge.tracks.train.sft_job import sft_job
from arenaforge.tracks.train.warmstart_jobs import warmstart_job

rollout_task = task(rollout_job, name="rollouts", cache_policy=NO_CACHE, tags=[SANDBOX])
grpo_task = task(grpo_job, name="grpo-steps", cache_policy=NO_CACHE, tags=[SANDBOX])
sft_task = task(sft_job, name="sft-steps", cache_policy=NO_CACHE)
warmstart_task = task(warmstart_job, name="warmstart-data", cache_policy=NO_CACHE, tags=[SANDBOX])
eval_task = task(eval_job, name="evaluate", cache_policy=NO_CACHE, tags=[SANDBOX])

EVAL_HEADERS = {"label": "policy", "f1": "F1", "recall": "recall", "precision": "precision",
                "calls_per_task": "calls", "format_errors_per_task": "format errors", "episodes": "episodes"}


class _ToRunLogger(logging.Handler):
    """Forwards `arenaforge` log records (from job threads too) to the flow run's logger."""

    def __init__(self, target: logging.LoggerAdapter) -> None:
        super().__init__(logging.INFO)
        self.target = target

    def emit(self, record: logging.LogRecord) -> None:
        self.target.info(record.getMessage())


@contextlib.contextmanager
def run_log(name: str = "arenaforge") -> Iterator[None]:
    """While the block runs, lines logged on `name` appear in this flow run's log (and terminal)."""
    source = logging.getLogger(name)
    handler = _ToRunLogger(get_run_logger()) if in_prefect_run() else logging.StreamHandler()
    level = source.level
    source.addHandler(handler)
    source.setLevel(logging.INFO)
    try:
        yield
    finally:
        source.removeHandler(handler)
        source.setLevel(level)


def eval_rows(evals: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per evaluated stage with the table's columns, numbers rounded."""
    return [{EVAL_HEADERS[k]: (round(v, 3) if isinstance(v, float) else v)
             for k, v in {"label": label, **row}.items() if k in EVAL_HEADERS} for label, row in evals.items()]


def _summarise(flow_name: str, result: dict[str, Any], note: str | None = None) -> dict[str, Any]:
    scalars = {k: v for k, v in result.items() if not isinstance(v, (dict, list))}
    summary_table(f"{flow_name}: result", scalars, key=f"{flow_name}-summary", note=note,
                  description=f"{flow_name} run {result.get('run_id', '')}")
    return result


def _curves_artifact(flow_name: str, result: dict[str, Any]) -> None:
    """The curves PNG the job drew (named by run id, never overwritten) as the `<flow>-curves` artifact."""
    png = result.get("curves_png")
    if not png or not in_prefect_run():
        return
    from prefect.artifacts import create_markdown_artifact

    path = Path(png)
    experiment = result.get("experiment", flow_name)
    data = base64.b64encode(path.read_bytes()).decode()
    create_markdown_artifact(key=f"{flow_name}-curves", description=f"{flow_name} {experiment} curves",
                             markdown=f"## {flow_name} {experiment}\n\n![curves](data:image/png;base64,{data})\n\n"
                             f"Saved to `{path.resolve()}`\n", _sync=True)


@flow(name="rollout")
async def rollout(params: RolloutParams = RolloutParams()) -> dict[str, Any]:
    """Roll out a policy on warehouse environments; rollouts are stored with the F1 reward."""
    async with open_job_scope(params, "rollout") as scope:
        result = await rollout_task(scope, params)
    return _summarise("rollout", result)


def on_configured_cluster(params: GrpoParams, cfg: Config) -> GrpoParams:
    """`params` scaled out to the config's cluster (train.ray_address) unless they name one themselves: resolved here,
    before the run opens, so its `runs` row records the cluster the job goes to."""
    if params.verl.ray_address or not cfg.train.ray_address:
        return params
    return params.model_copy(update={"verl": params.verl.model_copy(update={"ray_address": cfg.train.ray_address})})


@flow(name="train-grpo")
async def train_grpo(params: GrpoParams = GrpoParams()) -> dict[str, Any]:
    """Warm start (optional), GRPO and evaluation on the test split; or the verl job (verl.ray_address)."""
    params = on_configured_cluster(params, config_for(params))  # its run records the cluster it scales out to
    with run_log():
        async with open_job_scope(params, "train-grpo") as scope:
            result = await grpo_task(scope, params)
    _curves_artifact("train-grpo", result)
    note = None
    if result.get("eval"):
        note = "### Test split\n\n" + markdown_table(eval_rows(result["eval"]))
    return _summarise("train-grpo", result, note)


@flow(name="train-sft")
async def train_sft(params: SftParams = SftParams()) -> dict[str, Any]:
    """Supervised fine-tuning on an SFT export (loss on assistant tokens only)."""
    with run_log():
        async with open_job_scope(params, "train-sft") as scope:
            result = await sft_task(scope, params)
    _curves_artifact("train-sft", result)
    return _summarise("train-sft", result)


@flow(name="warmstart")
async def warmstart(params: WarmstartParams = WarmstartParams()) -> dict[str, Any]:
    """Warm-start SFT data: each environment's gold calls replayed in the sandbox, as messages+tools JSONL."""
    async with open_job_scope(params, "warmstart") as scope:
        result = await warmstart_task(scope, params)
    return _summarise("warmstart", result)


@flow(name="eval")
async def evaluate(params: EvalParams = EvalParams()) -> dict[str, Any]:
    """Evaluate a policy on the test split (F1, recall, precision, calls, format errors)."""
    with run_log():
        async with open_job_scope(params, "eval") as scope:
            result = await eval_task(scope, params)
    return _summarise("eval", result)
