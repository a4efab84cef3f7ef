"""RecordWriter: records added one by one are committed in batches, and a failing run still commits them."""

from __future__ import annotations

import asyncio

import pytest

from arenaforge.schemas.models import Rejection
from arenaforge.tracks.envs.stream_writer import RecordWriter
from arenaforge.warehouse import Warehouse


def _rejection(i: int) -> Rejection:
    return Rejection(stage="test", subject=f"qa-{i}", reason="low_quality_score")


def test_records_added_one_by_one_are_committed_in_batches(tmp_path):
    wh = Warehouse(tmp_path / "w.duckdb")

    async def go() -> RecordWriter:
        async with RecordWriter(wh, max_batch=10) as writer:
            for i in range(25):
                writer.add([_rejection(i)])
                await asyncio.sleep(0)  # let the writer run between adds, as stages do
        return writer

    writer = asyncio.run(go())
    assert wh.count("rejections") == writer.written == 25
    assert 1 <= writer.commits < 25


def test_a_failing_run_still_commits_what_it_added(tmp_path):
    wh = Warehouse(tmp_path / "w.duckdb")

    async def go() -> None:
        async with RecordWriter(wh) as writer:
            writer.add([_rejection(1), _rejection(2)])
            raise RuntimeError("a stage failed")

    with pytest.raises(RuntimeError, match="a stage failed"):
        asyncio.run(go())
    assert wh.count("rejections") == 2
