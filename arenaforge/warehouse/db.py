"""The DuckDB warehouse: connections, migrations and idempotent record writes.

DuckDB allows one writing *process* per file. Arenaforge never holds a connection across a
long step: every read or write opens the file, does its work in one transaction and closes,
retrying with backoff while another process holds the lock. Two flows in two processes (a
scheduled synthesis and a training run) therefore interleave their writes instead of failing.

Within a process DuckDB shares one database instance between connections, so threads each
open their own connection (never share one).
"""

from __future__ import annotations

import contextlib
import json
import random
import threading
import time
from collections.abc import Iterable, Iterator, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import duckdb

from arenaforge.schemas.base import Record
from arenaforge.schemas.contracts import validate
from arenaforge.schemas.errors import WarehouseError

R = TypeVar("R", bound=Record)

_MIGRATED: set[str] = set()
_MIGRATE_LOCK = threading.Lock()
# "Unique file handle conflict": two threads of one process opening the file at the same instant (retrying wins).
_LOCK_MARKERS = ("Could not set lock", "Conflicting lock", "database is locked", "being used by another process",
                 "Unique file handle conflict")

# Columns of every artifact table (see migrations/0001_init.sql); `record` is cast to JSON on insert.
_RECORD_COLUMNS = [("id", "VARCHAR"), ("run_id", "VARCHAR"), ("parents", "VARCHAR[]"), ("record", "VARCHAR")]


def column_rows(columns: Sequence[tuple[str, str]]) -> str:
    """A relation over typed per-column parameter lists, bound in order as $1, $2, ...

    Every batched write binds its rows this way. DuckDB's `executemany` runs a statement per row
    (~10 ms each here), and registering Arrow tables (`con.register`) races inside DuckDB 2.0
    when another thread opens a connection to the same file ("Table Function with name
    python_arrow_scan does not exist"), which our group-commit writer threads do.
    """
    return "(SELECT " + ", ".join(f"unnest(${i}::{kind}[]) AS {name}" for i, (name, kind) in enumerate(columns, 1)) + ")"


def column_lists(rows: Sequence[Sequence[Any]], width: int) -> list[list[Any]]:
    """Row tuples -> one list per column (the parameters of `column_rows`)."""
    return [list(col) for col in zip(*rows, strict=True)] if rows else [[] for _ in range(width)]


def _is_lock_error(err: Exception) -> bool:
    return any(marker in str(err) for marker in _LOCK_MARKERS)


def migration_files() -> list[tuple[int, str, str]]:
    """(version, name, sql) of every migration, in order."""
    found = []
    for entry in resources.files("arenaforge.warehouse.migrations").iterdir():
        name = entry.name
        if name.endswith(".sql") and name[:4].isdigit():
            found.append((int(name[:4]), name, entry.read_text()))
    versions = [v for v, _, _ in found]
    if len(versions) != len(set(versions)):
        raise WarehouseError(f"two migrations share a number: {sorted(n for _, n, _ in found)}")
    return sorted(found)


class Warehouse:
    """A DuckDB file holding every artifact, with lineage and run ids."""

    def __init__(self, path: str | Path = "./arenaforge.duckdb", lock_timeout_s: float = 120.0) -> None:
        self.path = Path(path)
        self.lock_timeout_s = lock_timeout_s

    # ------------------------------------------------------------------ connections
    @contextlib.contextmanager
    def connect(self, read_only: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
        """A fresh connection to a migrated warehouse, closed on exit."""
        con = self._open()
        try:
            self._ensure_migrated(con)
            yield con
        finally:
            con.close()

    def _open(self) -> duckdb.DuckDBPyConnection:
        if self.path.parent and not self.path.parent.exists():
            raise WarehouseError(f"warehouse directory {self.path.parent} does not exist")
        deadline = time.monotonic() + self.lock_timeout_s
        delay = 0.01
        while True:
            try:
                return duckdb.connect(str(self.path))
            except duckdb.Error as err:
                if not _is_lock_error(err):
                    raise WarehouseError(f"cannot open warehouse {self.path}: {str(err).splitlines()[0]}") from None
                if time.monotonic() > deadline:
                    raise WarehouseError(
                        f"warehouse {self.path} stayed locked by another process for {self.lock_timeout_s:.0f}s"
                    ) from None
                time.sleep(delay * (0.5 + random.random()))
                delay = min(delay * 2, 0.5)

    def _ensure_migrated(self, con: duckdb.DuckDBPyConnection) -> None:
        key = str(self.path.resolve())
        if key in _MIGRATED:
            return
        with _MIGRATE_LOCK:
            if key not in _MIGRATED:
                self.migrate(con)
                _MIGRATED.add(key)

    @staticmethod
    def migrate(con: duckdb.DuckDBPyConnection) -> list[str]:
        """Apply every migration not yet applied, each in its own transaction; names applied."""
        con.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations "
            "(version INTEGER PRIMARY KEY, name VARCHAR NOT NULL, applied_at TIMESTAMP DEFAULT current_timestamp)"
        )
        done = {v for (v,) in con.execute("SELECT version FROM schema_migrations").fetchall()}
        applied = []
        for version, name, sql in migration_files():
            if version in done:
                continue
            con.execute("BEGIN TRANSACTION")
            try:
                con.execute(sql)
                con.execute("INSERT INTO schema_migrations (version, name) VALUES (?, ?)", [version, name])
                con.execute("COMMIT")
            except duckdb.Error as err:
                con.execute("ROLLBACK")
                raise WarehouseError(f"migration {name} failed: {str(err).splitlines()[0]}") from None
            applied.append(name)
        return applied

    @contextlib.contextmanager
    def transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A connection inside BEGIN/COMMIT; anything raised rolls the whole block back."""
        with self.connect() as con:
            con.execute("BEGIN TRANSACTION")
            try:
                yield con
            except BaseException:
                con.execute("ROLLBACK")
                raise
            con.execute("COMMIT")

    # ------------------------------------------------------------------ writes
    def upsert(self, records: Iterable[Record], replace: bool = False) -> int:
        """Insert records (any mix of kinds) in one transaction; returns how many were new.

        Existing ids are left alone (the content is the same by construction) unless `replace`
        is set, which is for records whose state changes under a fixed id (runs).
        """
        by_table: dict[str, list[Record]] = {}
        for record in records:
            by_table.setdefault(record.TABLE, []).append(record)
        if not by_table:
            return 0
        batches = {table: self._record_rows(items) for table, items in by_table.items()}
        new = 0
        with self.transaction() as con:
            for table, batch in batches.items():
                new += self._insert_batch(con, table, batch, replace)
        return new

    @staticmethod
    def _record_rows(records: Sequence[Record]) -> list[list[Any]]:
        rows: dict[str, tuple[Any, ...]] = {}
        for record in records:
            data = record.content()
            validate(record.KIND, data)  # the JSON contract, at the storage boundary
            # stored in the record's own key order (its id ignores order): tool code iterates an environment's state
            stored = json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
            rows[record.id] = (record.id, record.run_id, list(record.parents), stored)
        return column_lists(list(rows.values()), len(_RECORD_COLUMNS))

    @staticmethod
    def _insert_batch(con: duckdb.DuckDBPyConnection, table: str, columns: list[list[Any]], replace: bool) -> int:
        new = con.execute(f"SELECT count(*) FROM {column_rows(_RECORD_COLUMNS[:1])} WHERE id NOT IN (SELECT id FROM {table})",
                          columns[:1]).fetchall()[0][0]
        conflict = "DO UPDATE SET record = EXCLUDED.record, run_id = EXCLUDED.run_id" if replace else "DO NOTHING"
        con.execute(
            f"INSERT INTO {table} (id, run_id, parents, record) "
            f"SELECT id, run_id, parents, CAST(record AS JSON) FROM {column_rows(_RECORD_COLUMNS)} ON CONFLICT (id) {conflict}",
            columns,
        )
        return int(new)

    # ------------------------------------------------------------------ reads
    def get(self, model: type[R], record_id: str) -> R | None:
        with self.connect() as con:
            row = con.execute(f"SELECT record FROM {model.TABLE} WHERE id = ?", [record_id]).fetchone()
        return None if row is None else model.model_validate_json(row[0])

    def load(self, model: type[R], where: str = "", params: Sequence[Any] = (), limit: int | None = None) -> list[R]:
        """Records of one kind; `where` is SQL over the table's columns (record is JSON)."""
        sql = f"SELECT record FROM {model.TABLE}"
        if where:
            sql += f" WHERE {where}"
        sql += " ORDER BY created_at, id"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        with self.connect() as con:
            rows = con.execute(sql, list(params)).fetchall()
        return [model.model_validate_json(r[0]) for r in rows]

    def ids(self, model: type[Record]) -> set[str]:
        with self.connect() as con:
            return {r[0] for r in con.execute(f"SELECT id FROM {model.TABLE}").fetchall()}

    def count(self, table: str) -> int:
        self.require_relation(table)
        with self.connect() as con:
            return int(con.execute(f'SELECT count(*) FROM "{table}"').fetchone()[0])

    def relations(self) -> list[tuple[str, str]]:
        """(name, 'table' | 'view') of everything a user can browse."""
        with self.connect() as con:
            tables = con.execute(
                "SELECT table_name, CASE WHEN table_type = 'VIEW' THEN 'view' ELSE 'table' END "
                "FROM information_schema.tables WHERE table_schema = 'main' ORDER BY 2, 1"
            ).fetchall()
        return [(n, k) for n, k in tables]

    def require_relation(self, name: str) -> None:
        known = {n for n, _ in self.relations()}
        if name not in known:
            raise WarehouseError(f"unknown table or view {name!r}; see `arenaforge db tables`")

    def query(self, sql: str, params: Sequence[Any] = ()) -> "tuple[list[str], list[tuple]]":
        """Run SQL; (column names, rows). SQL errors become one-line WarehouseErrors."""
        with self.connect() as con:
            try:
                cur = con.execute(sql, list(params))
            except duckdb.Error as err:
                raise WarehouseError(f"query failed: {str(err).splitlines()[0]}") from None
            if cur.description is None:
                return [], []
            return [d[0] for d in cur.description], cur.fetchall()
