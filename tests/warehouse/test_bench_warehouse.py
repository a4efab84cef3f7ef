"""`arenaforge bench warehouse` at its smallest, as a user runs it: the JSON it prints has each layout's
throughput, read latency and loss counts, and no layout loses or duplicates a row."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest


def test_bench_warehouse_prints_each_layout_and_loses_nothing(tmp_path):
    res = subprocess.run([sys.executable, "-m", "arenaforge.flows.cli", "bench", "warehouse", "--writers", "2",
                          "--batches", "1", "--batch-size", "4", "--calls-per-qa", "1", "--shared", "1", "--repeat", "1",
                          "--no-legacy"], check=False, capture_output=True, text=True, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    out = json.loads(res.stdout[res.stdout.index("{"):])
    assert set(out["layouts"]) == {"single_file", "ducklake_sqlite"} and out["baseline"] == "single_file"
    for name, scenarios in out["layouts"].items():
        assert set(scenarios) == {"one_writer", "four_writers"}, name
        for scenario, figures in scenarios.items():
            assert figures["rows_lost"] == 0 and figures["rows_duplicated"] == 0, (name, scenario)
            assert figures["rows_per_s"] > 0, (name, scenario)
    assert out["layouts"]["ducklake_sqlite"]["four_writers"]["read_p99_s"] > 0  # a reader read while writers wrote
    assert out["goals"]["rows_lost_0"] is True and out["ducklake_sqlite_vs_today_one_writer"] > 0


def test_the_stage_benchmarks_run_on_a_lake_or_on_one_duckdb_file(tmp_path):
    from arenaforge.benchmarks import bench_warehouse_path
    from arenaforge.schemas.errors import ConfigError
    from arenaforge.warehouse import Warehouse
    from arenaforge.warehouse.lake import LakeStore
    from arenaforge.warehouse.single_file import FileStore

    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    assert isinstance(Warehouse(bench_warehouse_path(tmp_path / "a", "file")).store, FileStore)
    assert isinstance(Warehouse(bench_warehouse_path(tmp_path / "b", "lake")).store, LakeStore)
    with pytest.raises(ConfigError, match="unknown warehouse layout 'parquet'"):
        bench_warehouse_path(tmp_path, "parquet")
