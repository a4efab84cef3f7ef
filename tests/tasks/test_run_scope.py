"""A recorded run scope keeps its run's `runs` row; a stage run is a row of its own on the same pool."""

from __future__ import annotations

import asyncio

import pytest

from arenaforge.schemas.config import Config, WarehouseConfig
from arenaforge.schemas.models import Run
from arenaforge.services.run_scope import recorded_scope
from arenaforge.warehouse import Warehouse


def test_the_scope_records_its_run_and_each_stage_run(tmp_path) -> None:
    cfg = Config(warehouse=WarehouseConfig(path=str(tmp_path / "wh")), out_dir=str(tmp_path / "out"))
    wh = Warehouse(cfg.warehouse.path)
    pool = object()

    async def run() -> tuple[str | None, str | None]:
        async with recorded_scope(cfg, wh, "train-grpo", {"steps": 2}, training=True) as scope:
            scope.use_sandbox(pool)
            with scope.stage_run("eval", {"label": "untrained"}) as stage:
                assert await stage.sandbox() is pool and stage.run_id != scope.run_id
                stage.counts["episodes"] = 3
            scope.counts["steps"] = 2
            return scope.run_id, stage.run_id

    outer, inner = asyncio.run(run())
    runs = {r.id: r for r in wh.load(Run)}
    assert (runs[outer].flow, runs[outer].status, runs[outer].counts) == ("train-grpo", "completed", {"steps": 2})
    assert (runs[inner].flow, runs[inner].status, runs[inner].counts) == ("eval", "completed", {"episodes": 3})


def test_a_failed_stage_fails_its_run_and_the_scope_s(tmp_path) -> None:
    cfg = Config(warehouse=WarehouseConfig(path=str(tmp_path / "wh")), out_dir=str(tmp_path / "out"))
    wh = Warehouse(cfg.warehouse.path)

    async def run() -> None:
        async with recorded_scope(cfg, wh, "train-grpo", {}, training=True) as scope:
            with scope.stage_run("train-warmstart", {}):
                raise ValueError("no replay")

    with pytest.raises(ValueError):
        asyncio.run(run())
    assert sorted((r.flow, r.status) for r in wh.load(Run)) == [("train-grpo", "failed"), ("train-warmstart", "failed")]
