"""What every training job reads first: the config its params name (with their warehouse) and its output folder."""

from __future__ import annotations

from pathlib import Path

from arenaforge.schemas.config import Config, load_config
from arenaforge.tasks.train.params import _Params


def config_for(params: _Params) -> Config:
    return load_config(params.config_path, overrides={"warehouse.path": params.db})


def out_dir_for(cfg: Config, out_dir: str | None, experiment: str) -> Path:
    """An experiment's checkpoint folder: `out_dir`, or <config out_dir>/train, then the experiment's name."""
    return Path(out_dir or Path(cfg.out_dir) / "train") / experiment
