"""The `graph_edges` table: each server's tool-call graph, with how often synthesis walked each edge.

`weight` is the strength of the evidence for an edge (data-flow match or model votes), `uses` how many
synthesized trajectories walked it; sampling prefers rarely used edges, so `uses` survives a rebuild.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from arenaforge.warehouse.db import Warehouse, column_lists, column_rows


@dataclass(frozen=True)
class EdgeRow:
    server: str
    src: str
    dst: str
    weight: float
    origin: str  # dataflow | model | both
    evidence: str
    uses: int = 0


_EDGE_COLUMNS = [("server", "VARCHAR"), ("src", "VARCHAR"), ("dst", "VARCHAR"), ("weight", "DOUBLE"),
                 ("origin", "VARCHAR"), ("evidence", "VARCHAR")]
_USE_COLUMNS = [("server", "VARCHAR"), ("src", "VARCHAR"), ("dst", "VARCHAR"), ("n", "BIGINT")]


def replace_edges(wh: Warehouse, servers: Sequence[str], edges: Sequence[EdgeRow]) -> int:
    """Make these servers' edges exactly `edges` (keeping the `uses` of edges that survive); one transaction."""
    rows = [(e.server, e.src, e.dst, e.weight, e.origin, e.evidence) for e in edges]
    with wh.transaction() as con:
        con.execute(f"CREATE TEMP TABLE _servers AS SELECT * FROM {column_rows(_EDGE_COLUMNS[:1])}", [list(servers)])
        con.execute(f"CREATE TEMP TABLE _edges AS SELECT * FROM {column_rows(_EDGE_COLUMNS)}",
                    column_lists(rows, len(_EDGE_COLUMNS)))
        con.execute("DELETE FROM graph_edges WHERE server IN (SELECT server FROM _servers) "
                    "AND (server, src, dst) NOT IN (SELECT server, src, dst FROM _edges)")
        con.execute(  # MERGE, not ON CONFLICT: a DuckLake warehouse has no primary keys
            "MERGE INTO graph_edges g USING _edges e ON g.server = e.server AND g.src = e.src AND g.dst = e.dst "
            "WHEN MATCHED THEN UPDATE SET weight = e.weight, origin = e.origin, evidence = e.evidence, updated_at = now() "
            "WHEN NOT MATCHED THEN INSERT (server, src, dst, weight, uses, origin, evidence) "
            "VALUES (e.server, e.src, e.dst, e.weight, 0, e.origin, e.evidence)")
        con.execute("DROP TABLE _edges")
        con.execute("DROP TABLE _servers")
    return len(rows)


def add_uses(wh: Warehouse, uses: Mapping[tuple[str, str, str], int]) -> int:
    """Add `n` uses to each (server, src, dst) edge; one transaction. Returns the uses added."""
    if not uses:
        return 0
    with wh.transaction() as con:
        con.execute(f"UPDATE graph_edges SET uses = graph_edges.uses + u.n, updated_at = now() "
                    f"FROM {column_rows(_USE_COLUMNS)} u "
                    "WHERE graph_edges.server = u.server AND graph_edges.src = u.src AND graph_edges.dst = u.dst",
                    column_lists([(*k, n) for k, n in uses.items()], len(_USE_COLUMNS)))
    return sum(uses.values())


def all_edges(wh: Warehouse) -> list[EdgeRow]:
    _, rows = wh.query("SELECT server, src, dst, weight, origin, evidence, uses FROM graph_edges ORDER BY ALL")
    return [EdgeRow(*row) for row in rows]
