"""The writers' lock of a lake: writers of one warehouse take turns, readers never take it.

- SQLite catalog (one machine): an exclusive `flock` on `<dir>/write.lock`.
- PostgreSQL catalog (many machines): a transaction-scoped advisory lock.
Both are released by the system when their holder dies (the SIGKILL crash-resume test).
"""

from __future__ import annotations

import collections
import contextlib
import fcntl
import hashlib
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import duckdb

from arenaforge.schemas.errors import WarehouseError
from arenaforge.warehouse.extensions import database, extension_path, quiet

if TYPE_CHECKING:
    from arenaforge.warehouse.lake import LakeLocation

_WAITS: collections.deque[float] = collections.deque(maxlen=100_000)  # each hold's wait in this process, seconds
_PG_LOCK_KEY = 0x4172656E61  # "Arena": the advisory-lock key every writer of a PostgreSQL catalog uses


def lock_waits() -> list[float]:
    """Seconds each take of a writers' lock in this process waited for it (the newest 100,000)."""
    return list(_WAITS)


class WriterLock:
    """Writers of one warehouse take turns; `hold` waits up to a deadline."""

    def hold(self, timeout_s: float) -> contextlib.AbstractContextManager[None]:
        raise NotImplementedError

    def try_hold(self) -> contextlib.AbstractContextManager[bool]:
        """Hold the lock if no one else does (True), else hold nothing (False); never waits."""
        raise NotImplementedError


class FileWriterLock(WriterLock):
    """An exclusive flock on `<dir>/write.lock`: released by the kernel when its holder dies."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @contextlib.contextmanager
    def hold(self, timeout_s: float) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        start = time.monotonic()
        if not _try_flock(fd):
            _flock_in_turn(fd, timeout_s, self.path.parent)  # on timeout the descriptor is its waiter's to close
        _WAITS.append(time.monotonic() - start)
        try:
            yield
        finally:
            os.close(fd)  # closing the descriptor drops the lock

    @contextlib.contextmanager
    def try_hold(self) -> Iterator[bool]:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            got = _try_flock(fd)
            if got:
                _WAITS.append(0.0)
            yield got
        finally:
            os.close(fd)


def _flock_in_turn(fd: int, timeout_s: float, what: object) -> None:
    """Wait for the lock in the kernel, which wakes a waiter as the holder lets go. Polling with
    sleeps lost nearly every race to the writer that had just released and asked again (measured:
    with 4 writers, upserts waited p99 5.9 s). The blocking call cannot be interrupted, so it runs
    in a thread; a caller that gives up leaves the descriptor to that thread, which closes it (and
    so drops the lock) as soon as it is granted."""
    granted = threading.Event()
    guard = threading.Lock()
    abandoned = False

    def wait() -> None:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with guard:
            if abandoned:
                os.close(fd)
            else:
                granted.set()

    threading.Thread(target=wait, name="warehouse-writer-lock", daemon=True).start()
    if granted.wait(timeout_s):
        return
    with guard:
        if granted.is_set():
            return
        abandoned = True
    raise WarehouseError(f"warehouse {what} stayed locked by another writer for {timeout_s:.0f}s")


def _try_flock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False


class AdvisoryWriterLock(WriterLock):
    """A PostgreSQL transaction-scoped advisory lock: spans machines, dropped if its holder dies."""

    def __init__(self, location: LakeLocation) -> None:
        self.location = location

    @contextlib.contextmanager
    def hold(self, timeout_s: float) -> Iterator[None]:
        alias = "lock_" + hashlib.sha1(self.location.target.encode()).hexdigest()[:12]
        con = quiet(_lock_engine(self.location.target, alias).cursor())  # its own PostgreSQL session for this transaction
        try:
            con.execute("BEGIN TRANSACTION")
            # Wait in PostgreSQL's own queue (first come, first served) up to the deadline; polling
            # with sleeps lost nearly every race to the writer that had just released and asked again.
            ms = max(1, round(timeout_s * 1000))
            in_pg = f"SELECT * FROM postgres_query('{alias}', '{{}}')"
            con.execute(in_pg.format(f"SELECT set_config(''lock_timeout'', ''{ms}'', true)")).fetchall()
            start = time.monotonic()
            try:
                con.execute(in_pg.format(f"SELECT pg_advisory_xact_lock({_PG_LOCK_KEY}) IS NULL")).fetchall()
            except duckdb.Error as err:
                if "lock timeout" not in str(err):
                    raise
                raise WarehouseError(f"warehouse {self.location.data_path} stayed locked by another writer "
                                     f"for {timeout_s:.0f}s") from None
            _WAITS.append(time.monotonic() - start)
            yield
        finally:
            with contextlib.suppress(duckdb.Error):
                con.execute("ROLLBACK")  # ends the session's transaction: the lock goes with it
            con.close()

    @contextlib.contextmanager
    def try_hold(self) -> Iterator[bool]:
        alias = "lock_" + hashlib.sha1(self.location.target.encode()).hexdigest()[:12]
        con = quiet(_lock_engine(self.location.target, alias).cursor())
        try:
            con.execute("BEGIN TRANSACTION")
            got = con.execute(f"SELECT * FROM postgres_query('{alias}', "
                              f"'SELECT pg_try_advisory_xact_lock({_PG_LOCK_KEY})')").fetchone()[0]
            if got:
                _WAITS.append(0.0)
            yield bool(got)
        finally:
            with contextlib.suppress(duckdb.Error):
                con.execute("ROLLBACK")
            con.close()


_LOCK_ENGINES: dict[tuple[int, str], duckdb.DuckDBPyConnection] = {}
_LOCK_ENGINES_LOCK = threading.Lock()


def _lock_engine(target: str, alias: str) -> duckdb.DuckDBPyConnection:
    """A DuckDB of its own holding the PostgreSQL connections the advisory locks go through (beside
    the lake's, every catalog listing there would reach into PostgreSQL's tables too)."""
    with _LOCK_ENGINES_LOCK:
        key = (os.getpid(), target)
        if key not in _LOCK_ENGINES:
            db = database([extension_path("postgres_scanner")])
            try:
                quoted = target.replace("'", "''")
                db.execute(f"ATTACH '{quoted}' AS {alias} (TYPE postgres)")
            except duckdb.Error as err:
                raise WarehouseError(f"cannot reach the PostgreSQL catalog: {str(err).splitlines()[0]}") from None
            _LOCK_ENGINES[key] = db
        return _LOCK_ENGINES[key]


def writer_lock(location: LakeLocation) -> WriterLock:
    if location.directory is not None:
        return FileWriterLock(location.directory / "write.lock")
    return AdvisoryWriterLock(location)
