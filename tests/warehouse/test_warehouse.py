"""The warehouse: migrations, idempotent upserts, atomic batches, lineage, exports, readers beside writers.

`tmp_warehouse` is the default layout (DuckLake, SQLite catalog); the single-file layout's lock
behaviour is tested on `file:` paths.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
import textwrap

import duckdb
import polars as pl
import pytest

from arenaforge.schemas import FunctionDoc, Rejection, Server, Tool, WarehouseError
from arenaforge.warehouse import Warehouse, export_relation, migration_files, recorded_run
from arenaforge.warehouse.lake import LakeLocation, LakeStore
from arenaforge.warehouse.single_file import _MIGRATED
from arenaforge.warehouse.writer_lock import FileWriterLock
from tests.warehouse.conftest import run_writers


def _tools(n: int, server: str = "srv") -> list[Tool]:
    return [Tool(server=server, function=FunctionDoc(name=f"t{i}", description=f"tool {i}"), source="openai") for i in range(n)]


def test_migrations_are_numbered_and_idempotent(tmp_warehouse):
    versions = [v for v, _, _ in migration_files()]
    assert versions == sorted(set(versions)) and versions[0] == 1
    assert tmp_warehouse.layout == "ducklake"
    names = {n for n, _ in tmp_warehouse.relations()}  # first use applies every migration
    assert tmp_warehouse.migrate() == []
    assert tmp_warehouse.applied_migrations() == [name for _, name, _ in migration_files()]
    assert {"tools", "environments", "trajectories", "runs", "rejections", "llm_cache", "v_environments", "v_trajectories"} <= names
    assert tmp_warehouse.key_of("graph_edges") == ["server", "src", "dst"] and tmp_warehouse.key_of("tools") == ["id"]


NEW_MIGRATION = """
-- written for plain DuckDB, like every migration: a keyed table, an index, a view, a data change
CREATE TABLE IF NOT EXISTS splits (env_id VARCHAR NOT NULL, split VARCHAR NOT NULL, weight DOUBLE DEFAULT 1.0,
    created_at TIMESTAMP DEFAULT current_timestamp, PRIMARY KEY (env_id, split));
CREATE INDEX IF NOT EXISTS splits_by_split ON splits (split);
CREATE TABLE IF NOT EXISTS splits (env_id VARCHAR PRIMARY KEY);
INSERT INTO splits (env_id, split) VALUES ('seed', 'train');
CREATE OR REPLACE VIEW v_splits AS SELECT split, count(*) AS envs FROM splits GROUP BY split;
"""


def test_a_new_numbered_migration_written_for_duckdb_applies_to_the_lake(tmp_path):
    migrations = [*migration_files(), (99, "0099_splits.sql", NEW_MIGRATION)]
    store = LakeStore(LakeLocation.parse(str(tmp_path / "w.lake")), 30, migrations)
    assert store.migrate()[-1] == "0099_splits.sql"
    assert store.keys["splits"] == ["env_id", "split"]
    with store.transaction() as con:  # the declared key makes inserts idempotent, default and NOT NULL kept
        cols = "env_id, split"
        select = "(SELECT * FROM (VALUES ('seed', 'train'), ('e1', 'eval')) v(env_id, split))"
        assert store.insert_new(con, "splits", cols, select, [], store.keys["splits"]) == 1
    with store.connect() as con:
        assert con.execute("SELECT * FROM v_splits ORDER BY 1").fetchall() == [("eval", 1), ("train", 1)]
        assert con.execute("SELECT count(*) FROM splits WHERE weight = 1.0 AND created_at IS NOT NULL").fetchone()[0] == 2
        with pytest.raises(duckdb.Error, match="NOT NULL"):
            con.execute("INSERT INTO splits (env_id) VALUES ('no-split')")
    assert store.migrate() == []


def test_upsert_is_idempotent_and_counts_new_rows(tmp_warehouse):
    tools = _tools(5)
    assert tmp_warehouse.upsert(tools) == 5
    assert tmp_warehouse.upsert(tools) == 0
    assert tmp_warehouse.upsert(_tools(7)) == 2
    assert tmp_warehouse.count("tools") == 7
    assert tmp_warehouse.get(Tool, tools[0].id) == tools[0]


def test_lineage_and_run_ids_are_stored(tmp_warehouse):
    tools = _tools(2)
    with recorded_run(tmp_warehouse, "ingest", {"path": "x"}) as (run, counts):
        server = Server(name="srv", source="openai", tool_names=["t0", "t1"], parents=[t.id for t in tools], run_id=run.id)
        counts["servers"] = tmp_warehouse.upsert([server, *tools])
    _, rows = tmp_warehouse.query("SELECT run_id, parents FROM servers")
    assert rows == [(run.id, [t.id for t in tools])]
    _, runs = tmp_warehouse.query("SELECT status, counts FROM v_runs")
    assert runs == [("completed", '{"servers":3}')]


def test_batch_is_atomic_across_tables(tmp_warehouse):
    good = _tools(3)
    bad = Rejection(stage="s", subject="x", reason="malformed_json")
    object.__setattr__(bad, "reason", 42)  # breaks the contract after construction
    with pytest.raises(Exception):
        tmp_warehouse.upsert([*good, bad])
    assert tmp_warehouse.count("tools") == 0 and tmp_warehouse.count("rejections") == 0


def test_failed_run_is_recorded(tmp_warehouse):
    with pytest.raises(RuntimeError):
        with recorded_run(tmp_warehouse, "boom", {}):
            raise RuntimeError("kaput")
    _, rows = tmp_warehouse.query("SELECT status, error FROM v_runs")
    assert rows == [("failed", "RuntimeError: kaput")]


def test_unknown_relation_is_a_one_line_error(tmp_warehouse):
    with pytest.raises(WarehouseError, match="unknown table or view 'nope'"):
        tmp_warehouse.count("nope")
    with pytest.raises(WarehouseError, match="query failed"):
        tmp_warehouse.query("SELECT * FROM nope")


@pytest.mark.parametrize("fmt", ["parquet", "jsonl"])
def test_export_tables_and_views(tmp_warehouse, tmp_path, fmt):
    tmp_warehouse.upsert(_tools(4))
    path = export_relation(tmp_warehouse, "v_tools", fmt, tmp_path / f"tools.{fmt}")
    frame = pl.read_parquet(path) if fmt == "parquet" else pl.read_ndjson(path)
    assert frame.height == 4 and sorted(frame["name"].to_list()) == ["t0", "t1", "t2", "t3"]
    raw = export_relation(tmp_warehouse, "tools", fmt, tmp_path / f"raw.{fmt}")
    frame = pl.read_parquet(raw) if fmt == "parquet" else pl.read_ndjson(raw)
    record = frame["record"][0]
    assert (json.loads(record) if fmt == "parquet" else record)["server"] == "srv"


def test_single_file_second_process_waits_for_the_lock_instead_of_failing(tmp_path):
    path = tmp_path / "shared.duckdb"
    Warehouse(f"file:{path}").upsert(_tools(1))
    holder = duckdb.connect(str(path))  # this process holds the write lock...
    script = textwrap.dedent(
        f"""
        from arenaforge.schemas import Tool, FunctionDoc
        from arenaforge.warehouse import Warehouse
        wh = Warehouse({str(path)!r}, lock_timeout_s=30)  # an existing DuckDB file: the single-file layout
        n = wh.upsert([Tool(server="other", function=FunctionDoc(name="late"), source="openai")])
        print(n)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        with pytest.raises(subprocess.TimeoutExpired):
            proc.wait(timeout=1.5)  # ...so the other process is still waiting, not failed
    finally:
        holder.close()
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert out.strip() == "1"
    _MIGRATED.clear()
    assert Warehouse(path).layout == "single-file" and Warehouse(path).count("tools") == 2


def test_single_file_lock_timeout_is_a_clear_error(tmp_path):
    path = tmp_path / "locked.duckdb"
    Warehouse(f"file:{path}").upsert(_tools(1))
    script = f"import duckdb, time; c = duckdb.connect({str(path)!r}); print('held', flush=True); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(WarehouseError, match="stayed locked by another process"):
            Warehouse(path, lock_timeout_s=0.5).upsert(_tools(2))
    finally:
        proc.kill()
        proc.wait()


def test_writer_threads_and_upserts_share_one_warehouse_without_errors(tmp_warehouse):
    """Group-commit writer threads and the caller's batch upserts write at once from one process
    (DuckDB 2.0's Arrow scans raced there: 'python_arrow_scan does not exist'); the writers' lock
    lets them take turns."""
    import random
    import threading
    import time

    from arenaforge.warehouse.buffer import BufferedTableWriter

    writer = BufferedTableWriter(tmp_warehouse, "llm_calls", [
        ("call_id", "VARCHAR"), ("key", "VARCHAR"), ("model", "VARCHAR"), ("cached", "BOOLEAN"), ("attempts", "INTEGER"),
        ("reasks", "INTEGER"), ("prompt_tokens", "INTEGER"), ("latency_s", "DOUBLE")], interval_s=0.001)
    errors: list[BaseException] = []

    def upserts(tag: str) -> None:
        try:
            for i in range(40):
                time.sleep(random.random() * 0.003)
                tmp_warehouse.upsert(_tools(2, server=f"{tag}{i}"))
        except BaseException as err:  # noqa: BLE001 - collected and asserted below
            errors.append(err)

    threads = [threading.Thread(target=upserts, args=(tag,)) for tag in ("a", "b", "c")]
    for t in threads:
        t.start()
    for i in range(300):
        writer.add({"call_id": f"c{i}", "key": "k", "model": "m", "cached": i % 2 == 0, "attempts": 1, "reasks": 0,
                    "prompt_tokens": None if i % 3 else i, "latency_s": 0.5})
        if i % 20 == 0:
            time.sleep(0.002)
    for t in threads:
        t.join()
    writer.close()
    assert errors == []
    assert tmp_warehouse.count("tools") == 3 * 40 * 2
    _, rows = tmp_warehouse.query("SELECT count(*), count(prompt_tokens), sum(cached::INT) FROM llm_calls")
    assert rows == [(300, 100, 150)]


# --------------------------------------------------------------------------- readers beside writers
READER = textwrap.dedent(
    """
    import sys
    import duckdb
    # what `arenaforge db cli` runs first: the extensions by path, the catalog attached read-only
    init = sys.argv[1]
    con = duckdb.connect()
    con.execute(init)
    con.execute("BEGIN TRANSACTION")  # a session holding a transaction, like a notebook mid-analysis
    print(con.execute("SELECT count(*) FROM tools").fetchone()[0], flush=True)
    sys.stdin.readline()
    print(con.execute("SELECT count(*) FROM tools").fetchone()[0], flush=True)  # same snapshot
    con.execute("COMMIT")
    print(con.execute("SELECT count(*) FROM v_tools").fetchone()[0], flush=True)  # the latest one
    """
)


def test_a_reader_holding_a_transaction_never_blocks_writers(tmp_warehouse):
    tmp_warehouse.upsert(_tools(3))
    init = tmp_warehouse.cli_args()[1]
    reader = subprocess.Popen([sys.executable, "-c", READER, init], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    try:
        assert reader.stdout.readline().strip() == "3"  # the reader's transaction is open from here on
        for i in range(5):  # with a single DuckDB file, each of these waited for the reader to leave
            assert tmp_warehouse.upsert(_tools(4, server=f"w{i}")) == 4
        assert tmp_warehouse.count("tools") == 23
        reader.stdin.write("\n")
        reader.stdin.flush()
        assert reader.stdout.readline().strip() == "3"
        assert reader.stdout.readline().strip() == "23"
    finally:
        out, err = reader.communicate(timeout=60)
    assert reader.returncode == 0, err


def test_writer_processes_on_a_sqlite_catalog_lose_and_duplicate_nothing(tmp_path):
    location = str(tmp_path / "shared.lake")
    Warehouse(location).relations()
    news = run_writers(location, "", ["a", "b", "c"], tmp_path / "go")
    _, rows = Warehouse(location).query(
        "SELECT record->>'stage', count(*), count(DISTINCT record->>'subject') FROM rejections GROUP BY 1 ORDER BY 1")
    assert rows == [("own", 300, 300), ("shared", 100, 100)]
    assert sum(news) == 400  # every row counted as new exactly once across the writers


def test_compaction_merges_small_files_and_keeps_every_row(tmp_warehouse):
    for i in range(6):  # six commits: small files and rows inlined in the catalog
        tmp_warehouse.upsert(_tools(12 if i % 2 else 3, server=f"s{i}"))
    before = tmp_warehouse.store.storage()
    done = tmp_warehouse.compact(older_than_hours=0)
    after = done["after"]
    assert before["inlined_rows"] > 0 and after["inlined_rows"] == 0
    assert after["data_files"] < before["data_files"] + 1  # merged: fewer files than tables written + flushed
    assert tmp_warehouse.count("tools") == 45
    assert tmp_warehouse.upsert(_tools(12, server="s1")) == 0  # still idempotent over merged files


def test_cli_opens_the_lake_read_only(tmp_warehouse):
    from arenaforge.warehouse.extensions import cli_binary

    tmp_warehouse.upsert(_tools(2))
    done = subprocess.run([cli_binary(), "-csv", "-noheader", *tmp_warehouse.cli_args(), "-c",
                           "SELECT count(*) FROM v_tools"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "2"
    refused = subprocess.run([cli_binary(), *tmp_warehouse.cli_args(), "-c", "DELETE FROM tools"],
                             capture_output=True, text=True, timeout=120)
    assert "read-only" in (refused.stdout + refused.stderr).lower()
    assert tmp_warehouse.count("tools") == 2


def test_a_write_inside_a_write_transaction_is_a_clear_error(tmp_warehouse):
    with tmp_warehouse.transaction() as con:
        con.execute("INSERT INTO graph_edges (server, src, dst, weight, origin) VALUES ('s', 'a', 'b', 1.0, 'dataflow')")
        with pytest.raises(WarehouseError, match="already open in this thread"):
            tmp_warehouse.upsert(_tools(1))  # would otherwise wait on the lock this thread holds
    assert tmp_warehouse.count("graph_edges") == 1 and tmp_warehouse.count("tools") == 0


def test_the_lake_runs_on_one_worker_thread_and_writes_in_the_lake(tmp_warehouse):
    # one worker thread: the warehouse's statements are small, and more threads only added scheduling (WAREHOUSE.md)
    assert tmp_warehouse.query("SELECT current_setting('threads')")[1] == [(1,)]
    with tmp_warehouse.transaction() as con:  # BEGIN, then USE inside it: still the lake's tables
        assert con.execute("SELECT current_database()").fetchone()[0] == "arenaforge"
        con.execute("INSERT INTO graph_edges (server, src, dst, weight, origin) VALUES ('s', 'a', 'b', 1.0, 'dataflow')")
    assert tmp_warehouse.count("graph_edges") == 1


@pytest.mark.parametrize("racer", ["upsert", "plain_sql"])
def test_rows_another_writer_commits_after_the_unlocked_check_still_land_once(tmp_warehouse, monkeypatch, racer):
    # While another writer holds the writers' lock, an upsert checks which keys are stored before taking it;
    # another writer commits the same keys in between. Under the lock only those commits are checked: by the
    # key digests an upsert's commit lists, or (a commit that lists none, e.g. plain SQL) by the rows DuckLake
    # says it inserted.
    tools = _tools(12, server="race")
    tmp_warehouse.upsert(tools[:2])
    store = tmp_warehouse.store
    locked = LakeStore.transaction
    raced = []

    @contextlib.contextmanager
    def busy(self):  # the lock is always found held by someone else: every write takes the unlocked check
        yield False

    def race_then_lock(self, held=False):
        if not raced:  # once: the racing writer's own commit goes through here too
            raced.append(True)
            if racer == "upsert":
                assert tmp_warehouse.upsert(tools[4:8]) == 4
            else:
                tmp_warehouse.query("INSERT INTO tools SELECT * FROM tools LIMIT 0")  # a commit listing no keys
                tmp_warehouse.query("INSERT INTO tools (id, run_id, parents, record) "
                                    "SELECT $1, NULL, [], CAST($2 AS JSON)",
                                    [tools[5].id, tools[5].model_dump_json()])
        return locked(self, held)

    monkeypatch.setattr(FileWriterLock, "try_hold", busy)
    monkeypatch.setattr(LakeStore, "transaction", race_then_lock)
    new = store.write_new([_record_batch(tmp_warehouse, tools)])[0]
    assert new == (12 - 2 - 4 if racer == "upsert" else 12 - 2 - 1)
    _, rows = tmp_warehouse.query("SELECT count(*), count(DISTINCT id) FROM tools")
    assert rows == [(12, 12)]


def _record_batch(wh, records):
    from arenaforge.warehouse.db import _RECORD_COLUMNS, _RECORDS
    from arenaforge.warehouse.rows import KeyedRows

    return KeyedRows("tools", _RECORD_COLUMNS, wh._record_rows(records), ["id"], _RECORDS)
