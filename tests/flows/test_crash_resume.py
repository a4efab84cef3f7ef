"""A run killed with SIGKILL mid-way loses nothing committed; the re-run completes without duplicates.

The real CLI (`arenaforge envs synth`, offline, bundled sample source) in a subprocess,
reporting to the session's real Prefect server. It is killed right after its first batch of
environments is committed; the re-run must end with exactly the rows of an uninterrupted run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from arenaforge.warehouse import Warehouse

REPO = Path(__file__).resolve().parents[2]
TABLES = ["qa_instances", "environments", "rejections"]
ARGS = ["envs", "synth", "--n", "16", "--batch-size", "4", "--seed", "7"]


def _cmd(db: Path) -> list[str]:
    return [sys.executable, "-m", "arenaforge.flows.cli", "--db", str(db), *ARGS]


def _counts(db: Path) -> dict[str, int]:
    wh = Warehouse(db)
    return {t: wh.count(t) for t in TABLES}


def _env() -> dict[str, str]:
    # INFO logs on: the kill is triggered by the task-finished line.
    return {**os.environ, "NO_COLOR": "1", "PYTHONUNBUFFERED": "1", "PREFECT_LOGGING_LEVEL": "INFO"}


@pytest.mark.slow
def test_sigkill_mid_run_then_rerun_has_every_row_once(tmp_path, prefect_server):
    clean_db = tmp_path / "clean.duckdb"
    done = subprocess.run(_cmd(clean_db), cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    expected = _counts(clean_db)
    assert expected["environments"] >= 8

    db = tmp_path / "killed.duckdb"
    proc = subprocess.Popen(_cmd(db), cwd=tmp_path, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)
    killed_mid_run = False
    deadline = time.monotonic() + 600
    assert proc.stdout is not None
    for line in proc.stdout:  # wait for the first committed batch, then pull the plug
        if "build-environments" in line and "Finished in state Completed" in line:
            os.killpg(proc.pid, signal.SIGKILL)
            killed_mid_run = True
            break
        if time.monotonic() > deadline:
            break
    proc.wait(timeout=60)
    assert killed_mid_run, "the run finished before it could be killed"
    assert proc.returncode == -signal.SIGKILL

    partial = _counts(db)
    assert 0 < partial["environments"] < expected["environments"], partial

    rerun = subprocess.run(_cmd(db), cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert _counts(db) == expected

    again = subprocess.run(_cmd(db), cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr[-2000:]
    assert _counts(db) == expected, "running the step twice must leave row counts unchanged"
