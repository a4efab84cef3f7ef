"""Group-commit writer for high-rate raw rows (model-response cache, per-call usage).

Callers `add()` rows from any thread or coroutine; a background thread writes whatever has
queued in one transaction every `interval_s` (or when `max_batch` rows wait). `flush()` blocks
until everything added so far is durable; a crash loses at most the last interval's rows.

Why 1 s: a DuckLake commit costs ~30-80 ms and every writer of the warehouse takes turns through
one lock, so a 0.2 s interval spent up to 40% of that lock per table per process on a trickle of
rows. Rows lost to a crash are only cache entries and usage rows, asked again on resume.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from arenaforge.warehouse.db import Warehouse


class BufferedTableWriter:
    def __init__(
        self,
        wh: Warehouse,
        table: str,
        columns: Sequence[tuple[str, str]],
        interval_s: float = 1.0,
        max_batch: int = 512,
    ) -> None:
        self.wh = wh
        self.table = table
        self.typed = list(columns)  # (name, DuckDB type)
        self.columns = [name for name, _ in columns]
        self.interval_s = interval_s
        self.max_batch = max_batch
        self._pending: list[tuple[Any, ...]] = []
        self._cond = threading.Condition()
        self._written = 0  # rows handed to the database so far (by add order)
        self._added = 0
        self._closed = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"writer-{table}", daemon=True)
        self._thread.start()

    def add(self, row: dict[str, Any]) -> None:
        with self._cond:
            if self._error is not None:
                raise self._error
            self._pending.append(tuple(row.get(c) for c in self.columns))
            self._added += 1
            if len(self._pending) >= self.max_batch:
                self._cond.notify_all()

    def flush(self) -> None:
        with self._cond:
            target = self._added
            self._cond.notify_all()
            while self._written < target and self._error is None:
                self._cond.wait(timeout=1.0)
            if self._error is not None:
                raise self._error

    def close(self) -> None:
        self.flush()
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        self._thread.join(timeout=30)

    def _run(self) -> None:
        while True:
            with self._cond:
                if not self._pending and not self._closed:
                    self._cond.wait(timeout=self.interval_s)
                if not self._pending:
                    if self._closed:
                        return
                    continue
                batch, self._pending = self._pending, []
            try:
                self._write(batch)
            except BaseException as err:  # surfaced to the next add/flush caller
                with self._cond:
                    self._error = err
                    self._cond.notify_all()
                return
            with self._cond:
                self._written += len(batch)
                self._cond.notify_all()

    def _write(self, batch: list[tuple[Any, ...]]) -> None:
        self.wh.insert_rows(self.table, self.typed, batch)  # rows whose key is stored already are skipped
