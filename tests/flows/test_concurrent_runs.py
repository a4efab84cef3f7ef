"""Two writers, one DuckDB file: no lost writes, no duplicates (warehouse/db.py retries on lock)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from tests.support.served import served_flows
from warehouse import Warehouse

WRITER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from schemas.models import Rejection
    from warehouse import Warehouse

    db, who, go = sys.argv[1], sys.argv[2], Path(sys.argv[3])
    wh = Warehouse(db, lock_timeout_s=60)
    deadline = time.monotonic() + 60
    while not go.exists():          # start both writers at the same moment
        assert time.monotonic() < deadline
        time.sleep(0.01)
    new = 0
    for batch in range(40):
        rows = [Rejection(stage="concurrency", subject=f"{who}-{batch}-{i}", reason="own") for i in range(5)]
        # the same 5 shared rows are written by both processes: they must land once
        rows += [Rejection(stage="concurrency", subject=f"shared-{batch}-{i}", reason="shared") for i in range(5)]
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
    _, rows = wh.query("SELECT record->>'reason', count(*), count(DISTINCT record->>'subject') FROM rejections GROUP BY 1 ORDER BY 1")
    assert rows == [("own", 400, 400), ("shared", 200, 200)]
    assert new == 600  # every row counted as new exactly once across both writers


@pytest.mark.prefect_server
def test_two_deployment_runs_at_once(served: Any) -> None:
    """A synthesis-style run and a training-style run started together both complete, rows intact."""
    from flows.deployments import start_run

    flows = served_flows()
    runs = [
        start_run(served.api_url, "probe", {"tag": tag, "n": 30, "batch": 3, "pause_s": 0.2}, flows=flows, wait_s=0)
        for tag in ("synth", "train")
    ]
    deadline = time.monotonic() + 180
    from prefect.client.orchestration import get_client

    with served.client_settings(), get_client(sync_client=True) as client:
        states = {}
        while len(states) < 2:
            for run in runs:
                state = client.read_flow_run(run.id).state
                if state and state.is_final():
                    states[run.id] = state
            assert time.monotonic() < deadline, "runs did not finish"
            time.sleep(0.5)  # polling run state with a deadline
    assert all(s.is_completed() for s in states.values()), states
    for tag in ("synth", "train"):
        _, rows = served.warehouse.query(
            "SELECT count(*), count(DISTINCT record->>'subject') FROM rejections WHERE record->>'subject' LIKE ?",
            [f"{tag}-%"],
        )
        assert rows == [(30, 30)]
    _, runs_rows = served.warehouse.query(
        "SELECT status, count(*) FROM v_runs WHERE flow = 'serve-probe' AND json_extract_string(counts, '$.rejections') = '30' GROUP BY 1"
    )
    assert runs_rows == [("completed", 2)]
    _, spans = served.warehouse.query(
        "SELECT max(started_at) < min(finished_at) FROM v_runs WHERE flow = 'serve-probe' "
        "AND json_extract_string(counts, '$.rejections') = '30'"
    )
    assert spans == [(True,)], "the two runs did not overlap in time"
