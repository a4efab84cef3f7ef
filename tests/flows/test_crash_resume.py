"""A run killed with SIGKILL at any stage loses nothing committed; its re-run ends with exactly the rows of an
uninterrupted run, and the killed run is marked crashed.

The real CLI (`arenaforge envs synth` / `arenaforge sft synth`, offline, bundled sample data) in a subprocess,
reporting to the session's real Prefect server. It is killed right after a stage's task finishes (its rows are
committed, the next stage's are not); the re-run must end with the same record ids, table by table, as a run
that was never killed, and a third run must add nothing.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path

import pytest

from arenaforge.schemas.models import Run
from arenaforge.warehouse import Warehouse

SAMPLE_TOOLS = str(resources.files("arenaforge.data").joinpath("sample_tools"))
RECORD_TABLES = ["tools", "servers", "tool_chains", "tasks", "trajectories", "judge_scores", "qa_instances",
                 "qa_verifications", "environments", "env_merges", "distractor_sets", "rejections"]
FLOWS = {
    "envs": ["envs", "synth", "--n", "16", "--batch-size", "4", "--seed", "7"],
    # one task run for the whole pipeline: killed once its first window of 4 environments is written
    "envs-stream": ["envs", "synth", "--n", "16", "--batch-size", "4", "--seed", "7", "--pipeline", "stream",
                    "--merge-across"],
    "sft": ["sft", "synth", "--seed", "3"],
}


def _cmd(db: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "arenaforge.flows.cli", "--db", str(db), *args]


def _env() -> dict[str, str]:
    # INFO logs on: the kill is triggered by the task-finished line.
    return {**os.environ, "NO_COLOR": "1", "PYTHONUNBUFFERED": "1", "PREFECT_LOGGING_LEVEL": "INFO"}


def _run(db: Path, cwd: Path, *args: str) -> None:
    done = subprocess.run(_cmd(db, *args), cwd=cwd, env=_env(), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]


def _prepare(db: Path, cwd: Path, flow: str) -> None:
    if flow == "sft":  # the SFT track starts from ingested tools and their graphs
        _run(db, cwd, "ingest", SAMPLE_TOOLS)
        _run(db, cwd, "graph", "build")


def _ids(db: Path) -> dict[str, list[str]]:
    wh = Warehouse(db)
    return {t: [r[0] for r in wh.query(f"SELECT id FROM {t} ORDER BY id")[1]] for t in RECORD_TABLES}


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory, prefect_server) -> dict[str, dict[str, list[str]]]:
    out = {}
    for flow, args in FLOWS.items():
        cwd = tmp_path_factory.mktemp(f"clean-{flow}")
        db = cwd / "clean.duckdb"
        _prepare(db, cwd, flow)
        _run(db, cwd, *args)
        out[flow] = _ids(db)
    return out


@pytest.mark.slow
@pytest.mark.parametrize(("flow", "stage", "after"), [
    ("envs", "Task run 'synthesize-qas", "Finished in state Completed"),  # QAs committed, no environment yet
    ("envs", "Task run 'build-environments", "Finished in state Completed"),  # the first of four batches committed
    ("envs-stream", "window 1 written", "environments"),  # QAs flushed as they came, window 1's environments
    ("sft", "Task run 'synthesize-tasks", "Finished in state Completed"),  # chains and tasks, no trajectory yet
    ("sft", "Task run 'run-trajectories", "Finished in state Completed"),  # trajectories committed, none judged
])
def test_sigkill_after_a_stage_then_rerun_has_every_row_once(tmp_path, prefect_server, uninterrupted, flow, stage,
                                                             after):
    expected = uninterrupted[flow]
    db = tmp_path / "killed.duckdb"
    _prepare(db, tmp_path, flow)
    proc = subprocess.Popen(_cmd(db, *FLOWS[flow]), cwd=tmp_path, env=_env(), stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    killed_mid_run = False
    deadline = time.monotonic() + 600
    assert proc.stdout is not None
    for line in proc.stdout:  # wait for the stage's rows to be committed, then pull the plug
        if stage in line and after in line:
            os.killpg(proc.pid, signal.SIGKILL)
            killed_mid_run = True
            break
        if time.monotonic() > deadline:
            break
    proc.wait(timeout=60)
    assert killed_mid_run, f"the run finished before {stage} could be killed"
    assert proc.returncode == -signal.SIGKILL
    partial = _ids(db)
    assert partial != expected and all(set(partial[t]) <= set(expected[t]) for t in RECORD_TABLES), \
        "what the killed run committed is a part of the uninterrupted run's rows"

    _run(db, tmp_path, *FLOWS[flow])
    assert _ids(db) == expected, "the re-run completes the killed run exactly"
    runs = Warehouse(db).load(Run, where="record->>'flow' = ?", params=[flow.split("-")[0]])
    assert sorted(r.status for r in runs) == ["completed", "crashed"], "the killed run is marked crashed"
    crashed = next(r for r in runs if r.status == "crashed")
    assert crashed.error and "is gone" in crashed.error

    _run(db, tmp_path, *FLOWS[flow])
    again = _ids(db)
    if flow.startswith("envs"):
        assert again == expected, "running the step twice must add nothing"
    else:  # sft synth explores new chains on purpose (rarely used edges first); what it wrote before stays
        assert all(set(expected[t]) <= set(again[t]) for t in RECORD_TABLES)
