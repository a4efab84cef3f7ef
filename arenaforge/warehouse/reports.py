"""Typed summaries for the screen: why a run refused what it refused (over `v_rejections`)."""

from __future__ import annotations

from dataclasses import dataclass

from arenaforge.warehouse.db import Warehouse


@dataclass(frozen=True)
class ReasonCount:
    """One (stage, reason, kind) group of a run's rejections, with its first example."""

    stage: str
    reason: str
    kind: str  # a schemas.errors.FailureKind value
    count: int
    subject: str
    detail: str


def rejection_reasons(wh: Warehouse, run_id: str, limit: int = 5) -> tuple[list[ReasonCount], int]:
    """The run's `limit` most frequent rejection reasons, and how many rejections it has in all."""
    _, rows = wh.query(
        "SELECT stage, reason, kind, count(*) AS n, arg_min(subject, id), arg_min(detail, id) "
        "FROM v_rejections WHERE run_id = ? GROUP BY ALL ORDER BY n DESC, reason LIMIT ?",
        [run_id, limit],
    )
    _, total = wh.query("SELECT count(*) FROM rejections WHERE run_id = ?", [run_id])
    return [ReasonCount(s, r, k, int(n), subj or "", det or "") for s, r, k, n, subj, det in rows], int(total[0][0])


def relation_total(wh: Warehouse, name: str, where: str = "") -> int:
    """Rows of a table or view (optionally filtered): what `db show` counts before it prints a page."""
    wh.require_relation(name)
    _, rows = wh.query(f'SELECT count(*) FROM "{name}"' + (f" WHERE {where}" if where else ""))
    return int(rows[0][0])


def relation_comments(wh: Warehouse) -> dict[str, str]:
    """COMMENT ON text of every table and view that has one."""
    _, rows = wh.query(
        "SELECT table_name, comment FROM duckdb_tables() WHERE comment IS NOT NULL "
        "UNION ALL SELECT view_name, comment FROM duckdb_views() WHERE comment IS NOT NULL AND NOT internal")
    return {name: comment for name, comment in rows}


def relation_columns(wh: Warehouse, name: str) -> list[tuple[str, str, str]]:
    """(column, type, comment) of a table or view, in order."""
    wh.require_relation(name)
    _, rows = wh.query("SELECT column_name, data_type, coalesce(comment, '') FROM duckdb_columns() "
                       "WHERE table_name = ? ORDER BY column_index", [name])
    return [(c, t, k) for c, t, k in rows]
