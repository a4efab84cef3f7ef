"""`arenaforge envs synth --pipeline stream` through the real CLI and Prefect: the batch pipeline's records."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from arenaforge.flows.cli import app
from arenaforge.warehouse import Warehouse
from tests.support.requirements import SHARED_DATA

pytestmark = pytest.mark.prefect_server
TABLES = ["qa_instances", "qa_verifications", "environments", "env_merges", "distractor_sets", "rejections"]


def _synth(db: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["--db", str(db), "envs", "synth", *args], catch_exceptions=False,
                                env={"COLUMNS": "200", "NO_COLOR": "1"})
    return result.exit_code, result.output


def _ids(db: Path) -> dict[str, list[str]]:
    wh = Warehouse(db)
    return {t: [r[0] for r in wh.query(f"SELECT id FROM {t} ORDER BY id")[1]] for t in TABLES}


def test_stream_flow_writes_the_batch_flows_records(prefect_server, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ARENAFORGE_SANDBOX__BACKEND", "process")
    args = ["--source", "sample", "--n", "8", "--seed", "1", "--batch-size", "5"]
    if SHARED_DATA.is_dir():  # two sources: the stream meets their QAs interleaved
        args += ["--source", "tau2_retail", "--shared-data", str(SHARED_DATA)]
    batch_code, batch_out = _synth(tmp_path / "batch.duckdb", *args)
    stream_code, stream_out = _synth(tmp_path / "stream.duckdb", *args, "--pipeline", "stream")
    assert batch_code == stream_code == 0, batch_out + stream_out
    batch = _ids(tmp_path / "batch.duckdb")
    assert batch["environments"]
    assert _ids(tmp_path / "stream.duckdb") == batch
    _, runs = Warehouse(tmp_path / "stream.duckdb").query("SELECT status FROM v_runs WHERE flow = 'envs'")
    assert runs == [("completed",)]


def test_stream_with_the_percentile_rule_is_a_clear_error(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "arenaforge.flows.cli", "--db", str(tmp_path / "w.duckdb"), "envs",
                           "synth", "--pipeline", "stream", "--keep-rule", "percentile"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0
    assert "threshold only" in done.stderr and "Traceback" not in done.stderr, done.stderr[-2000:]
