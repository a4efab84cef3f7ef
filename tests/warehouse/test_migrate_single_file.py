"""`arenaforge db migrate --from FILE`: a single-file warehouse made by today's code moves into a DuckLake.

The old file is written by the single-file code path under duckdb 2.0.0 (the version that made
every single-file warehouse, storage version the pinned duckdb cannot open), installed beside the
environment by scripts/setup.sh.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from typer.testing import CliRunner

from arenaforge.flows.cli import app
from arenaforge.schemas import FunctionDoc, Tool
from arenaforge.warehouse import Warehouse
from arenaforge.warehouse.legacy import legacy_duckdb_dir, legacy_env
from tests.support.requirements import skip_or_fail

MAKE_OLD = textwrap.dedent(
    """
    import sys
    import duckdb
    from arenaforge.schemas import FunctionDoc, Rejection, Tool
    from arenaforge.warehouse import Warehouse, recorded_run
    assert duckdb.__version__ == "2.0.0", duckdb.__version__
    wh = Warehouse("file:" + sys.argv[1])
    with recorded_run(wh, "ingest", {"path": "tools.json"}) as (run, counts):
        tools = [Tool(server="srv", function=FunctionDoc(name=f"t{i}", description="d"), source="openai", run_id=run.id)
                 for i in range(7)]
        counts["tools"] = wh.upsert([*tools, Rejection(stage="ingest", subject="bad", reason="invalid_name", run_id=run.id)])
    with wh.transaction() as con:
        con.execute("INSERT INTO llm_cache (key, model, request, response) VALUES ('k', 'm', '{}', '{\\"a\\": 1}')")
    """
)


def _tools() -> list[Tool]:
    return [Tool(server="srv", function=FunctionDoc(name=f"t{i}", description="d"), source="openai") for i in range(7)]


def test_migrate_a_single_file_made_by_todays_code(tmp_path):
    try:
        legacy = legacy_duckdb_dir(install=False)
    except Exception:  # noqa: BLE001 - a missing install is reported by skip_or_fail
        skip_or_fail("duckdb 2.0.0 beside the environment (scripts/setup.sh installs it)")
    old = tmp_path / "arenaforge.duckdb"
    made = subprocess.run([sys.executable, "-c", MAKE_OLD, str(old)], env=legacy_env(legacy), capture_output=True,
                          text=True, timeout=300)
    assert made.returncode == 0, made.stderr[-2000:]
    assert old.read_bytes()[8:12] == b"DUCK"

    new = tmp_path / "arenaforge.lake"
    result = CliRunner().invoke(app, ["--db", str(new), "db", "migrate", "--from", str(old)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    wh = Warehouse(new)
    assert wh.layout == "ducklake"
    assert (wh.count("tools"), wh.count("rejections"), wh.count("runs"), wh.count("llm_cache")) == (7, 1, 1, 1)
    _, runs = wh.query("SELECT flow, status, counts FROM v_runs")
    assert runs == [("ingest", "completed", '{"tools":8}')]
    _, cached = wh.query("SELECT response->>'a' FROM llm_cache")
    assert cached == [("1",)]  # JSON stays JSON
    assert wh.upsert(_tools()) == 0  # the same content ids: idempotent after the move

    again = CliRunner().invoke(app, ["--db", str(new), "db", "migrate", "--from", str(old)], catch_exceptions=False)
    assert again.exit_code == 0 and wh.count("tools") == 7  # running it twice copies nothing twice


def test_migrate_from_a_missing_file_is_one_clear_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "arenaforge.flows.cli", "--db", str(tmp_path / "w.lake"), "db", "migrate",
                           "--from", str(tmp_path / "nope.duckdb")], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip() == f"error: no such file: {tmp_path / 'nope.duckdb'}"


def test_an_existing_single_file_still_opens_as_it_was(tmp_path):
    old = tmp_path / "old.duckdb"
    Warehouse(f"file:{old}").upsert(_tools())
    wh = Warehouse(Path(old))  # no prefix: recognised by its header
    assert wh.layout == "single-file" and wh.count("tools") == 7
