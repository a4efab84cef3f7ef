"""Rows bound as parameters: the relation every batched write selects from, and a keyed batch.

DuckDB's `executemany` runs a statement per row (~10 ms each here), and registering Arrow tables
(`con.register`) races inside DuckDB when another thread opens a connection to the same database,
so a batch travels as one list per column, unnested by `column_rows`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any


def column_rows(columns: Sequence[tuple[str, str]]) -> str:
    """A relation over typed per-column parameter lists, bound in order as $1, $2, ..."""
    return "(SELECT " + ", ".join(f"unnest(${i}::{kind}[]) AS {name}" for i, (name, kind) in enumerate(columns, 1)) + ")"


def column_lists(rows: Sequence[Sequence[Any]], width: int) -> list[list[Any]]:
    """Row tuples -> one list per column (the parameters of `column_rows`)."""
    return [list(col) for col in zip(*rows, strict=True)] if rows else [[] for _ in range(width)]


@dataclass(frozen=True)
class KeyedRows:
    """Rows for one table that go in only where their key is not stored yet (one row per key)."""

    table: str
    columns: list[tuple[str, str]]  # (name, DuckDB type), in the order of each row's values
    rows: list[tuple[Any, ...]]
    key: list[str]
    wrap: str = "{rows}"  # the relation inserted: `column_rows(columns)` as is, or wrapped (a cast)

    @classmethod
    def first_per_key(cls, table: str, columns: Sequence[tuple[str, str]], rows: Sequence[Sequence[Any]],
                      key: Sequence[str], wrap: str = "{rows}") -> "KeyedRows":
        """The first row of each key wins, as ON CONFLICT DO NOTHING would."""
        names = [name for name, _ in columns]
        positions = [names.index(k) for k in key]
        unique: dict[tuple[Any, ...], tuple[Any, ...]] = {}
        for row in rows:
            unique.setdefault(tuple(row[i] for i in positions), tuple(row))
        return cls(table, list(columns), list(unique.values()), list(key), wrap)

    @property
    def names(self) -> str:
        return ", ".join(name for name, _ in self.columns)

    def select(self) -> str:
        return self.wrap.format(rows=column_rows(self.columns))

    def params(self) -> list[list[Any]]:
        return column_lists(self.rows, len(self.columns))

    def keys_select(self) -> str:
        """A relation of just the key columns (no payload to unnest), over `keys_params()`."""
        kinds = dict(self.columns)
        return column_rows([(k, kinds[k]) for k in self.key])

    def keys_params(self) -> list[list[Any]]:
        positions = [[name for name, _ in self.columns].index(k) for k in self.key]
        return column_lists([tuple(row[i] for i in positions) for row in self.rows], len(positions))

    def without(self, present: set[tuple[Any, ...]]) -> "KeyedRows":
        """These rows less those whose key is in `present`."""
        if not present:
            return self
        positions = [[name for name, _ in self.columns].index(k) for k in self.key]
        return replace(self, rows=[row for row in self.rows if tuple(row[i] for i in positions) not in present])
