"""Typed reads and writes of environment splits (`env_splits`, migration 0008).

The assignment itself (strata, near-duplicate groups) is `arenaforge.tracks.train.splits`; this
module only stores and reads the rows.
"""

from __future__ import annotations

from collections.abc import Sequence

from arenaforge.schemas.kinds_training import EnvSplit
from arenaforge.warehouse.db import Warehouse


def write_splits(wh: Warehouse, splits: Sequence[EnvSplit]) -> int:
    """Store split rows; an environment already assigned in a scheme keeps its row. Returns rows added."""
    return wh.upsert(splits)


def read_splits(wh: Warehouse, scheme: str = "default") -> dict[str, EnvSplit]:
    """env id -> its split row in `scheme`."""
    rows = wh.load(EnvSplit, where="(record->>'scheme') = ?", params=[scheme])
    return {r.env_id: r for r in rows}


def split_env_ids(wh: Warehouse, split: str, scheme: str = "default") -> set[str]:
    """Ids of the environments in `split` ('train' or 'test') of `scheme`."""
    # parenthesised: DuckLake 1.5.5 re-renders a pushed-down filter without them, and `->>` binds
    # looser than AND, so `a->>'x' = ? AND a->>'y' = ?` becomes a cast of the record (see runs.py)
    _, rows = wh.query("SELECT record->>'env_id' FROM env_splits WHERE (record->>'scheme') = ? AND (record->>'split') = ?",
                       [scheme, split])
    return {r[0] for r in rows}
