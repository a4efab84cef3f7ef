"""A throwaway PostgreSQL cluster on a free loopback port (Debian's postgresql, run as the postgres user)."""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from tests.support.prefect_server import free_port
from tests.support.requirements import skip_or_fail


def as_postgres(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(["runuser", "-u", "postgres", "--", *cmd], check=False, capture_output=True, text=True, timeout=120)


@dataclass(frozen=True)
class PostgresCluster:
    bindir: str
    port: int

    def run(self, tool: str, *args: str) -> subprocess.CompletedProcess:
        """A PostgreSQL client tool (psql, createdb, ...) against this cluster."""
        return as_postgres(f"{self.bindir}/{tool}", "-h", "127.0.0.1", "-p", str(self.port), *args)


@contextlib.contextmanager
def postgres_cluster(database: str) -> Iterator[PostgresCluster]:
    """A fresh cluster with an empty `database`, stopped and removed on exit (skips locally, fails in CI,
    without the server binaries or root)."""
    bins = sorted(glob.glob("/usr/lib/postgresql/*/bin"))
    if not bins or os.geteuid() != 0 or shutil.which("runuser") is None:
        skip_or_fail("PostgreSQL server binaries (Debian postgresql, scripts/system-deps.sh) and root are needed")
    bindir = bins[-1]
    data = Path(tempfile.mkdtemp(prefix="af-pg-", dir="/tmp"))
    os.chmod(data, 0o755)
    shutil.chown(data, "postgres", "postgres")
    port = free_port()
    init = as_postgres(f"{bindir}/initdb", "-D", str(data / "db"), "-A", "trust", "-U", "postgres")
    assert init.returncode == 0, init.stderr
    start = as_postgres(f"{bindir}/pg_ctl", "-D", str(data / "db"), "-w", "-l", str(data / "log"),
                        "-o", f"-p {port} -k {data} -c listen_addresses=127.0.0.1", "start")
    assert start.returncode == 0, start.stderr + ((data / "log").read_text() if (data / "log").exists() else "")
    try:
        cluster = PostgresCluster(bindir, port)
        made = cluster.run("createdb", database)
        assert made.returncode == 0, made.stderr
        yield cluster
    finally:
        as_postgres(f"{bindir}/pg_ctl", "-D", str(data / "db"), "-m", "immediate", "stop")
        shutil.rmtree(data, ignore_errors=True)
