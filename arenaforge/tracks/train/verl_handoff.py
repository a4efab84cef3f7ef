"""`train grpo` on a Ray cluster: the verl job written (and submitted) instead of training here."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from arenaforge.schemas.errors import InputError
from arenaforge.schemas.models import Environment
from arenaforge.services.run_scope import RunScope
from arenaforge.tracks.train.env_selection import matching_envs
from arenaforge.tracks.train.model_paths import model_path_for
from arenaforge.tracks.train.params import GrpoParams


def verl_job(scope: RunScope, params: GrpoParams, envs: Sequence[Environment], out: Path) -> dict[str, Any]:
    """The verl job of `params` written (and, with a Ray address, submitted) as the scope's run."""
    from arenaforge.tracks.train.verl.job import VerlJobSpec, submit, write_job

    v = params.verl
    if params.lora_rank or params.precision != "fp32":  # verl sets these in its own actor config, not ours
        raise InputError("train grpo: --lora-rank and --precision are for training here; verl's actor has its own "
                         "(actor_rollout_ref.model.lora_rank, its FSDP mixed precision) in the written job")
    spec = VerlJobSpec.from_params(params, model_path=model_path_for(params.model_path), out_dir=str(out / "verl"))
    eval_envs = matching_envs(scope.wh, params.envs.model_copy(update={"split": "test", "env_ids": [], "limit": None}))
    job = write_job(spec, envs, eval_envs)
    job_id = None if v.spec_only or not v.ray_address else submit(job, v.ray_address)
    scope.counts["environments"] = len(envs)
    return {"run_id": scope.run_id, "verl_job": str(Path(spec.out_dir) / "job.json"), "ray_job_id": job_id,
            "entrypoint": job.entrypoint}
