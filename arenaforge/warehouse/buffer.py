"""Group-commit writer for high-rate raw rows (model-response cache, per-call usage).

Callers `add()` rows from any thread or coroutine; a background thread writes whatever has
queued in one transaction every `interval_s` (or when `max_batch` rows wait), opening the
file only for that write so other processes can take their turn. `flush()` blocks until
everything added so far is durable; a crash loses at most the last interval's rows.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

from arenaforge.warehouse.db import Warehouse, column_lists, column_rows


class BufferedTableWriter:
    def __init__(
        self,
        wh: Warehouse,
        table: str,
        columns: Sequence[tuple[str, str]],
        key: str,
        interval_s: float = 0.2,
        max_batch: int = 512,
    ) -> None:
        self.wh = wh
        self.table = table
        self.typed = list(columns)  # (name, DuckDB type)
        self.columns = [name for name, _ in columns]
        self.key = key
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
        names = ", ".join(self.columns)
        with self.wh.transaction() as con:  # one statement over column lists (see column_rows)
            con.execute(f"INSERT INTO {self.table} ({names}) SELECT {names} FROM {column_rows(self.typed)} "
                        f"ON CONFLICT ({self.key}) DO NOTHING", column_lists(batch, len(self.columns)))
