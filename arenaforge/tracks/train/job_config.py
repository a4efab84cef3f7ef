"""What every training job reads first: the config its params name (with their warehouse), the run scope it runs in,
and its output folder."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from arenaforge.schemas.config import Config, load_config
from arenaforge.services.run_scope import RunScope, recorded_scope
from arenaforge.tracks.train.params import _Params
from arenaforge.warehouse import Warehouse


def config_for(params: _Params) -> Config:
    return load_config(params.config_path, overrides={"warehouse.path": params.db})


@contextlib.asynccontextmanager
async def open_job_scope(params: _Params, flow: str) -> AsyncIterator[RunScope]:
    """The training scope of one `flow` run with these params: their config and warehouse, the run's `runs` row."""
    cfg = config_for(params)
    async with recorded_scope(cfg, Warehouse.from_config(cfg.warehouse), flow, params.model_dump(mode="json"),
                              training=True) as scope:
        yield scope


def out_dir_for(cfg: Config, out_dir: str | None, experiment: str) -> Path:
    """An experiment's checkpoint folder: `out_dir`, or <config out_dir>/train, then the experiment's name."""
    return Path(out_dir or Path(cfg.out_dir) / "train") / experiment
