"""`arenaforge serve` against Postgres by URL: a real PostgreSQL server on loopback holds Prefect's state."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from arenaforge.schemas.config import Config, PrefectConfig, WarehouseConfig
from tests.support.prefect_server import free_port
from tests.support.requirements import skip_or_fail


def _as_postgres(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(["runuser", "-u", "postgres", "--", *cmd], capture_output=True, text=True, timeout=120)


@pytest.fixture
def postgres_url() -> Iterator[tuple[str, str, int]]:
    """A throwaway PostgreSQL cluster (Debian's postgresql, run as the postgres user) on a free port."""
    bins = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
    if not bins or os.geteuid() != 0 or shutil.which("runuser") is None:
        skip_or_fail("PostgreSQL server binaries (Debian postgresql) and root are needed")
    bindir = bins[-1]
    data = Path(tempfile.mkdtemp(prefix="af-pg-", dir="/tmp"))
    os.chmod(data, 0o755)
    shutil.chown(data, "postgres", "postgres")
    port = free_port()
    init = _as_postgres(f"{bindir}/initdb", "-D", str(data / "db"), "-A", "trust", "-U", "postgres")
    assert init.returncode == 0, init.stderr
    start = _as_postgres(f"{bindir}/pg_ctl", "-D", str(data / "db"), "-w", "-l", str(data / "log"),
                         "-o", f"-p {port} -k {data} -c listen_addresses=127.0.0.1", "start")
    assert start.returncode == 0, start.stderr + (data / "log").read_text() if (data / "log").exists() else ""
    try:
        made = _as_postgres(f"{bindir}/createdb", "-h", "127.0.0.1", "-p", str(port), "prefect")
        assert made.returncode == 0, made.stderr
        yield f"postgresql+asyncpg://postgres@127.0.0.1:{port}/prefect", bindir, port
    finally:
        _as_postgres(f"{bindir}/pg_ctl", "-D", str(data / "db"), "-m", "immediate", "stop")
        shutil.rmtree(data, ignore_errors=True)


@pytest.mark.prefect_server
@pytest.mark.slow
def test_serve_keeps_prefect_state_in_postgres(postgres_url, tmp_path):
    from arenaforge.flows.serve import Stack

    url, bindir, port = postgres_url
    cfg = Config(
        warehouse=WarehouseConfig(path=str(tmp_path / "w.duckdb")),
        prefect=PrefectConfig(database_url=url, port=free_port()),
    )
    flows = {"envs": "arenaforge.flows.envs_flows:envs", "train-sft": "arenaforge.flows.train_flows:train_sft"}
    before = os.environ.get("PREFECT_API_URL")
    with Stack(cfg, flows=flows, home=tmp_path / "prefect-home", worker=False, server_timeout_s=300) as stack:
        assert set(stack.deployments) == set(flows)
        psql = _as_postgres(f"{bindir}/psql", "-h", "127.0.0.1", "-p", str(port), "-d", "prefect", "-tA",
                            "-c", "SELECT name FROM deployment ORDER BY name")
    # the stopped stack's server is gone: later clients in this process must not be sent to it
    assert os.environ.get("PREFECT_API_URL") == before
    assert psql.returncode == 0, psql.stderr
    assert psql.stdout.split() == sorted(flows), "the deployments must live in Postgres, not SQLite"
    assert not list((tmp_path / "prefect-home").glob("*.db")), "no SQLite database when a Postgres URL is set"
