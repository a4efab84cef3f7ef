"""Browsing the warehouse from the CLI: `db show <view> --where`, `db query`, `db tables` (typer's CliRunner)."""

from __future__ import annotations

import os
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


def test_query_and_show_print_csv_json_and_jsonl(browse_db: Path) -> None:
    """What a script reads: every row whole, in the format asked for, and nothing else on stdout."""
    import csv
    import io
    import json

    code, out = _cli(browse_db, "db", "query", "select count(*) as n from v_environments", "--format", "json")
    assert code == 0, out
    assert json.loads(out) == [{"n": 3}]
    sql = "SELECT name, verified, tools FROM v_environments ORDER BY name"
    want = [{"name": "weather_0", "verified": True, "tools": 4}, {"name": "weather_1", "verified": False, "tools": 5},
            {"name": "weather_2", "verified": True, "tools": 1}]
    code, out = _cli(browse_db, "db", "query", sql, "--format", "jsonl")
    assert code == 0 and [json.loads(line) for line in out.splitlines()] == want, out
    code, out = _cli(browse_db, "db", "query", sql, "--format", "csv")
    assert code == 0 and list(csv.reader(io.StringIO(out))) == [
        ["name", "verified", "tools"], ["weather_0", "True", "4"], ["weather_1", "False", "5"],
        ["weather_2", "True", "1"]]
    code, out = _cli(browse_db, "db", "query", "SELECT [1, 2] AS l, {'a': 'x'} AS s, 1.5::DECIMAL(4, 2) AS d, "
                     "DATE '2026-11-28' AS day", "--format", "json")
    assert code == 0 and json.loads(out) == [{"l": [1, 2], "s": {"a": "x"}, "d": 1.5, "day": "2026-11-28"}], out
    code, out = _cli(browse_db, "db", "query", sql)  # the default: the table
    assert code == 0 and "┃ name" in out and "weather_1" in out, out

    # db show: the browsing view's columns, long cells whole (the table cuts them on screen)
    code, out = _cli(browse_db, "db", "show", "environments", "--where", "verified", "--format", "json")
    rows = json.loads(out)
    assert code == 0 and sorted(r["name"] for r in rows) == ["weather_0", "weather_2"]
    assert rows[0]["question"].startswith("What is the weather in city")
    code, out = _cli(browse_db, "db", "show", "rollouts", "--format", "jsonl", "--limit", "1")
    (row,) = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and row["engine"] == "scripted" and round(row["f1"], 3) == 0.667
    code, out = _cli(browse_db, "db", "tables", "--format", "json")
    listed = {r["name"]: r for r in json.loads(out)}
    assert code == 0 and listed["v_environments"]["rows"] == 3 and listed["environments"]["kind"] == "table", out
    code, out = _cli(browse_db, "db", "describe", "v_runs", "--format", "jsonl")
    columns = {r["column"]: r["type"] for r in map(json.loads, out.splitlines())}
    assert code == 0 and columns["flow"] == "VARCHAR" and columns["duration_s"] == "DOUBLE", out
    code, out = _cli(browse_db, "db", "show", "runs", "--format", "csv")
    header, *body = list(csv.reader(io.StringIO(out)))
    assert code == 0 and "flow" in header and len(body) == 1 and body[0][header.index("flow")] == "envs"


def test_an_unknown_format_is_one_line(browse_db: Path) -> None:
    shown = subprocess.run([sys.executable, "-m", "arenaforge.flows.cli", "--db", str(browse_db), "db", "query",
                            "select 1", "--format", "xml"], capture_output=True, text=True)
    assert shown.returncode == 2 and shown.stdout == ""
    assert shown.stderr.strip() == "error: --format 'xml': use one of table, csv, json, jsonl"


def test_duckdb_cli_1_5_6_from_pypi_cannot_load_the_extensions_and_db_cli_says_so_in_one_line(tmp_path: Path) -> None:
    """PyPI's newest duckdb-cli (1.5.6) is DuckDB v1.5.6: its LOAD refuses the 1.5.5 extensions. With it first on PATH
    (and no CLI beside Python), `db cli` names the version it found and the one it needs, in one line, exit 2."""
    from arenaforge.warehouse.extensions import DUCKDB_VERSION, cli_version
    from tests.support.duckdb_cli import venv_made_by

    venv = venv_made_by("python3 -m venv ~/duckdb-cli && ~/duckdb-cli/bin/pip install duckdb-cli==1.5.6")
    newer = venv / "bin" / "duckdb"
    assert cli_version(str(newer)) == "v1.5.6" and DUCKDB_VERSION == "1.5.5"
    wh = Warehouse(tmp_path / "w.lake")
    wh.relations()
    refused = subprocess.run([str(newer), *wh.cli_args(), "-c", "SELECT count(*) FROM v_environments"],
                             capture_output=True, text=True, timeout=120)
    assert refused.returncode != 0
    assert "built specifically for DuckDB version 'v1.5.5'" in refused.stderr, refused.stderr

    as_user = "import sys; sys.executable = sys.argv.pop(1); from arenaforge.flows.cli import main; main()"
    no_cli_beside = str(tmp_path / "elsewhere" / "python")
    for args in (["db", "cli"], ["db", "cli", "--print"]):
        shown = subprocess.run([sys.executable, "-c", as_user, no_cli_beside, "--db", str(wh.path), *args],
                               env={**os.environ, "PATH": f"{venv}/bin:{os.environ['PATH']}"},
                               capture_output=True, text=True, timeout=120)
        assert shown.returncode == 2 and shown.stdout == "", shown.stdout + shown.stderr
        assert shown.stderr.splitlines() == [
            f"error: {newer} is DuckDB v1.5.6, but the warehouse's extensions load only into DuckDB v1.5.5 "
            "(pip install duckdb-cli==1.5.5)"]
