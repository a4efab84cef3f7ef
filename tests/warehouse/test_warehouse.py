"""The DuckDB warehouse: migrations, idempotent upserts, atomic batches, lineage, exports, locks."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import duckdb
import polars as pl
import pytest

from arenaforge.schemas import FunctionDoc, Rejection, Server, Tool, WarehouseError
from arenaforge.warehouse import Warehouse, export_relation, migration_files, recorded_run
from arenaforge.warehouse.single_file import _MIGRATED


def _tools(n: int, server: str = "srv") -> list[Tool]:
    return [Tool(server=server, function=FunctionDoc(name=f"t{i}", description=f"tool {i}"), source="openai") for i in range(n)]


def test_migrations_are_numbered_and_idempotent(tmp_warehouse):
    versions = [v for v, _, _ in migration_files()]
    assert versions == sorted(set(versions)) and versions[0] == 1
    with tmp_warehouse.connect() as con:
        again = Warehouse.migrate(con)  # already applied on connect
        applied = con.execute("SELECT count(*) FROM schema_migrations").fetchone()[0]
    assert again == [] and applied == len(versions)
    names = {n for n, _ in tmp_warehouse.relations()}
    assert {"tools", "environments", "trajectories", "runs", "rejections", "llm_cache", "v_environments", "v_trajectories"} <= names


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
    bad = Rejection(stage="s", subject="x", reason="r")
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


def test_second_process_waits_for_the_lock_instead_of_failing(tmp_path):
    path = tmp_path / "shared.duckdb"
    Warehouse(path).upsert(_tools(1))
    holder = duckdb.connect(str(path))  # this process holds the write lock...
    script = textwrap.dedent(
        f"""
        from arenaforge.schemas import Tool, FunctionDoc
        from arenaforge.warehouse import Warehouse
        wh = Warehouse({str(path)!r}, lock_timeout_s=30)
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
    assert Warehouse(path).count("tools") == 2


def test_lock_timeout_is_a_clear_error(tmp_path):
    path = tmp_path / "locked.duckdb"
    Warehouse(path).upsert(_tools(1))
    script = f"import duckdb, time; c = duckdb.connect({str(path)!r}); print('held', flush=True); time.sleep(60)"
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        with pytest.raises(WarehouseError, match="stayed locked by another process"):
            Warehouse(path, lock_timeout_s=0.5).upsert(_tools(2))
    finally:
        proc.kill()
        proc.wait()


def test_writer_threads_and_upserts_share_one_file_without_errors(tmp_warehouse):
    """Group-commit writer threads and the caller's batch upserts open connections to the same file at
    once (DuckDB 2.0's Arrow scans raced there: 'python_arrow_scan does not exist')."""
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
            for i in range(150):
                time.sleep(random.random() * 0.003)
                tmp_warehouse.upsert(_tools(2, server=f"{tag}{i}"))
        except BaseException as err:  # noqa: BLE001 - collected and asserted below
            errors.append(err)

    threads = [threading.Thread(target=upserts, args=(tag,)) for tag in ("a", "b", "c")]
    for t in threads:
        t.start()
    for i in range(600):
        writer.add({"call_id": f"c{i}", "key": "k", "model": "m", "cached": i % 2 == 0, "attempts": 1, "reasks": 0,
                    "prompt_tokens": None if i % 3 else i, "latency_s": 0.5})
        if i % 20 == 0:
            time.sleep(0.002)
    for t in threads:
        t.join()
    writer.close()
    assert errors == []
    assert tmp_warehouse.count("tools") == 3 * 150 * 2
    _, rows = tmp_warehouse.query("SELECT count(*), count(prompt_tokens), sum(cached::INT) FROM llm_calls")
    assert rows == [(600, 200, 300)]
