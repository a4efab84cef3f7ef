"""Two writers, one DuckDB file: no lost writes, no duplicates (arenaforge/warehouse/db.py retries on lock)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from arenaforge.warehouse import Warehouse
from tests.support.served import served_flows

WRITER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from arenaforge.schemas.models import Rejection
    from arenaforge.warehouse import Warehouse

    db, who, go = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    wh = Warehouse(db, lock_timeout_s=60)
    deadline = time.monotonic() + 60
    while not go.exists():          # start both writers at the same moment
        assert time.monotonic() < deadline
        time.sleep(0.01)
    new = 0
    for batch in range(20):
        rows = [Rejection(stage="own", subject=f"{who}-{batch}-{i}", reason="malformed_json") for i in range(5)]
        # the same 5 shared rows are written by both processes: they must land once
        rows += [Rejection(stage="shared", subject=f"shared-{batch}-{i}", reason="malformed_json") for i in range(5)]
        new += wh.upsert(rows)
    print(new)
    """
)


def test_two_processes_upsert_concurrently(tmp_path: Path) -> None:
    db = tmp_path / "shared.duckdb"
    go = tmp_path / "go"
    procs = [
        subprocess.Popen([sys.executable, "-c", WRITER, str(db), who, str(go)], stdout=subprocess.PIPE, text=True)
        for who in ("a", "b")
    ]
    go.touch()
    outs = [p.communicate(timeout=180)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    new = sum(int(o.strip()) for o in outs)
    wh = Warehouse(db)
    _, rows = wh.query("SELECT record->>'stage', count(*), count(DISTINCT record->>'subject') FROM rejections GROUP BY 1 ORDER BY 1")
    assert rows == [("own", 200, 200), ("shared", 100, 100)]
    assert new == 300  # every row counted as new exactly once across both writers


@pytest.mark.prefect_server
def test_synthesis_and_training_runs_at_once(served: Any, tmp_path: Path) -> None:
    """A synthesis-style run (many small upserts) and a real `train-sft` run on the same warehouse,
    overlapping in time: both complete, every row is there exactly once."""
    from arenaforge.flows.deployments import start_run
    from arenaforge.schemas.kinds_training import TrainStep

    flows = served_flows()
    data = tmp_path / "sft.jsonl"
    example = {"messages": [{"role": "user", "content": "capital of Freedonia?"}, {"role": "assistant", "content": "Fredo"}]}
    data.write_text(json.dumps(example) + "\n")
    synth = start_run(
        served.api_url, "probe", {"tag": "synth", "n": 30, "batch": 3, "wait_for_flow": "train-sft"}, flows=flows, wait_s=0
    )
    train = start_run(
        served.api_url, "train-sft",
        {"data": str(data), "experiment": "concurrent-sft", "epochs": 2, "out_dir": str(tmp_path / "out")},
        flows=flows, wait_s=0,
    )
    from prefect.client.orchestration import get_client

    deadline = time.monotonic() + 400
    with served.client_settings(), get_client(sync_client=True) as client:
        states: dict[Any, Any] = {}
        while len(states) < 2:
            for run in (synth, train):
                state = client.read_flow_run(run.id).state
                if state and state.is_final():
                    states[run.id] = state
            assert time.monotonic() < deadline, "runs did not finish"
            time.sleep(0.5)  # polling run state with a deadline
    assert all(s.is_completed() for s in states.values()), states

    _, rows = served.warehouse.query(
        "SELECT count(*), count(DISTINCT record->>'subject'), count(*) FILTER (WHERE record->>'stage' = 'tick') "
        "FROM rejections WHERE record->>'subject' LIKE 'synth-%'"
    )
    total, distinct, ticks = rows[0]
    assert total == distinct and total == 30 + ticks and ticks >= 1
    steps = [s for s in served.warehouse.load(TrainStep) if s.experiment == "concurrent-sft"]
    assert sorted(s.step for s in steps) == [1, 2]
    _, spans = served.warehouse.query(
        "SELECT flow, status, started_at, finished_at FROM v_runs WHERE id IN (?, ?)",
        [steps[0].run_id, _probe_run_id(served)],
    )
    assert {(f, st) for f, st, _, _ in spans} == {("train-sft", "completed"), ("serve-probe", "completed")}
    (_, _, a0, a1), (_, _, b0, b1) = spans
    assert a0 < b1 and b0 < a1, f"runs did not overlap: {spans}"


def _probe_run_id(served: Any) -> str:
    _, rows = served.warehouse.query(
        "SELECT DISTINCT run_id FROM rejections WHERE record->>'subject' = 'synth-tick-0'"
    )
    return rows[0][0]
