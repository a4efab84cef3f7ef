"""`train sft`: supervised fine-tuning on an SFT export; its curves are drawn when it ends."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from arenaforge.schemas.errors import InputError
from arenaforge.services.run_scope import RunScope
from arenaforge.tracks.train.job_config import out_dir_for
from arenaforge.tracks.train.model_paths import local_model_path
from arenaforge.tracks.train.params import SftParams


async def sft_job(scope: RunScope, params: SftParams) -> dict[str, Any]:
    """SFT as the scope's (`train-sft`) run; its curves drawn from the steps it recorded."""
    from arenaforge.tracks.train.curves import write_run_curves
    from arenaforge.tracks.train.sft import SftConfig, train_sft

    cfg, wh = scope.cfg, scope.wh
    data = params.data or str(Path(cfg.out_dir) / "sft.jsonl")
    if not Path(data).is_file():
        raise InputError(f"train-sft: data {data}: no such file (write it with `arenaforge sft export`, or set data)")
    sft_cfg = SftConfig.from_params(params, out_dir=str(out_dir_for(cfg, params.out_dir, params.experiment)))
    summary = train_sft(sft_cfg, local_model_path(params.model_path), data, wh, scope.run_id)
    scope.counts["steps"] = summary.last_step - summary.first_step + 1
    scope.counts["skipped_examples"] = summary.skipped
    curves = write_run_curves(wh, cfg.out_dir, "train-sft", summary.experiment, scope.run_id)
    return {"run_id": scope.run_id, "experiment": summary.experiment, "first_step": summary.first_step,
            "last_step": summary.last_step, "resumed_from": summary.resumed_from,
            "last_loss": summary.metrics[-1]["loss"] if summary.metrics else None,
            **({"curves_png": str(curves)} if curves else {})}
