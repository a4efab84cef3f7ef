"""`train grpo` on a Ray cluster: the verl job written (and submitted) instead of training here."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from arenaforge.schemas.config import Config
from arenaforge.schemas.errors import InputError
from arenaforge.schemas.models import Environment
from arenaforge.tasks.train.env_selection import matching_envs
from arenaforge.tasks.train.model_paths import model_path_for
from arenaforge.tasks.train.params import GrpoParams
from arenaforge.warehouse import Warehouse, recorded_run


def verl_job(params: GrpoParams, cfg: Config, wh: Warehouse, envs: Sequence[Environment], out: Path) -> dict[str, Any]:
    from arenaforge.tasks.verl.job import VerlJobSpec, submit, write_job

    v = params.verl
    if params.lora_rank or params.precision != "fp32":  # verl sets these in its own actor config, not ours
        raise InputError("train grpo: --lora-rank and --precision are for training here; verl's actor has its own "
                         "(actor_rollout_ref.model.lora_rank, its FSDP mixed precision) in the written job")
    spec = VerlJobSpec.from_params(params, model_path=model_path_for(params.model_path), out_dir=str(out / "verl"))
    eval_envs = matching_envs(wh, params.envs.model_copy(update={"split": "test", "env_ids": [], "limit": None}))
    with recorded_run(wh, "train-grpo", params.model_dump(mode="json")) as (run, counts):
        job = write_job(spec, envs, eval_envs)
        job_id = None if v.spec_only or not v.ray_address else submit(job, v.ray_address)
        counts["environments"] = len(envs)
    return {"run_id": run.id, "verl_job": str(Path(spec.out_dir) / "job.json"), "ray_job_id": job_id,
            "entrypoint": job.entrypoint}
