"""Export any table or view to Parquet or JSONL (DuckDB's own COPY writes both)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from arenaforge.schemas.errors import InputError
from arenaforge.warehouse.db import Warehouse

ExportFormat = Literal["parquet", "jsonl"]
_COPY_OPTIONS = {"parquet": "(FORMAT parquet)", "jsonl": "(FORMAT json)"}


def export_relation(wh: Warehouse, name: str, fmt: ExportFormat, dest: str | Path | None = None, where: str = "") -> Path:
    """Write `name` (optionally filtered) to `dest` (default ./out/<name>.<fmt>); returns the path."""
    if fmt not in _COPY_OPTIONS:
        raise InputError(f"unknown export format {fmt!r}; use parquet or jsonl")
    wh.require_relation(name)
    path = Path(dest) if dest else Path("out") / f"{name}.{fmt}"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    # In Parquet, JSON columns go out as text (readers would otherwise see opaque bytes);
    # in JSONL they stay nested objects.
    _, rows = wh.query(f'DESCRIBE SELECT * FROM "{name}"')
    json_cols = [r[0] for r in rows if r[1] == "JSON"] if fmt == "parquet" else []
    replace = ", ".join(f'CAST("{c}" AS VARCHAR) AS "{c}"' for c in json_cols)
    star = f"* REPLACE ({replace})" if json_cols else "*"
    select = f'SELECT {star} FROM "{name}"' + (f" WHERE {where}" if where else "")
    escaped = str(tmp).replace("'", "''")
    wh.query(f"COPY ({select}) TO '{escaped}' {_COPY_OPTIONS[fmt]}")
    tmp.replace(path)  # readers never see a half-written file
    return path
