"""The CLI as a user runs it: real subprocesses, one-line errors, non-zero exits."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl

from arenaforge.schemas import FunctionDoc, Tool
from arenaforge.warehouse import Warehouse

COMMANDS = ["demo", "ingest", "graph", "sft", "envs", "sandbox", "rollout", "train", "eval", "serve", "model", "db", "bench",
            "config"]


def cli(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200", **(env or {})}
    return subprocess.run([sys.executable, "-m", "arenaforge.flows.cli", *args], cwd=cwd, env=full_env, capture_output=True,
                          text=True, timeout=120)


REPO = Path(__file__).resolve().parents[2]


def test_help_lists_every_subcommand(tmp_path):
    from typer.testing import CliRunner

    from arenaforge.flows.cli import app

    out = cli("--help", cwd=REPO)  # the installed entry point, once
    assert out.returncode == 0
    for name in COMMANDS:
        assert name in out.stdout
    for name in COMMANDS:  # in this process: a fresh interpreter per command cost a minute of imports
        sub = CliRunner().invoke(app, [name, "--help"], env={"NO_COLOR": "1", "COLUMNS": "200"})
        assert sub.exit_code == 0, (name, sub.output)
        assert "Usage" in sub.stdout


def test_db_tables_show_query_export(tmp_path):
    db = tmp_path / "w.duckdb"
    Warehouse(db).upsert([Tool(server="s", function=FunctionDoc(name=f"f{i}"), source="openai") for i in range(3)])
    tables = cli("--db", str(db), "db", "tables", cwd=REPO)
    assert tables.returncode == 0 and "tools" in tables.stdout and "v_environments" in tables.stdout
    show = cli("--db", str(db), "db", "show", "tools", "--where", "name <> 'f0'", cwd=REPO)
    assert show.returncode == 0 and "f1" in show.stdout and "f0" not in show.stdout
    query = cli("--db", str(db), "db", "query", "SELECT count(*) AS n FROM tools", cwd=REPO)
    assert query.returncode == 0 and "3" in query.stdout
    out = tmp_path / "t.parquet"
    exp = cli("--db", str(db), "db", "export", "v_tools", "--format", "parquet", "--out", str(out), cwd=REPO)
    assert exp.returncode == 0 and pl.read_parquet(out).height == 3


def test_user_mistakes_are_one_line_and_nonzero(tmp_path):
    db = str(tmp_path / "w.duckdb")
    cases = [
        (["--db", db, "db", "show", "nope"], "unknown table or view 'nope'"),
        (["--db", db, "db", "query", "SELEC 1"], "query failed"),
        (["--db", db, "db", "export", "tools", "--format", "xml"], "unknown format"),
        (["--config", str(tmp_path / "missing.toml"), "config", "show"], "does not exist"),
        (["--db", db, "envs", "synth", "--distractor-pool-max", "-1"],
         "envs synth: --distractor-pool-max: Input should be greater than or equal to 0 (got -1)"),
        (["--db", db, "envs", "synth", "--pipeline", "stream", "--keep-rule", "percentile"],
         "envs synth: parameters: pipeline stream keeps QAs by threshold only"),
        (["--db", db, "sft", "synth", "--batch-size", "0"],
         "sft synth: --batch-size: Input should be greater than or equal to 1 (got 0)"),
        (["--db", db, "train", "grpo", "--steps", "0"],
         "train grpo: --steps: Input should be greater than or equal to 1 (got 0)"),
        (["--db", db, "train", "grpo", "--env-limit", "0"],
         "train grpo: --env-limit: Input should be greater than or equal to 1 (got 0)"),
        (["--db", db, "train", "sft", "--data", "missing.jsonl"], "train sft: --data missing.jsonl: no such file"),
        (["--db", db, "eval", "run", "--max-turns", "0"],
         "eval run: --max-turns: Input should be greater than or equal to 1 (got 0)"),
        (["--db", db, "rollout", "run", "--samples", "0"],
         "rollout run: --samples: Input should be greater than or equal to 1 (got 0)"),
    ]
    for args, message in cases:
        res = cli(*args, cwd=tmp_path)
        assert res.returncode == 2, (args, res.stdout, res.stderr)
        lines = [line for line in res.stderr.splitlines() if line.strip()]
        assert len(lines) == 1 and message in lines[0], res.stderr
        assert "Traceback" not in res.stderr


def test_bad_input_found_inside_a_run_prints_no_traceback(tmp_path):
    """Prefect logs a failed run with its traceback; for bad input the run's log lines keep their message only and
    the command ends with its one-line error. A benchmark's option out of range is found deep in its run, too."""
    res = cli("--db", str(tmp_path / "w.duckdb"), "envs", "synth", "--source", "nosuch", "-n", "3", cwd=tmp_path)
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert "Traceback" not in res.stderr, res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert errors == ["error: unknown knowledge source 'nosuch': use astra, sample, tau2_retail or a path to table files"]
    assert "Encountered exception during execution" in res.stderr  # the run's own log line is still there

    bench = cli("bench", "envs", "--batch-size", "0", cwd=tmp_path)
    assert bench.returncode == 2 and "Traceback" not in bench.stderr, bench.stderr
    assert [line for line in bench.stderr.splitlines() if line.startswith("error:")] == [
        "error: bench envs: --batch-size: Input should be greater than or equal to 1 (got 0)"]


def test_config_show_reflects_precedence_and_masks_keys(tmp_path):
    (tmp_path / "arenaforge.toml").write_text('[model]\nmodel = "m-file"\napi_key = "secret"\n')
    res = cli("--model", "m-flag", "config", "show", cwd=tmp_path, env={"ARENAFORGE_MODEL__TEMPERATURE": "0.1"})
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)
    assert data["model"]["model"] == "m-flag" and data["model"]["temperature"] == 0.1
    assert data["model"]["api_key"] == "***"
