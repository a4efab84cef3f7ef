"""Writers on several machines: a DuckLake whose catalog is a real PostgreSQL server on loopback.

Each writer is its own process (as it would be on its own machine), sharing only the PostgreSQL
catalog and the data directory.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap

import pytest

from arenaforge.schemas import WarehouseError
from arenaforge.warehouse import Warehouse
from tests.warehouse.conftest import run_writers


def _reset(conninfo: str) -> None:
    from arenaforge.benchmarks.warehouse import _reset_postgres

    _reset_postgres(conninfo)


def test_two_writers_on_a_postgres_catalog_lose_and_duplicate_nothing(postgres_catalog, tmp_path):
    _reset(f"postgres:{postgres_catalog}")
    location, data = f"postgres:{postgres_catalog}", str(tmp_path / "data")
    wh = Warehouse(location, data_path=data)
    assert wh.layout == "ducklake" and len(wh.migrate()) == len(wh.applied_migrations()) > 0
    news = run_writers(location, data, ["a", "b"], tmp_path / "go")
    _, rows = wh.query("SELECT record->>'stage', count(*), count(DISTINCT record->>'subject') FROM rejections "
                       "GROUP BY 1 ORDER BY 1")
    assert rows == [("own", 200, 200), ("shared", 100, 100)]
    assert sum(news) == 300  # each shared row was new to exactly one writer
    done = wh.compact(older_than_hours=0)  # small batches sat inlined in the catalog: now Parquet under data_path
    assert done["after"]["inlined_rows"] == 0 and list((tmp_path / "data").rglob("*.parquet"))
    assert wh.count("rejections") == 300
    assert {n for n, _ in wh.relations()} >= {"v_environments", "environments", "llm_cache"}


HOLDER = textwrap.dedent(
    """
    import sys
    from arenaforge.warehouse import Warehouse
    wh = Warehouse(sys.argv[1], data_path=sys.argv[2])
    with wh.transaction():  # holds the writers' advisory lock until told to go
        print("holding", flush=True)
        sys.stdin.readline()
    """
)


def test_a_writer_waits_for_the_lock_then_times_out_clearly(postgres_catalog, tmp_path):
    _reset(f"postgres:{postgres_catalog}")
    location, data = f"postgres:{postgres_catalog}", str(tmp_path / "data")
    Warehouse(location, data_path=data).relations()
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, location, data], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "holding"
        impatient = Warehouse(location, data_path=data, lock_timeout_s=0.5)
        impatient.relations()  # readers never wait for the lock
        with pytest.raises(WarehouseError, match="stayed locked by another writer"):
            impatient.query("CREATE TABLE scratch (x INTEGER)")
    finally:
        holder.stdin.write("\n")
        holder.stdin.flush()
        holder.communicate(timeout=60)
    assert holder.returncode == 0
    Warehouse(location, data_path=data).query("CREATE TABLE scratch (x INTEGER)")
    assert "scratch" in {n for n, _ in Warehouse(location, data_path=data).relations()}


def test_a_postgres_catalog_needs_a_data_path():
    with pytest.raises(WarehouseError, match="needs warehouse.data_path"):
        Warehouse("postgres:host=127.0.0.1 dbname=lake")
