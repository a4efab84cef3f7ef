"""Run bookkeeping: every flow execution is a `runs` row whose id stamps what it wrote."""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

from arenaforge.schemas.models import Run
from arenaforge.warehouse.db import Warehouse


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="microseconds")


def start_run(wh: Warehouse, flow: str, params: dict[str, Any]) -> Run:
    mark_crashed(wh)
    run = Run(flow=flow, params=params, started_at=_now(), host=socket.gethostname(), pid=os.getpid())
    wh.upsert([run], replace=True)
    return run


def mark_crashed(wh: Warehouse) -> list[Run]:
    """Runs still `running` whose process on this machine is gone (killed, crashed) become `crashed`."""
    host = socket.gethostname()
    # parenthesised: in DuckDB 1.5 `->>` binds looser than AND (`a->>'x' = 1 AND b->>'y' = 2` misparses)
    stale = [r for r in wh.load(Run, where="(record->>'status') = 'running' AND (record->>'host') = ?", params=[host])
             if r.pid is not None and not _alive(r.pid)]
    done = [r.model_copy(update={"status": "crashed", "finished_at": _now(),
                                 "error": f"the process running it (pid {r.pid} on {host}) is gone"}) for r in stale]
    if done:
        wh.upsert(done, replace=True)
    return done


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, someone else's
        return True
    return True


def finish_run(wh: Warehouse, run: Run, status: str, counts: dict[str, int], error: str | None = None) -> Run:
    done = run.model_copy(update={"status": status, "finished_at": _now(), "counts": counts, "error": error})
    wh.upsert([done], replace=True)
    return done


@contextlib.contextmanager
def recorded_run(wh: Warehouse, flow: str, params: dict[str, Any]) -> Iterator[tuple[Run, dict[str, int]]]:
    """Start a run, yield it with a counts dict to fill, and close it as completed or failed."""
    run = start_run(wh, flow, params)
    counts: dict[str, int] = {}
    try:
        yield run, counts
    except BaseException as err:
        finish_run(wh, run, "failed", counts, error=f"{type(err).__name__}: {err}"[:500])
        raise
    finish_run(wh, run, "completed", counts)
