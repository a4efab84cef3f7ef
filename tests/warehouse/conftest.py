"""Warehouse fixtures: a throwaway PostgreSQL catalog, and helpers to run writers in other processes."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.postgres import postgres_cluster


@pytest.fixture(scope="module")
def postgres_catalog() -> Iterator[str]:
    """A real PostgreSQL server on loopback with an empty database `lake`; yields its libpq conninfo."""
    with postgres_cluster("lake") as pg:
        yield f"host=127.0.0.1 port={pg.port} dbname=lake user=postgres"


# A writer process: waits for GO, then upserts 20 batches of 5 own + 5 shared rejections (the shared
# rows are written by every writer and must land once). Prints how many rows were new to it.
WRITER = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from arenaforge.schemas.models import Rejection
    from arenaforge.warehouse import Warehouse

    location, data_path, who, go = sys.argv[1], sys.argv[2] or None, sys.argv[3], Path(sys.argv[4])
    wh = Warehouse(location, lock_timeout_s=120, data_path=data_path)
    wh.relations()
    print("ready", flush=True)
    deadline = time.monotonic() + 900  # the other writers may take minutes to start on a loaded machine
    while not go.exists():
        assert time.monotonic() < deadline
        time.sleep(0.01)
    new = 0
    for batch in range(20):
        rows = [Rejection(stage="own", subject=f"{who}-{batch}-{i}", reason="malformed_json") for i in range(5)]
        rows += [Rejection(stage="shared", subject=f"shared-{batch}-{i}", reason="malformed_json") for i in range(5)]
        new += wh.upsert(rows)
    print(new, flush=True)
    """
)


def run_writers(location: str, data_path: str, names: list[str], go: Path) -> list[int]:
    """Start one WRITER process per name, release them together, return each one's new-row count."""
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, location, data_path, who, str(go)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for who in names]
    for p in procs:
        assert p.stdout is not None
        line = p.stdout.readline().strip()
        assert line == "ready", p.stderr.read() if p.stderr else line
    go.touch()
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0] * len(procs), [err[-2000:] for _, err in outs]
    return [int(out.strip()) for out, _ in outs]
