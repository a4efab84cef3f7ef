"""The single-file layout (a DuckDB database file): how warehouses were stored before DuckLake.

Still opened when `warehouse.path` names an existing DuckDB file (or `file:PATH`), so nothing
breaks before `arenaforge db migrate --from FILE` moves it to the shared layout, and kept as the
baseline of `arenaforge bench warehouse`. Its limits are DuckDB's: one writer *process* per file,
and any open session (a notebook, the CLI) blocks every other process, so every operation opens
the file, does its work in one transaction and closes, retrying with backoff while another
process holds the lock.
"""

from __future__ import annotations

import contextlib
import random
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import duckdb

from arenaforge.schemas.errors import WarehouseError
from arenaforge.warehouse.rows import KeyedRows

_MIGRATED: set[str] = set()
_MIGRATE_LOCK = threading.Lock()
# "Unique file handle conflict": two threads of one process opening the file at the same instant (retrying wins).
_LOCK_MARKERS = ("Could not set lock", "Conflicting lock", "database is locked", "being used by another process",
                 "Unique file handle conflict")
DUCKDB_MAGIC = b"DUCK"  # bytes 8..12 of every DuckDB database file


def is_duckdb_file(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(12)[8:12] == DUCKDB_MAGIC
    except OSError:
        return False


def _is_lock_error(err: Exception) -> bool:
    return any(marker in str(err) for marker in _LOCK_MARKERS)


class FileStore:
    """One DuckDB file; native PRIMARY KEYs make upserts `ON CONFLICT` statements."""

    layout = "single-file"

    def __init__(self, path: Path, lock_timeout_s: float, migrations: Sequence[tuple[int, str, str]]) -> None:
        self.path = path
        self.location = str(path)
        self.key = str(path.resolve())
        self.lock_timeout_s = lock_timeout_s
        self.migrations = migrations

    @property
    def keys(self) -> dict[str, list[str]]:
        from arenaforge.warehouse.lake_schema import declared_keys

        return declared_keys(self.migrations)

    @contextlib.contextmanager
    def connect(self) -> Iterator[duckdb.DuckDBPyConnection]:
        con = self._open()
        try:
            self._ensure_migrated(con)
            yield con
        finally:
            con.close()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        with self.connect() as con:
            con.execute("BEGIN TRANSACTION")
            try:
                yield con
            except BaseException:
                con.execute("ROLLBACK")
                raise
            con.execute("COMMIT")

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
                self._apply(con)
                _MIGRATED.add(key)

    def migrate(self) -> list[str]:
        with contextlib.closing(self._open()) as con:
            return self._apply(con)

    def _apply(self, con: duckdb.DuckDBPyConnection) -> list[str]:
        """Apply every migration not yet applied, each in its own transaction; names applied."""
        con.execute(
            "CREATE TABLE IF NOT EXISTS schema_migrations "
            "(version INTEGER PRIMARY KEY, name VARCHAR NOT NULL, applied_at TIMESTAMP DEFAULT current_timestamp)"
        )
        done = {v for (v,) in con.execute("SELECT version FROM schema_migrations").fetchall()}
        applied = []
        for version, name, sql in self.migrations:
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

    def insert_new(self, con: duckdb.DuckDBPyConnection, table: str, names: str, select: str, params: list[Any],
                   key: Sequence[str], replace: bool = False) -> int:
        """Insert the rows of `select` whose key is not stored yet (or overwrite them with `replace`); new rows."""
        keys = ", ".join(key)
        new = con.execute(f"SELECT count(*) FROM {select} b WHERE ({keys}) NOT IN (SELECT ({keys}) FROM {table})"
                          if len(key) > 1 else
                          f"SELECT count(*) FROM {select} b WHERE {keys} NOT IN (SELECT {keys} FROM {table})",
                          params).fetchone()[0]
        others = [c.strip() for c in names.split(",") if c.strip() not in key]
        conflict = ("DO UPDATE SET " + ", ".join(f"{c} = EXCLUDED.{c}" for c in others)) if replace else "DO NOTHING"
        con.execute(f"INSERT INTO {table} ({names}) SELECT {names} FROM {select} ON CONFLICT ({keys}) {conflict}", params)
        return int(new)

    def write_new(self, batches: Sequence[KeyedRows]) -> list[int]:
        """Insert every batch's rows whose key is not stored yet, in one transaction; rows new per batch."""
        if not any(b.rows for b in batches):
            return [0] * len(batches)
        with self.transaction() as con:
            return [self.insert_new(con, b.table, b.names, b.select(), b.params(), b.key) if b.rows else 0
                    for b in batches]

    @staticmethod
    def relations(con: duckdb.DuckDBPyConnection) -> list[tuple[str, str]]:
        rows = con.execute(
            "SELECT table_name, CASE WHEN table_type = 'VIEW' THEN 'view' ELSE 'table' END "
            "FROM information_schema.tables WHERE table_catalog = current_database() AND table_schema = 'main' "
            "ORDER BY 2, 1").fetchall()
        return [(n, k) for n, k in rows]

    def compact(self, older_than_hours: float = 24.0) -> dict[str, Any]:
        with self.connect() as con:
            con.execute("CHECKPOINT")
        return {"layout": self.layout, "checkpointed": True}

    def cli_args(self) -> list[str]:
        return ["-readonly", str(self.path.resolve())]

    def close(self) -> None:
        pass
