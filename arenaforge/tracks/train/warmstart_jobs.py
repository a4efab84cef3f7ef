"""Warm starts: the gold-call replay data (`warmstart`) and the SFT on it that precedes GRPO (`train-warmstart`)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from arenaforge.schemas.errors import InputError
from arenaforge.schemas.models import Environment
from arenaforge.services.run_scope import RunScope
from arenaforge.tracks.train.env_selection import select_envs
from arenaforge.tracks.train.params import GrpoParams, SftParams, WarmstartParams

log = logging.getLogger("arenaforge.train")
WARMSTART_MAX_LENGTH = 1024  # tokens of one warm-start example (long SFT-track trajectories are cut)


async def replay_examples(scope: RunScope, envs: Sequence[Environment], copy_variants: int,
                          seed: int) -> tuple[list[dict[str, Any]], list[Any]]:
    """Gold-call replays of `envs` in the scope's sandbox, then `copy_variants` copy-forced variants of each; and the
    rejections."""
    from arenaforge.tracks.train.copy_forcing import copy_forced_variants
    from arenaforge.tracks.train.warmstart import warmstart_examples

    replays, rejections = await warmstart_examples(await scope.sandbox(), envs)
    variants = [v for e in replays for v in copy_forced_variants(e, copy_variants, seed)]
    return replays + variants, rejections


async def warmstart_sft(scope: RunScope, params: GrpoParams, envs: Sequence[Environment], model_path: str,
                        out: Path) -> dict[str, Any]:
    """SFT from `model_path` on the gold-call replays of `envs` plus kept SFT-track trajectories (`out`), as the
    scope's (`train-warmstart`) run.

    Returns its final checkpoint. Re-running the same experiment resumes (or, when done, reuses) it.
    """
    from arenaforge.tracks.train.checkpoints import CheckpointManager
    from arenaforge.tracks.train.sft import SftConfig, train_sft
    from arenaforge.tracks.train.warmstart import trajectory_examples, write_jsonl

    wh, counts = scope.wh, scope.counts
    examples, rejections = await replay_examples(scope, envs, params.warmstart_copy_variants, params.seed)
    counts["rejections"] = wh.upsert([r.model_copy(update={"run_id": scope.run_id}) for r in rejections])
    if not examples:
        raise InputError(f"warm start: no environment's gold calls replay cleanly ({len(rejections)} rejected)")
    variants = sum(1 for e in examples if e.get("copy_forced"))
    replays = len(examples) - variants
    if params.warmstart_trajectories:
        examples += trajectory_examples(wh, params.warmstart_trajectories)
    counts["examples"] = len(examples)
    data = write_jsonl(examples, out / "warmstart.jsonl")
    log.info(f"warm start: {replays} gold-call replays + {variants} copy-forced variants + "
             f"{len(examples) - replays - variants} SFT-track trajectories, {params.warmstart_steps} steps")
    warm = SftParams(epochs=10**6, max_steps=params.warmstart_steps, batch_size=params.warmstart_batch_size,
                     lr=params.warmstart_lr, max_length=WARMSTART_MAX_LENGTH,
                     checkpoint_every=params.warmstart_steps, keep_optimizer=1, seed=params.seed)
    sft_cfg = SftConfig.from_params(warm, out_dir=str(out), warmup_steps=min(20, params.warmstart_steps // 10),
                                    decay=True, device=params.device)
    summary = train_sft(sft_cfg, model_path, data, wh, scope.run_id)
    counts["steps"] = summary.last_step - summary.first_step + 1
    final = CheckpointManager(out).checkpoints()[-1]
    return {"run_id": scope.run_id, "checkpoint": str(final.path), "examples": len(examples), "replays": replays,
            "copy_forced": variants, "trajectories": len(examples) - replays - variants, "rejected": len(rejections),
            "steps": final.step, "last_loss": summary.metrics[-1]["loss"] if summary.metrics else None}


async def warmstart_job(scope: RunScope, params: WarmstartParams) -> dict[str, Any]:
    """Write the warm-start SFT conversations of the selected environments to <out>/warmstart.jsonl."""
    from arenaforge.tracks.train.warmstart import write_jsonl

    wh, counts = scope.wh, scope.counts
    envs = select_envs(wh, params.envs)
    examples, rejections = await replay_examples(scope, envs, params.copy_variants, params.seed)
    counts["rejections"] = wh.upsert([r.model_copy(update={"run_id": scope.run_id}) for r in rejections])
    path = write_jsonl(examples, Path(params.out or Path(scope.cfg.out_dir) / "warmstart") / "warmstart.jsonl")
    counts["examples"] = len(examples)
    return {"run_id": scope.run_id, "path": str(path), "examples": len(examples), "rejected": len(rejections)}
