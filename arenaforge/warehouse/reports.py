"""Typed summaries for the screen: why a run refused what it refused (over `v_rejections`), pages of a
table or view, what a table or view holds."""

from __future__ import annotations

from dataclasses import dataclass

from arenaforge.schemas.errors import WarehouseError
from arenaforge.warehouse.db import Warehouse, migration_files
from arenaforge.warehouse.lake_schema import declared_column_comments


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


@dataclass(frozen=True)
class RelationPage:
    """The first rows of a table or view (optionally filtered) and how many rows match in all."""

    name: str
    columns: list[str]
    rows: list[tuple]
    total: int


def browsing_name(wh: Warehouse, table: str) -> str:
    """The browsing view `v_<table>` when one exists, else `table` itself."""
    return f"v_{table}" if f"v_{table}" in {n for n, _ in wh.relations()} else table


def relation_page(wh: Warehouse, name: str, where: str = "", run_id: str | None = None, limit: int = 20) -> RelationPage:
    """What `db show` prints: up to `limit` rows of `name` matching the user's SQL filter `where` and,
    when given, written by run `run_id`; with the count of all matching rows."""
    wh.require_relation(name)
    filters = [f"({where})"] if where else []
    params: list[object] = []
    if run_id is not None:
        columns = {column for column, _, _ in relation_columns(wh, name)}
        if "run_id" in columns:
            filters.append("run_id = ?")
        elif name in ("runs", "v_runs"):  # a run's own row
            filters.append("id = ?")
        else:
            raise WarehouseError(f"{name} has no run_id column, so --run cannot pick its rows; filter with --where")
        params.append(run_id)
    condition = f" WHERE {' AND '.join(filters)}" if filters else ""
    # One statement, so the count and the rows come from one snapshot while writers commit.
    columns, rows = wh.query(f'SELECT (SELECT count(*) FROM "{name}"{condition}) AS "#total", * '
                             f'FROM "{name}"{condition} LIMIT ?', [*params, *params, limit])
    return RelationPage(name, columns[1:], [row[1:] for row in rows], int(rows[0][0]) if rows else 0)


def relation_comments(wh: Warehouse) -> dict[str, str]:
    """COMMENT ON text of every table and view that has one."""
    _, rows = wh.query(
        "SELECT table_name, comment FROM duckdb_tables() WHERE comment IS NOT NULL AND database_name = current_database() "
        "UNION ALL SELECT view_name, comment FROM duckdb_views() WHERE comment IS NOT NULL AND NOT internal "
        "AND database_name = current_database()")
    return {name: comment for name, comment in rows}


def relation_columns(wh: Warehouse, name: str) -> list[tuple[str, str, str]]:
    """(column, type, comment) of a table or view, in order. Comments the warehouse cannot hold (DuckLake
    keeps none on view columns) come from the migrations that declare them."""
    wh.require_relation(name)
    _, rows = wh.query("SELECT column_name, data_type, coalesce(comment, '') FROM duckdb_columns() "
                       "WHERE table_name = ? AND database_name = current_database() ORDER BY column_index", [name])
    declared = declared_column_comments(migration_files())
    return [(c, t, k or declared.get((name, c), "")) for c, t, k in rows]
