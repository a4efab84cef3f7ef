"""Group-commit writing of high-rate raw rows (model-response cache, per-call usage).

Callers `add()` rows from any thread or coroutine to a `BufferedTableWriter`. Every writer of one
warehouse in a process shares one committer thread, which writes whatever has queued, for every
table, in ONE transaction every `interval_s` (or as soon as `max_batch` rows wait for a table);
and `Warehouse.upsert` takes the queued rows along in its own transaction, so a process that is
writing records anyway adds no commit of its own for them. `flush()` blocks until everything added
so far is durable; a crash loses at most the last interval's rows.

Why: a DuckLake commit costs ~30-100 ms and every writer of the warehouse takes turns through one
lock. Committing each table every 0.2 s (as before DuckLake) spent up to 40% of that lock per table
per process on a trickle of rows; rows lost to a crash are cache entries and usage rows, which a
resumed run asks for again.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Any

from arenaforge.warehouse.db import Warehouse
from arenaforge.warehouse.rows import KeyedRows

_COMMITTERS: dict[tuple[int, str], "_Committer"] = {}
_COMMITTERS_LOCK = threading.Lock()
Taken = dict[str, list[tuple[Any, ...]]]


class _Committer:
    """The buffered rows of one warehouse in this process, and the thread that commits them."""

    def __init__(self, wh: Warehouse, interval_s: float, max_batch: int) -> None:
        self.wh = wh
        self.interval_s = interval_s
        self.max_batch = max_batch
        self.columns: dict[str, list[tuple[str, str]]] = {}
        self.pending: Taken = {}
        self.added: dict[str, int] = {}
        self.written: dict[str, int] = {}
        self.users = 0
        self.error: BaseException | None = None
        self.cond = threading.Condition()
        self.thread = threading.Thread(target=self._run, name="warehouse-group-commit", daemon=True)

    # -- called by writers
    def add(self, table: str, row: tuple[Any, ...]) -> None:
        with self.cond:
            if self.error is not None:
                raise self.error
            self.pending.setdefault(table, []).append(row)
            self.added[table] = self.added.get(table, 0) + 1
            if len(self.pending[table]) >= self.max_batch:
                self.cond.notify_all()

    def flush(self, table: str) -> None:
        with self.cond:
            target = self.added.get(table, 0)
            self.cond.notify_all()
            while self.written.get(table, 0) < target and self.error is None:
                self.cond.wait(timeout=1.0)
            if self.error is not None:
                raise self.error

    # -- the write itself (the committer's thread, or an upsert taking the rows along)
    def take(self) -> Taken:
        with self.cond:
            taken = {t: rows for t, rows in self.pending.items() if rows}
            self.pending = {}
            return taken

    def batches(self, taken: Taken) -> list[KeyedRows]:
        return [KeyedRows.first_per_key(table, self.columns[table], rows, self.wh.key_of(table))
                for table, rows in taken.items()]

    def done(self, taken: Taken) -> None:
        with self.cond:
            for table, rows in taken.items():
                self.written[table] = self.written.get(table, 0) + len(rows)
            self.cond.notify_all()

    def give_back(self, taken: Taken) -> None:
        with self.cond:
            for table, rows in taken.items():
                self.pending[table] = rows + self.pending.get(table, [])

    def _run(self) -> None:
        while True:
            with self.cond:
                if not any(self.pending.values()) and self.users > 0:
                    self.cond.wait(timeout=self.interval_s)
                if not any(self.pending.values()):
                    if self.users == 0:
                        return
                    continue
            taken = self.take()
            try:
                self.wh.store.write_new(self.batches(taken))
            except BaseException as err:  # surfaced to the next add/flush caller
                with self.cond:
                    self.error = err
                    self.cond.notify_all()
                return
            self.done(taken)


def riding_rows(wh: Warehouse) -> _Committer | None:
    """The committer whose queued rows an upsert to `wh` in this process may take along."""
    return _COMMITTERS.get((os.getpid(), wh.key))


class BufferedTableWriter:
    """Queue rows for one table; they are committed in groups (see the module docstring)."""

    def __init__(self, wh: Warehouse, table: str, columns: Sequence[tuple[str, str]], interval_s: float = 1.0,
                 max_batch: int = 512) -> None:
        self.table = table
        self.columns = [name for name, _ in columns]
        wh.key_of(table)  # fail now, not in the committer thread, if the table declares no key
        with _COMMITTERS_LOCK:
            key = (os.getpid(), wh.key)
            committer = _COMMITTERS.get(key)
            if committer is None or committer.error is not None:
                committer = _COMMITTERS[key] = _Committer(wh, interval_s, max_batch)
            with committer.cond:
                committer.users += 1
                committer.columns[table] = list(columns)
                committer.interval_s = min(committer.interval_s, interval_s)
            if not committer.thread.is_alive():
                committer.thread.start()  # once it has a user: with none it would exit at once
        self._committer = committer
        self._closed = False

    def add(self, row: dict[str, Any]) -> None:
        self._committer.add(self.table, tuple(row.get(c) for c in self.columns))

    def flush(self) -> None:
        self._committer.flush(self.table)

    def close(self) -> None:
        if self._closed:
            return
        self.flush()
        self._closed = True
        with _COMMITTERS_LOCK, self._committer.cond:
            self._committer.users -= 1
            if self._committer.users == 0:
                _COMMITTERS.pop((os.getpid(), self._committer.wh.key), None)
                self._committer.cond.notify_all()
