"""The warehouse: every artifact with its lineage, behind one API whatever the storage layout.

Two layouts, one `Warehouse` API (upsert / load / get / ids / count / query / connect /
transaction / relations):

- DuckLake (the default, `lake.py`): a catalog (a SQLite file, or PostgreSQL for writers on many
  machines) plus Parquet files. Any number of processes read while several write; writers take
  turns through one lock, readers never wait.
- a single DuckDB file (`single_file.py`): the layout before DuckLake, opened when `path` is an
  existing DuckDB file (or `file:PATH`); `arenaforge db migrate --from FILE` moves it to DuckLake.

Within a process threads each get their own connection from `connect()` (never share one).
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Iterator, Sequence
from importlib import resources
from pathlib import Path
from typing import Any, TypeVar

import duckdb

from arenaforge.schemas.base import Record
from arenaforge.schemas.config import WarehouseConfig
from arenaforge.schemas.contracts import validate
from arenaforge.schemas.errors import WarehouseError
from arenaforge.warehouse.lake import LakeLocation, LakeStore, is_postgres
from arenaforge.warehouse.rows import KeyedRows, column_lists, column_rows  # noqa: F401 - column_* re-exported
from arenaforge.warehouse.single_file import FileStore, is_duckdb_file

R = TypeVar("R", bound=Record)

DEFAULT_PATH = "./arenaforge.lake"
# Columns of every artifact table (see migrations/0001_init.sql); `record` is cast to JSON on insert.
_RECORD_COLUMNS = [("id", "VARCHAR"), ("run_id", "VARCHAR"), ("parents", "VARCHAR[]"), ("record", "VARCHAR")]
_RECORDS = "(SELECT id, run_id, parents, CAST(record AS JSON) AS record FROM {rows})"
# Statement kinds that change data or schema: `query()` runs them under the writers' lock.
_WRITES = {duckdb.StatementType.INSERT, duckdb.StatementType.UPDATE, duckdb.StatementType.DELETE,
           duckdb.StatementType.CREATE, duckdb.StatementType.DROP, duckdb.StatementType.ALTER,
           duckdb.StatementType.MERGE_INTO, duckdb.StatementType.CALL}


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


def absolute_location(path: str | Path, base: Path | None = None) -> str:
    """`path` with a local path made absolute against `base` (default: the working directory), to hand to
    another process; other locations (PostgreSQL, URLs) as given."""
    text = str(path)
    if is_postgres(text) or "://" in text:
        return text
    root = base if base is not None else Path.cwd()
    if text.startswith("file:"):
        return "file:" + str((root / Path(text[5:]).expanduser()).resolve())
    return str((root / Path(text).expanduser()).resolve())


def open_store(path: str | Path, lock_timeout_s: float, data_path: str | None = None) -> FileStore | LakeStore:
    """The layout `path` names: `postgres:...` / `postgresql://...` a PostgreSQL-catalog lake,
    `file:PATH` or an existing DuckDB file the single-file layout, anything else a lake directory."""
    text = str(path)
    if text.startswith("file:"):
        return FileStore(Path(text[5:]), lock_timeout_s, migration_files())
    if not is_postgres(text) and is_duckdb_file(Path(text)):
        return FileStore(Path(text), lock_timeout_s, migration_files())
    return LakeStore(LakeLocation.parse(text, data_path), lock_timeout_s, migration_files())


class Warehouse:
    """Every artifact, with lineage and run ids: a DuckLake (default) or a single DuckDB file."""

    def __init__(self, path: str | Path = DEFAULT_PATH, lock_timeout_s: float = 120.0,
                 data_path: str | None = None) -> None:
        self.store = open_store(path, lock_timeout_s, data_path)
        self.path: Path | str = self.store.path  # a directory or file; a PostgreSQL catalog's conninfo
        self.lock_timeout_s = lock_timeout_s

    @classmethod
    def from_config(cls, settings: WarehouseConfig) -> Warehouse:
        """The warehouse a config's `[warehouse]` section names (every flow, job and Ray worker opens it so)."""
        return cls(settings.path, lock_timeout_s=settings.lock_timeout_s, data_path=settings.data_path)

    @property
    def layout(self) -> str:
        return self.store.layout

    @property
    def key(self) -> str:
        """The same string for every Warehouse object naming this warehouse."""
        return self.store.key

    # ------------------------------------------------------------------ connections
    @contextlib.contextmanager
    def connect(self, read_only: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
        """A fresh connection to the migrated warehouse (its tables unqualified), closed on exit.

        For reads (in a lake they share one snapshot); it does not take the writers' lock, so write
        with `transaction()` or `upsert()`.
        """
        with self.store.connect() as con:
            yield con

    @contextlib.contextmanager
    def transaction(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A connection inside BEGIN/COMMIT, holding the writers' lock; anything raised rolls the block back."""
        with self.store.transaction() as con:
            yield con

    def migrate(self) -> list[str]:
        """Apply every migration not yet applied (each in its own transaction); names applied."""
        return self.store.migrate()

    def applied_migrations(self) -> list[str]:
        _, rows = self.query("SELECT name FROM schema_migrations ORDER BY version")
        return [name for (name,) in rows]

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
        batches = [KeyedRows(table, _RECORD_COLUMNS, self._record_rows(items), ["id"], _RECORDS)
                   for table, items in by_table.items()]
        if replace:
            with self.transaction() as con:
                return sum(self.store.insert_new(con, b.table, b.names, b.select(), b.params(), b.key, True)
                           for b in batches)
        from arenaforge.warehouse.buffer import riding_rows  # here: buffer.py imports this module

        committer = riding_rows(self)  # queued cache/usage rows ride along: one commit instead of two
        taken = committer.take() if committer is not None else {}
        try:
            riding = committer.batches(taken) if taken else []  # type: ignore[union-attr]
            new = sum(self.store.write_new(batches + riding)[: len(batches)])
        except BaseException:
            if taken:
                committer.give_back(taken)  # type: ignore[union-attr]
            raise
        if taken:
            committer.done(taken)  # type: ignore[union-attr]
        return new

    def insert_rows(self, table: str, columns: Sequence[tuple[str, str]], rows: Sequence[Sequence[Any]]) -> int:
        """Insert plain rows (typed `columns`, one tuple per row) whose key is not stored yet, in one
        transaction; the key is the table's declared PRIMARY KEY. Returns how many were new."""
        return self.store.write_new([KeyedRows.first_per_key(table, columns, rows, self.key_of(table))])[0]

    def key_of(self, table: str) -> list[str]:
        """The columns that identify a row of `table` (its declared PRIMARY KEY)."""
        keys = self.store.keys
        if table not in keys:
            raise WarehouseError(f"table {table!r} declares no key; see arenaforge/warehouse/migrations")
        return keys[table]

    @staticmethod
    def _record_rows(records: Sequence[Record]) -> list[tuple[Any, ...]]:
        rows: dict[str, tuple[Any, ...]] = {}
        for record in records:
            data = record.content()
            validate(record.KIND, data)  # the JSON contract, at the storage boundary
            # stored in the record's own key order (its id ignores order): tool code iterates an environment's state
            stored = json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
            rows[record.id] = (record.id, record.run_id, list(record.parents), stored)
        return list(rows.values())

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
            return self.store.relations(con)

    def require_relation(self, name: str) -> None:
        known = {n for n, _ in self.relations()}
        if name not in known:
            raise WarehouseError(f"unknown table or view {name!r}; see `arenaforge db tables`")

    def query(self, sql: str, params: Sequence[Any] = ()) -> "tuple[list[str], list[tuple]]":
        """Run SQL; (column names, rows). Statements that write take the writers' lock; SQL errors
        become one-line WarehouseErrors."""
        with self.connect() as con:
            try:
                writes = any(s.type in _WRITES for s in con.extract_statements(sql))
            except duckdb.Error as err:
                raise WarehouseError(f"query failed: {str(err).splitlines()[0]}") from None
        opened = self.transaction() if writes else self.connect()
        with opened as con:
            try:
                cur = con.execute(sql, list(params))
            except duckdb.Error as err:
                raise WarehouseError(f"query failed: {str(err).splitlines()[0]}") from None
            if cur.description is None:
                return [], []
            return [d[0] for d in cur.description], cur.fetchall()

    # ------------------------------------------------------------------ maintenance and browsing
    def compact(self, older_than_hours: float = 24.0) -> dict[str, Any]:
        """Merge small files; drop snapshots and files from before the UTC day `older_than_hours` ago."""
        return self.store.compact(older_than_hours)

    def cli_args(self) -> list[str]:
        """Arguments that open this warehouse read-only in the DuckDB CLI."""
        return self.store.cli_args()
