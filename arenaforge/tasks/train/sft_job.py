"""`train sft`: supervised fine-tuning on an SFT export; its curves are drawn when it ends."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from arenaforge.schemas.errors import InputError
from arenaforge.tasks.train.job_config import config_for, out_dir_for
from arenaforge.tasks.train.model_paths import local_model_path
from arenaforge.tasks.train.params import SftParams
from arenaforge.warehouse import Warehouse, recorded_run


def sft_job(params: SftParams) -> dict[str, Any]:
    from arenaforge.tasks.train.curves import write_run_curves
    from arenaforge.tasks.train.sft import SftConfig, train_sft

    cfg = config_for(params)
    data = params.data or str(Path(cfg.out_dir) / "sft.jsonl")
    if not Path(data).is_file():
        raise InputError(f"train-sft: data {data}: no such file (write it with `arenaforge sft export`, or set data)")
    wh = Warehouse.from_config(cfg.warehouse)
    out = out_dir_for(cfg, params.out_dir, params.experiment)
    sft_cfg = SftConfig.from_params(params, out_dir=str(out))
    with recorded_run(wh, "train-sft", params.model_dump(mode="json")) as (run, counts):
        summary = train_sft(sft_cfg, local_model_path(params.model_path), data, wh, run.id)
        counts["steps"] = summary.last_step - summary.first_step + 1
        counts["skipped_examples"] = summary.skipped
    curves = write_run_curves(wh, cfg.out_dir, "train-sft", summary.experiment, run.id)
    return {"run_id": run.id, "experiment": summary.experiment, "first_step": summary.first_step,
            "last_step": summary.last_step, "resumed_from": summary.resumed_from,
            "last_loss": summary.metrics[-1]["loss"] if summary.metrics else None,
            **({"curves_png": str(curves)} if curves else {})}
