"""Users browse the warehouse while a real `arenaforge envs synth` writes to it.

Before DuckLake, a DuckDB session held by a user stalled every flow for 120 s and then failed it,
and the DuckDB CLI from PyPI could not open the file at all. Here:
  * a reader process holds a session, with a transaction open, for the whole of an `envs synth`,
    and the flow finishes;
  * the DuckDB CLI installed from PyPI (`duckdb-cli`, the command `arenaforge db cli --print` gives)
    and `arenaforge db show` query v_environments in the middle of a run, while the flow is frozen
    with SIGSTOP right after its first batch of environments was committed;
  * so does a DuckDB CLI installed as docs/WAREHOUSE.md says, in a venv of its own.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from arenaforge.warehouse import Warehouse
from arenaforge.warehouse.extensions import DUCKDB_VERSION, cli_binary
from tests.support.duckdb_cli import docs_blocks, venv_made_by


def _synth(db: Path, *args: str) -> list[str]:
    return [sys.executable, "-m", "arenaforge.flows.cli", "--db", str(db), "envs", "synth", *args]


def _env() -> dict[str, str]:
    # INFO logs on: the test reacts to the task-finished line.
    return {**os.environ, "NO_COLOR": "1", "PYTHONUNBUFFERED": "1", "PREFECT_LOGGING_LEVEL": "INFO"}


HOLDER = textwrap.dedent(
    """
    import sys
    import duckdb
    con = duckdb.connect()
    con.execute(sys.argv[1])  # the extensions by path and the lake attached read-only (as `db cli` does)
    con.execute("BEGIN TRANSACTION")
    print(con.execute("SELECT count(*) FROM v_environments").fetchone()[0], flush=True)
    sys.stdin.readline()  # ... held open until the flow is over
    print(con.execute("SELECT count(*) FROM v_environments").fetchone()[0], flush=True)
    con.execute("COMMIT")
    print(con.execute("SELECT count(*) FROM v_environments").fetchone()[0], flush=True)
    """
)


@pytest.mark.slow
def test_a_reader_holds_a_session_for_a_whole_envs_synth_and_the_flow_finishes(tmp_path, prefect_server):
    db = tmp_path / "w.lake"
    wh = Warehouse(db)
    wh.relations()  # the lake exists before the reader attaches to it
    reader = subprocess.Popen([sys.executable, "-c", HOLDER, wh.cli_args()[1]], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert reader.stdout.readline().strip() == "0"  # session and transaction open from here on
        done = subprocess.run(_synth(db, "--n", "8", "--batch-size", "4", "--seed", "3"), cwd=tmp_path, env=_env(),
                              capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]
        made = wh.count("environments")
        assert made > 0
        assert reader.poll() is None, "the reader held its session through the whole run"
        reader.stdin.write("\n")
        reader.stdin.flush()
        assert reader.stdout.readline().strip() == "0"  # its snapshot never moved under it
        assert reader.stdout.readline().strip() == str(made)  # a new transaction sees the run's rows
    finally:
        _, err = reader.communicate(timeout=120)
    assert reader.returncode == 0, err


@contextlib.contextmanager
def _a_run_frozen_after_its_first_batch(db: Path, cwd: Path) -> Iterator[None]:
    """An `envs synth` writing `db`, frozen (SIGSTOP) right after its first batch of environments was committed;
    on leaving, it goes on and must finish."""
    proc = subprocess.Popen(_synth(db, "--n", "12", "--batch-size", "4", "--seed", "7"), cwd=cwd, env=_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    frozen = False
    seen_lines: list[str] = []
    try:
        deadline = time.monotonic() + 900
        assert proc.stdout is not None
        for line in proc.stdout:  # the first batch of environments is committed: freeze the run there
            seen_lines.append(line)
            if "build-environments" in line and "Finished in state Completed" in line:
                os.killpg(proc.pid, signal.SIGSTOP)
                frozen = True
                break
            assert time.monotonic() < deadline, "no batch of environments finished"
        assert frozen, "the run ended before its first batch of environments finished: " + "".join(seen_lines)[-3000:]
        yield
    finally:
        if frozen:
            os.killpg(proc.pid, signal.SIGCONT)
    rest, _ = proc.communicate(timeout=900)
    assert proc.returncode == 0, rest[-3000:]


@pytest.mark.slow
def test_the_duckdb_cli_queries_v_environments_during_a_run(tmp_path, prefect_server):
    db = tmp_path / "w.lake"
    Warehouse(db).relations()
    printed = subprocess.run([sys.executable, "-m", "arenaforge.flows.cli", "--db", str(db), "db", "cli", "--print"],
                             capture_output=True, text=True, timeout=120)
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout.startswith(cli_binary()) and "READ_ONLY" in printed.stdout

    with _a_run_frozen_after_its_first_batch(db, tmp_path):
        # The one-line command a user runs, as printed above, with a query appended.
        query = subprocess.run([*_shell_words(printed.stdout), "-csv", "-noheader", "-c",
                                "SELECT count(*), count(*) FILTER (WHERE verified) FROM v_environments"],
                               capture_output=True, text=True, timeout=120)
        assert query.returncode == 0, query.stderr
        seen, verified = (int(x) for x in query.stdout.strip().split(","))
        assert seen > 0 and verified == seen  # the first batch, read while the run is mid-way
        # ... and `arenaforge db show` too (before DuckLake it hung until the run let go of the file)
        shown = subprocess.run([sys.executable, "-m", "arenaforge.flows.cli", "--db", str(db), "db", "show",
                                "environments", "--limit", "1"], capture_output=True, text=True, timeout=120,
                               env={**os.environ, "NO_COLOR": "1", "COLUMNS": "200"})
        assert shown.returncode == 0, shown.stderr
        assert f"v_environments: 1 of {seen} rows" in shown.stdout
    assert Warehouse(db).count("environments") >= seen  # the run went on and finished after the read


@pytest.mark.slow
def test_the_warehouse_md_instructions_read_v_environments_during_a_run(tmp_path, prefect_server):
    """docs/WAREHOUSE.md's "A DuckDB CLI of your own", followed as written: its venv (made once per machine, only
    where it lives changed), then its command from the project directory with a query typed at the prompt."""
    make_venv, open_lake = docs_blocks()
    venv = venv_made_by(make_venv)
    active = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"},  # the venv activated
              "VIRTUAL_ENV": str(venv), "PATH": f"{venv}/bin:{os.environ['PATH']}"}
    version = subprocess.run(["duckdb", "--version"], env=active, capture_output=True, text=True, timeout=60)
    assert version.stdout.startswith(f"v{DUCKDB_VERSION} "), version.stdout + version.stderr
    db = tmp_path / "arenaforge.lake"  # the name the docs' command opens, in the project directory
    Warehouse(db).relations()

    with _a_run_frozen_after_its_first_batch(db, tmp_path):
        typed = ".mode csv\n.headers off\nSELECT count(*), count(*) FILTER (WHERE verified) FROM v_environments;\n"
        query = subprocess.run(["bash", "-c", open_lake], input=typed, cwd=tmp_path, env=active,
                               capture_output=True, text=True, timeout=120)
        assert query.returncode == 0 and not query.stderr, query.stdout + query.stderr
        seen, verified = (int(x) for x in query.stdout.strip().split(","))
        assert seen > 0 and verified == seen, query.stdout  # the first batch, read while the run is mid-way
    assert Warehouse(db).count("environments") >= seen


def _shell_words(command: str) -> list[str]:
    import shlex

    return shlex.split(command.strip())
