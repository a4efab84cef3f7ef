"""`arenaforge demo` on a fresh directory: the whole offline pipeline on bundled sample data."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from arenaforge.warehouse import Warehouse

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_demo_fills_the_warehouse_and_reruns_without_duplicates(tmp_path, prefect_server):
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200"}
    cmd = [sys.executable, "-m", "arenaforge.flows.cli", "demo", "--n", "12"]
    first = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert first.returncode == 0, first.stderr[-3000:]
    wh = Warehouse(tmp_path / "arenaforge.lake")  # the default warehouse.path
    counts = {t: wh.count(t) for t in ("tools", "servers", "trajectories", "judge_scores", "qa_instances", "environments")}
    assert all(n > 0 for n in counts.values()), counts
    _, verified = wh.query("SELECT count(*) FILTER (WHERE verified), count(*) FROM v_environments")
    assert verified[0][0] == verified[0][1], "every stored environment passed sandbox verification"
    assert (tmp_path / "out" / "demo" / "sft").is_dir()
    assert "arenaforge demo" in first.stdout
    # it says where it wrote its exports, and they are there
    demo = tmp_path / "out" / "demo"
    for path in (demo / "sft" / "sft.jsonl", demo / "envs" / "verl", demo / "envs" / "harbor",
                 demo / "envs" / "environments.jsonl"):
        assert f": {path}" in first.stdout and path.exists(), path
    assert (demo / "envs" / "verl" / "agent_loops.yaml").is_file() and (demo / "envs" / "verl" / "val.parquet").is_file()
    # every exported row says what made it: the record, its run, the backend and the source
    sft_rows = [json.loads(line) for line in (demo / "sft" / "sft.jsonl").read_text().splitlines()]
    runs = {r[0] for r in wh.query("SELECT id FROM runs")[1]}
    assert sft_rows and all(r["provenance"]["backend"] == "offline" and r["provenance"]["run_id"] in runs
                            and r["provenance"]["source"] == r["server"] for r in sft_rows)
    verl_rows = pq.read_table(demo / "envs" / "verl" / "train.parquet").to_pylist()
    assert verl_rows and all(r["extra_info"]["provenance"]["source"] == r["data_source"].split("/", 1)[1]
                             and r["extra_info"]["provenance"]["run_id"] in runs
                             and r["extra_info"]["provenance"]["record_id"] == r["extra_info"]["env_id"]
                             for r in verl_rows)
    tomls = [tomllib.loads(p.read_text()) for p in (demo / "envs" / "harbor").glob("*/task.toml")]
    assert tomls and all(t["metadata"]["provenance"]["backend"] == "offline" for t in tomls)

    second = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert second.returncode == 0, second.stderr[-3000:]
    # Ingest and the RL track are pure functions of their inputs: a re-run adds nothing.
    for table in ("tools", "servers", "qa_instances", "environments"):
        assert wh.count(table) == counts[table], table
