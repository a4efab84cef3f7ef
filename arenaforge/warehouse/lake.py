"""The shared warehouse: a DuckLake catalog (SQLite file or PostgreSQL) plus Parquet data files.

Why DuckLake: a DuckDB file has one writer process, and a user's open session stalls every flow.
In DuckLake every reader and writer opens the catalog as a client, so any number of processes
read while others write: a reader sees the snapshot its transaction began with and never waits.

- One machine (the default, no server): the catalog is `<dir>/catalog.sqlite` in WAL mode (a
  reader's open transaction then never blocks a writer) and the data lives in `<dir>/data/`.
- Many machines: the catalog is a PostgreSQL database (`postgres:<libpq conninfo>` or a
  `postgresql://` URL) and `data_path` a directory (or object store) every machine reaches.

Writers take turns through one lock per warehouse: an exclusive `flock` on `<dir>/write.lock`, or a
PostgreSQL advisory lock held for the transaction. DuckLake has no primary keys, so idempotent
upserts are "insert what is not there yet"; that is only exact when no other writer commits in
between, which the lock guarantees (measured: without it, two writers inserting the same id over a
PostgreSQL catalog both commit). Readers never take the lock. What the lock covers is kept small
(`LakeStore.write_new`: a writer that would wait looks keys up before taking it). docs/WAREHOUSE.md says more.

Each process opens one in-memory DuckDB per lake it uses, with the lake ATTACHed as `arenaforge`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import sqlite3
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import duckdb

from arenaforge.schemas.errors import WarehouseError
from arenaforge.warehouse.extensions import database, extension_path, quiet
from arenaforge.warehouse.rows import KeyedRows
from arenaforge.warehouse.writer_lock import WriterLock, writer_lock

# Rows per insert that DuckLake keeps inside the catalog instead of writing a Parquet file: DuckLake's
# default. 0 and 1,000 measured no faster on the pipeline's write pattern; `db compact` flushes them.
INLINE_ROWS = 10
_T = TypeVar("_T")
KEEP_IDLE = 2  # lakes a process keeps open while no Warehouse object uses them
# A SQLite catalog connection that finds the catalog busy fails at once (META_BUSY_TIMEOUT 0) and
# `_retry_busy` tries again in milliseconds. The sqlite_scanner's SQLite has no usleep, so its own
# busy handler sleeps whole seconds: each DuckLake transaction opens a catalog connection, and one
# opened while another process's connection was closing (SQLite holds its PENDING lock for a moment
# then) slept 1 s (strace). Those 1 s sleeps were the reads' p99, and the writers' lock waits' p99
# when the lock holder slept.
BUSY_TIMEOUT_MS = 0
_BUSY_RETRIES = [0]  # times this process found the catalog busy and tried again (`busy_retries`)


@dataclass(frozen=True)
class LakeLocation:
    """Where a lake lives: its catalog (SQLite file or PostgreSQL) and its data directory."""

    catalog: str  # "sqlite" | "postgres"
    target: str  # SQLite file path, or a libpq conninfo / postgresql:// URL
    data_path: str  # absolute, ends with "/"
    directory: Path | None = None  # the embedded layout's directory

    @classmethod
    def parse(cls, location: str, data_path: str | None = None) -> "LakeLocation":
        if is_postgres(location):
            target = location.split(":", 1)[1] if location.startswith("postgres:") else location
            if not data_path:
                raise WarehouseError("a PostgreSQL catalog needs warehouse.data_path (a directory every writer reaches)")
            return cls("postgres", target, _dir(data_path))
        directory = Path(location).expanduser().resolve()
        data = _dir(data_path) if data_path else str(directory / "data") + "/"
        return cls("sqlite", str(directory / "catalog.sqlite"), data, directory)

    @property
    def key(self) -> str:
        return f"{self.catalog}:{self.target}|{self.data_path}"

    @property
    def extensions(self) -> list[str]:
        return ["ducklake", "sqlite_scanner" if self.catalog == "sqlite" else "postgres_scanner"]

    def attach_sql(self, alias: str, read_only: bool = False) -> str:
        options = [f"DATA_PATH '{_q(self.data_path)}'", "OVERRIDE_DATA_PATH true",
                   f"DATA_INLINING_ROW_LIMIT {INLINE_ROWS}"]
        if read_only:  # a person's CLI session keeps SQLite's own (slow but patient) busy wait
            options = [o for o in options if not o.startswith("DATA_INLINING")] + ["READ_ONLY"]
        elif self.catalog == "sqlite":
            options.append(f"META_BUSY_TIMEOUT {BUSY_TIMEOUT_MS}")
        return f"ATTACH 'ducklake:{self.catalog}:{_q(self.target)}' AS {alias} ({', '.join(options)})"

    def cli_sql(self, alias: str = "arenaforge") -> str:
        """What a DuckDB CLI runs first to browse this lake read-only."""
        loads = " ".join(f"LOAD '{_q(extension_path(n))}';" for n in self.extensions)
        return f"{loads} {self.attach_sql(alias, read_only=True)}; USE {alias};"


def is_postgres(location: str) -> bool:
    return location.startswith(("postgres:", "postgresql://", "postgres://"))


def _dir(path: str) -> str:
    if "://" in path:  # object stores keep their URL
        return path.rstrip("/") + "/"
    return str(Path(path).expanduser().resolve()) + "/"


def _q(text: str) -> str:
    return text.replace("'", "''")


# --------------------------------------------------------------------------- one DuckDB per lake
ALIAS = "arenaforge"  # the lake's catalog name, in this process as in `arenaforge db cli`


class _Engine:
    """A lake's own DuckDB in this process. Not one DuckDB for every lake: each transaction there
    reads the snapshot of every attached lake (measured: a count(*) 21 ms with one attached, 97 ms with
    six; a stopped PostgreSQL catalog then broke queries to every other warehouse)."""

    def __init__(self, location: LakeLocation, writer_lock: WriterLock, timeout_s: float) -> None:
        self.db = database([extension_path(n) for n in location.extensions])
        if location.directory is not None:
            _prepare_directory(location)
        self.timeout_s = timeout_s
        with writer_lock.hold(timeout_s):  # the first ATTACH creates the catalog: one process at a time
            if location.directory is not None:
                _use_wal(location)
            try:
                _retry_busy(lambda: self.db.execute(location.attach_sql(ALIAS)), timeout_s)
            except duckdb.Error as err:
                self.db.close()
                raise WarehouseError(f"cannot open warehouse {location.target}: {str(err).splitlines()[0]}") from None
        # USE reads the catalog: busy while another process writes it
        _retry_busy(lambda: self.db.execute(f"USE {ALIAS}"), timeout_s)
        self.users = 0

    def cursor(self, begin: bool = False) -> duckdb.DuckDBPyConnection:
        """A new connection with the lake as its default database (a cursor starts in the in-memory
        one, not the parent's). With `begin`, inside BEGIN: the USE then reads the lake in the
        transaction's own snapshot, not in a DuckLake transaction of its own (~1/8 of a small write's CPU).
        That USE opens the transaction's one catalog connection, so a busy catalog is retried here."""
        def open_cursor() -> duckdb.DuckDBPyConnection:
            con = quiet(self.db.cursor())
            try:
                if begin:
                    con.execute("BEGIN TRANSACTION")
                con.execute(f"USE {ALIAS}")
            except BaseException:
                con.close()
                raise
            return con

        return _retry_busy(open_cursor, self.timeout_s)


def busy_retries() -> int:
    """How often this process found a SQLite catalog busy and tried again."""
    return _BUSY_RETRIES[0]


def _retry_busy(attempt: Callable[[], _T], timeout_s: float) -> _T:
    """`attempt()`, again after 1, 2, 4 ... 50 ms while the SQLite catalog is busy, up to `timeout_s`.
    Only for what is safe to run again: a transaction's start, or a whole idempotent step."""
    deadline = time.monotonic() + timeout_s
    delay = 0.001
    while True:
        try:
            return attempt()
        except duckdb.Error as err:
            if "database is locked" not in str(err) or time.monotonic() > deadline:
                raise
        _BUSY_RETRIES[0] += 1
        time.sleep(delay)
        delay = min(2 * delay, 0.05)


_ENGINES: dict[tuple[int, str], _Engine] = {}  # (pid, location key): DuckDB instances do not survive fork
_ENGINES_LOCK = threading.Lock()


def _acquire(location: LakeLocation, writer_lock: WriterLock, timeout_s: float) -> _Engine:
    key = (os.getpid(), location.key)
    with _ENGINES_LOCK:
        eng = _ENGINES.get(key)
        if eng is None:
            eng = _ENGINES[key] = _Engine(location, writer_lock, timeout_s)
        eng.users += 1
        return eng


def _release(pid: int, location: LakeLocation) -> None:
    """One user fewer. Unused lakes stay open (a flow makes a Warehouse per task, and the first query
    after an ATTACH reads the catalog, ~0.1 s) until more than KEEP_IDLE are unused; the longest
    unused closes."""
    if os.getpid() != pid:
        return
    with _ENGINES_LOCK:
        key = (pid, location.key)
        eng = _ENGINES.get(key)
        if eng is None:
            return
        eng.users -= 1
        if eng.users == 0:
            _ENGINES[key] = _ENGINES.pop(key)  # most recently released last
        idle = [k for k, e in _ENGINES.items() if e.users == 0 and k[0] == pid]
        for k in idle[: max(0, len(idle) - KEEP_IDLE)]:
            with contextlib.suppress(duckdb.Error):
                _ENGINES.pop(k).db.close()


def _prepare_directory(location: LakeLocation) -> None:
    directory = location.directory
    assert directory is not None
    if not directory.parent.exists():
        raise WarehouseError(f"warehouse directory {directory.parent} does not exist")
    if directory.exists() and not directory.is_dir():
        raise WarehouseError(f"{directory} is a file, not a warehouse directory")
    directory.mkdir(exist_ok=True)


def _use_wal(location: LakeLocation) -> None:
    """Under the writer lock: two processes opening a new lake at once both switched the journal mode,
    and one failed "database is locked" at once (measured; SQLite does not wait on that switch).
    """
    # WAL: a reader's open transaction no longer blocks writers (in the default rollback-journal
    # mode a DuckDB CLI session holding a transaction makes every commit fail "database is locked").
    con = sqlite3.connect(location.target)
    try:
        if con.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            con.execute("PRAGMA journal_mode=WAL").fetchall()
    finally:
        con.close()


# --------------------------------------------------------------------------- attachment handle
class Attachment:
    """One user's hold on this process's DuckDB for a lake, released when it is garbage-collected."""

    def __init__(self, location: LakeLocation, timeout_s: float) -> None:
        self.location = location
        self.lock = writer_lock(location)
        self.alias = ALIAS
        self._engine = _acquire(location, self.lock, timeout_s)
        weakref.finalize(self, _release, os.getpid(), location)

    @contextlib.contextmanager
    def cursor(self, begin: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
        con = self._engine.cursor(begin)
        try:
            yield con
        finally:
            con.close()


def _cutoff(older_than_hours: float) -> str:
    """The time before which snapshots and unreferenced files go: the last second before the UTC
    day `older_than_hours` ago. Whole days because DuckLake 1.5.5 on a SQLite catalog compares
    these times as text ("2026-11-23 17:59" < "2026-11-23T16:59"): a cutoff inside a day takes every
    snapshot of that day, including ones an open reader still uses (measured). "23:59:59" of the
    day before sorts after every time of that day and before every later day, as text or as time."""
    moment = datetime.now(UTC) - timedelta(hours=older_than_hours)
    day = moment.replace(hour=0, minute=0, second=0, microsecond=0)
    return (day - timedelta(seconds=1)).strftime("%Y-%m-%d %H:%M:%S+00")


# --------------------------------------------------------------------------- the store
def _snapshot(con: duckdb.DuckDBPyConnection, alias: str) -> int:
    """The snapshot this connection's transaction reads."""
    return int(con.execute(f"SELECT id FROM {alias}.current_snapshot()").fetchone()[0])


def _match(key: Sequence[str]) -> str:
    return " AND ".join(f"t.{k} = b.{k}" for k in key)


# A commit made by `write_new` says so in its snapshot's commit message; its extra info is
# {table: [digest of each inserted key]}: 64-bit digests (a false match, which would skip a new row,
# is a 1 in 2^64 chance per key pair) keep the catalog's text about 20 bytes per row.
_KEYS_MESSAGE = "write_new: inserted keys"


def _key_tuples(batch: KeyedRows) -> list[tuple[Any, ...]]:
    names = [name for name, _ in batch.columns]
    positions = [names.index(k) for k in batch.key]
    return [tuple(row[i] for i in positions) for row in batch.rows]


def _listable(batch: KeyedRows) -> bool:
    """Keys whose text is what the database compares (VARCHAR), so digests of it match exactly."""
    kinds = dict(batch.columns)
    return all(kinds[k].upper() == "VARCHAR" for k in batch.key) and all(
        isinstance(v, str) for key in _key_tuples(batch) for v in key)


def _digest(key: tuple[Any, ...]) -> str:
    return hashlib.blake2b("\x1f".join(key).encode(), digest_size=8).hexdigest()


def _listed_since(con: duckdb.DuckDBPyConnection, alias: str, seen: int, now: int) -> dict[str, set[str]] | None:
    """Digests of the keys each table got in snapshots (seen, now], or None when a commit there did not list them."""
    rows = con.execute(f"SELECT commit_message, commit_extra_info FROM __ducklake_metadata_{alias}.ducklake_snapshot_changes "
                       "WHERE snapshot_id > ? AND snapshot_id <= ?", [seen, now]).fetchall()
    if len(rows) != now - seen:
        return None
    listed: dict[str, set[str]] = {}
    for message, extra in rows:
        if message != _KEYS_MESSAGE or not extra:
            return None
        for table, digests in json.loads(extra).items():
            listed.setdefault(table, set()).update(digests)
    return listed


def _present(con: duckdb.DuckDBPyConnection, batch: KeyedRows, source: str) -> set[tuple[Any, ...]]:
    """Keys of `batch` that `source` (a table, or a table function over its changes) holds."""
    keys = ", ".join(f"t.{k}" for k in batch.key)
    rows = con.execute(f"SELECT DISTINCT {keys} FROM {source} t SEMI JOIN {batch.keys_select()} b ON {_match(batch.key)}",
                       batch.keys_params()).fetchall()
    return {tuple(row) for row in rows}


_MIGRATED: set[str] = set()
_KEYS: dict[str, dict[str, list[str]]] = {}
_HELD = threading.local()  # the warehouses whose writers' lock this thread holds
_MIGRATE_LOCK = threading.Lock()


class LakeStore:
    """A DuckLake warehouse: connections, the writers' lock, migrations, keyed inserts, compaction."""

    layout = "ducklake"

    def __init__(self, location: LakeLocation, lock_timeout_s: float, migrations) -> None:
        self.where = location
        self.location = location.target if location.directory is None else str(location.directory)
        self.path = location.directory if location.directory is not None else location.target
        self.key = location.key
        self.lock_timeout_s = lock_timeout_s
        self.migrations = migrations
        self._attachment: Attachment | None = None
        self._attach_lock = threading.Lock()

    def _attached(self) -> Attachment:
        if self._attachment is None:
            with self._attach_lock:
                if self._attachment is None:
                    self._attachment = Attachment(self.where, self.lock_timeout_s)
        return self._attachment

    @property
    def keys(self) -> dict[str, list[str]]:
        self._ensure_migrated()
        return _KEYS[self.where.key]

    @contextlib.contextmanager
    def connect(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A cursor inside one transaction: its reads share one snapshot, read once (each statement on
        its own was a DuckLake transaction, and so was the cursor's USE)."""
        self._ensure_migrated()
        with self._attached().cursor(begin=True) as con, self._committed(con):
            yield con

    @contextlib.contextmanager
    def transaction(self, held: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
        """BEGIN ... COMMIT while holding the writers' lock (taken before BEGIN, so the transaction's
        snapshot already holds every other writer's rows). `held`: the caller holds it already."""
        self._ensure_migrated()
        att = self._attached()
        keys = _HELD.__dict__.setdefault("keys", set())
        if self.key in keys:  # else it would wait for the lock this very thread holds
            raise WarehouseError("a write transaction is already open in this thread; write inside it")
        keys.add(self.key)
        try:
            lock = contextlib.nullcontext() if held else att.lock.hold(self.lock_timeout_s)
            with lock, att.cursor(begin=True) as con, self._committed(con):
                yield con
        finally:
            keys.discard(self.key)

    @contextlib.contextmanager
    def _committed(self, con: duckdb.DuckDBPyConnection) -> Iterator[None]:
        """COMMIT the open transaction of `con` when the block ends; ROLLBACK if it raises."""
        try:
            yield
        except BaseException:
            with contextlib.suppress(duckdb.Error):
                con.execute("ROLLBACK")
            raise
        try:
            con.execute("COMMIT")
        except duckdb.Error as err:
            raise WarehouseError(f"commit to {self.location} failed: {str(err).splitlines()[0]}") from None

    def _ensure_migrated(self) -> None:
        key = self.where.key
        if key in _MIGRATED:
            return
        with _MIGRATE_LOCK:
            if key not in _MIGRATED:
                self.migrate()
                _MIGRATED.add(key)

    def migrate(self) -> list[str]:
        from arenaforge.warehouse.lake_schema import apply_to_lake

        att = self._attached()

        def apply() -> tuple[list[str], dict[str, list[str]]]:  # one transaction: safe to run again
            with att.cursor() as con:
                return apply_to_lake(con, self.migrations)

        with att.lock.hold(self.lock_timeout_s):
            applied, keys = _retry_busy(apply, self.lock_timeout_s)
        _KEYS[self.where.key] = keys
        return applied

    def insert_new(self, con: duckdb.DuckDBPyConnection, table: str, names: str, select: str, params: list[Any],
                   key: Sequence[str], replace: bool = False) -> int:
        """Insert the rows of `select` whose key is not stored yet (or overwrite them with `replace`); new rows.

        Exact only inside `transaction()`: the writers' lock keeps other writers out until COMMIT.
        """
        match = _match(key)
        replaced = 0
        if replace:
            replaced = con.execute(f"DELETE FROM {table} t WHERE EXISTS (SELECT 1 FROM {select} b WHERE {match})",
                                   params).fetchone()[0]
            inserted = con.execute(f"INSERT INTO {table} ({names}) SELECT {names} FROM {select} b", params).fetchone()[0]
            return int(inserted) - int(replaced)
        inserted = con.execute(f"INSERT INTO {table} ({names}) SELECT {names} FROM {select} b "
                               f"WHERE NOT EXISTS (SELECT 1 FROM {table} t WHERE {match})", params).fetchone()[0]
        return int(inserted)

    def write_new(self, batches: Sequence[KeyedRows]) -> list[int]:
        """Insert every batch's rows whose key is not stored yet, in one commit; rows new per batch.

        When the writers' lock is free it is taken at once and the keys already stored are looked up
        inside the transaction. When another writer holds it, this writer does the expensive part
        while it would otherwise wait: in a read snapshot S of its own it drops the keys already
        stored (the scan of whole tables). Then, under the lock, the transaction starts at the newest
        snapshot L (every writer commits under the lock), so only rows other writers committed in
        (S, L] can still collide. Each such commit lists digests of the keys it inserted in its
        snapshot's commit info (`_KEYS_MESSAGE`), read from the catalog in one query; a commit in
        (S, L] without that list (compaction, `db query`, a replacing upsert) makes the INSERT check
        `ducklake_table_insertions` over (S, L] instead, which reads the files those snapshots added.
        """
        self._ensure_migrated()
        att = self._attached()
        alias = att.alias
        new = [0] * len(batches)
        todo = [(i, b) for i, b in enumerate(batches) if b.rows]
        if not todo:
            return new
        with att.lock.try_hold() as free:
            seen = -1
            if not free:
                def unstored() -> tuple[int, list[tuple[int, KeyedRows]]]:
                    with att.cursor(begin=True) as con:  # a read transaction: no lock, no snapshot written
                        at = _snapshot(con, alias)
                        rest = [(i, b.without(_present(con, b, b.table))) for i, b in todo]
                        con.execute("ROLLBACK")
                    return at, rest

                seen, todo = _retry_busy(unstored, self.lock_timeout_s)
                todo = [(i, b) for i, b in todo if b.rows]
                if not todo:
                    return new

            # A catalog found busy mid-transaction (a statement's own SQLite read, e.g. of the commit info) fails
            # at once (META_BUSY_TIMEOUT 0): the transaction rolls back and a fresh one runs the whole insert again,
            # which is safe because it inserts only keys still missing.
            def insert() -> list[int]:
                with self.transaction(held=free) as con:
                    return self._insert_new_since(con, alias, seen, todo, list(new))

            return _retry_busy(insert, self.lock_timeout_s)

    def _insert_new_since(self, con: duckdb.DuckDBPyConnection, alias: str, seen: int,
                          todo: list[tuple[int, KeyedRows]], new: list[int]) -> list[int]:
        """Under the lock: insert `todo`'s rows not stored yet, knowing none was at snapshot `seen`
        (-1: nothing known, look every key up now)."""
        now = _snapshot(con, alias)
        if seen < 0:
            todo = [(i, b.without(_present(con, b, b.table))) for i, b in todo]
            seen = now
        listed = _listed_since(con, alias, seen, now) if now > seen else {}
        inserted: dict[str, list[str]] | None = {}
        for i, b in todo:
            sql = f"INSERT INTO {b.table} ({b.names}) SELECT {b.names} FROM {b.select()} b"
            if listed is not None:
                b = b.without({k for k in _key_tuples(b) if _digest(k) in listed.get(b.table, ())})
            elif now > seen:
                since = f"ducklake_table_insertions('{alias}', 'main', '{b.table}', {seen + 1}, {now})"
                sql += f" WHERE NOT EXISTS (SELECT 1 FROM {since} t WHERE {_match(b.key)})"
            if not b.rows:
                continue
            new[i] = int(con.execute(sql, b.params()).fetchone()[0])
            if inserted is not None and _listable(b) and new[i] == len(b.rows):
                inserted.setdefault(b.table, []).extend(_digest(k) for k in _key_tuples(b))
            else:
                inserted = None  # some rows skipped in SQL, or keys not text: list nothing
        if inserted:
            con.execute(f"CALL {alias}.set_commit_message('arenaforge', '{_KEYS_MESSAGE}', extra_info => ?)",
                        [json.dumps(inserted, separators=(",", ":"))])
        return new

    def relations(self, con: duckdb.DuckDBPyConnection) -> list[tuple[str, str]]:
        """(name, 'table' | 'view') in schema main, from the catalog's own tables (DuckLake spec): the
        information_schema lists every attached database and took 150 ms to 2 s here."""
        meta = f"__ducklake_metadata_{self._attached().alias}"
        rows = con.execute(
            f"SELECT name, kind FROM (SELECT table_name AS name, 'table' AS kind, schema_id FROM {meta}.ducklake_table "
            f"WHERE end_snapshot IS NULL UNION ALL SELECT view_name, 'view', schema_id FROM {meta}.ducklake_view "
            f"WHERE end_snapshot IS NULL) JOIN {meta}.ducklake_schema s USING (schema_id) "
            "WHERE s.schema_name = 'main' AND s.end_snapshot IS NULL ORDER BY kind, name").fetchall()
        return [(n, k) for n, k in rows]

    def compact(self, older_than_hours: float = 24.0) -> dict[str, Any]:
        """Flush rows inlined in the catalog to Parquet and merge small files (one table at a time
        under the writers' lock, so writers wait for one table's merge, not the whole run), then
        expire snapshots and delete unreferenced files from before the cutoff (see `_cutoff`)."""
        before = self.storage()
        att = self._attached()
        alias = att.alias
        with att.cursor(begin=True) as con:
            tables = [name for name, kind in self.relations(con) if kind == "table"]

        def calls(*sql: str) -> None:  # each CALL its own transaction, each one safe to run again
            with att.cursor() as con:
                for statement in sql:
                    con.execute(statement)

        for table in tables:
            with att.lock.hold(self.lock_timeout_s):
                _retry_busy(lambda t=table: calls(f"CALL ducklake_flush_inlined_data('{alias}', table_name => '{t}')",
                                                  f"CALL ducklake_merge_adjacent_files('{alias}', '{t}')"),
                            self.lock_timeout_s)
        cutoff = _cutoff(older_than_hours)
        with att.lock.hold(self.lock_timeout_s):
            _retry_busy(lambda: calls(*(f"CALL {call}('{alias}', older_than => TIMESTAMPTZ '{cutoff}')" for call in (
                "ducklake_expire_snapshots", "ducklake_cleanup_old_files", "ducklake_delete_orphaned_files"))),
                self.lock_timeout_s)
        return {"layout": self.layout, "cutoff": cutoff, "before": before, "after": self.storage()}

    def storage(self) -> dict[str, int]:
        """Live data files, rows still inlined in the catalog, snapshots kept."""
        att = self._attached()
        meta = f"__ducklake_metadata_{att.alias}"

        def read() -> dict[str, int]:  # read-only: safe to run again when the catalog was busy
            with att.cursor(begin=True) as con:  # one read transaction: one snapshot, one catalog connection
                files = con.execute(f"SELECT count(*), coalesce(sum(file_size_bytes), 0) FROM {meta}.ducklake_data_file "
                                    "WHERE end_snapshot IS NULL").fetchone()
                snapshots = con.execute(f"SELECT count(*) FROM {meta}.ducklake_snapshot").fetchone()[0]
                inlined = 0
                for (name,) in con.execute(f"SELECT table_name FROM {meta}.ducklake_inlined_data_tables").fetchall():
                    inlined += con.execute(f"SELECT count(*) FROM {meta}.{name} WHERE end_snapshot IS NULL").fetchone()[0]
            return {"data_files": int(files[0]), "data_bytes": int(files[1]), "inlined_rows": int(inlined),
                    "snapshots": int(snapshots)}

        return _retry_busy(read, self.lock_timeout_s)

    def cli_args(self) -> list[str]:
        return ["-cmd", self.where.cli_sql()]

    def close(self) -> None:
        self._attachment = None
