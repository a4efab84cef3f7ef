"""Browsing the warehouse from the CLI: `db show <view> --where`, `db query`, `db tables` (typer's CliRunner)."""

from __future__ import annotations

import subprocess
import sys

from pathlib import Path

import pytest
from typer.testing import CliRunner

from arenaforge.flows.cli import app
from arenaforge.schemas.models import (
    ChatMessage,
    Environment,
    FunctionDoc,
    GoldCall,
    RewardBreakdown,
    Rollout,
    Trajectory,
    Verification,
)
from arenaforge.warehouse import Warehouse, recorded_run


def _env(i: int, verified: bool, tools: int) -> Environment:
    return Environment(
        name=f"weather_{i}",
        qa_id=f"qa_{i}",
        tools=[FunctionDoc(name=f"tool_{i}_{k}") for k in range(tools)],
        code="def tool(): return 1\n",
        calls=[GoldCall(tool=f"tool_{i}_0", arguments={"city": "Oslo"})],
        question=f"What is the weather in city {i}?",
        verification=Verification(passed=verified, checks={"executes": verified}),
    )


@pytest.fixture
def browse_db(tmp_path: Path) -> Path:
    db = tmp_path / "browse.duckdb"
    wh = Warehouse(db)
    envs = [_env(0, True, 4), _env(1, False, 5), _env(2, True, 1)]
    with recorded_run(wh, "envs", {"n": 3}) as (run, counts):
        counts["environments"] = wh.upsert([e.model_copy(update={"run_id": run.id}) for e in envs])
    msgs = [ChatMessage(role="user", content="hi"), ChatMessage(role="assistant", content="sunny")]
    wh.upsert([Trajectory(task_id="t1", server="weather", messages=msgs, tools=[], tool_calls=2, final_answer="sunny")])
    reward = RewardBreakdown(recall=1.0, precision=0.5, f1=2 / 3, solved=1, subtasks=1, calls=2)
    wh.upsert([Rollout(env_id=envs[0].id, engine="scripted", policy="p0", sample=s, reward=reward, status="finished") for s in range(2)])
    return db


def _cli(db: Path, *args: str) -> tuple[int, str]:
    res = CliRunner().invoke(app, ["--db", str(db), *args], env={"COLUMNS": "250", "NO_COLOR": "1"})
    return res.exit_code, res.output + (str(res.exception) if res.exception and res.exit_code != 0 else "")


def test_show_environments_where(browse_db: Path) -> None:
    code, out = _cli(browse_db, "db", "show", "environments", "--where", "verified AND tools > 2")
    assert code == 0, out
    assert "v_environments: 1 of 1 rows matching" in out
    assert "weather_0" in out and "weather_1" not in out and "weather_2" not in out
    assert "What is the weather in city 0?" in out


def test_show_runs_trajectories_rollouts(browse_db: Path) -> None:
    code, out = _cli(browse_db, "db", "show", "runs")
    assert code == 0 and "envs" in out and "completed" in out and '{"environments":3}' in out
    code, out = _cli(browse_db, "db", "show", "trajectories", "--where", "tool_calls = 2")
    assert code == 0 and "v_trajectories: 1 of 1 rows matching" in out and "sunny" in out
    code, out = _cli(browse_db, "db", "show", "rollouts", "--limit", "1")
    assert code == 0 and "v_rollouts: 1 of 2 rows; --limit N shows more" in out and "scripted" in out


def test_query_accepts_sql(browse_db: Path) -> None:
    code, out = _cli(
        browse_db, "db", "query",
        "SELECT e.name, count(r.id) AS rollouts, round(avg(r.f1), 3) AS mean_f1 "
        "FROM v_environments e LEFT JOIN v_rollouts r ON r.env_id = e.id GROUP BY 1 ORDER BY 1",
    )
    assert code == 0, out
    lines = [line for line in out.splitlines() if "weather_" in line]
    assert len(lines) == 3 and "0.667" in lines[0] and "2" in lines[0]


def test_bad_where_and_unknown_view_are_user_errors(browse_db: Path) -> None:
    from arenaforge.schemas.errors import WarehouseError

    res = CliRunner().invoke(app, ["--db", str(browse_db), "db", "show", "environments", "--where", "nonsense >"])
    assert isinstance(res.exception, WarehouseError) and "query failed" in str(res.exception)
    res = CliRunner().invoke(app, ["--db", str(browse_db), "db", "show", "nope"])
    assert isinstance(res.exception, WarehouseError) and "unknown table or view 'nope'" in str(res.exception)


def test_run_filter_on_every_view_as_a_user_types_it(browse_db: Path) -> None:
    """`--run ID` picks a run's rows; on `runs` its own row; where a view has no run id, one clear line, exit 2."""
    wh = Warehouse(browse_db)
    run_id = wh.query("SELECT id FROM runs")[1][0][0]
    code, out = _cli(browse_db, "db", "show", "environments", "--run", run_id)
    assert code == 0 and "v_environments: 3 of 3 rows matching" in out, out
    code, out = _cli(browse_db, "db", "show", "runs", "--run", run_id)
    assert code == 0 and "v_runs: 1 of 1 rows matching" in out, out
    shown = subprocess.run([sys.executable, "-m", "arenaforge.flows.cli", "--db", str(browse_db), "db", "show",
                            "graph_edges", "--run", run_id], capture_output=True, text=True)
    assert shown.returncode == 2, shown.stderr
    assert shown.stderr.strip() == "error: v_graph_edges has no run_id column, so --run cannot pick its rows; filter with --where"
