"""Moving a single-file warehouse into a DuckLake: `arenaforge db migrate --from FILE`.

Warehouses made before DuckLake are DuckDB files written by duckdb 2.0.0 (storage version 69),
which the duckdb this project pins for DuckLake (1.5.x) cannot open. The copy therefore runs in
two steps: a child Python exports every table to Parquet with a duckdb that reads the file (this
one when it can, else duckdb 2.0.0 installed beside the environment by scripts/setup.sh, or on
first use with pip), then the rows go into the lake with the usual keyed insert, so running the
command twice copies nothing twice.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from importlib import resources
from pathlib import Path
from typing import Any

from arenaforge.schemas.errors import WarehouseError

LAST_SINGLE_FILE_DUCKDB = "2.0.0"  # the duckdb that wrote single-file warehouses before DuckLake


def legacy_duckdb_dir(install: bool = True) -> Path:
    """A directory holding duckdb==2.0.0 for a child process's PYTHONPATH (installed with pip if absent)."""
    target = Path(sys.prefix) / f"legacy-duckdb-{LAST_SINGLE_FILE_DUCKDB}"
    if (target / "duckdb").is_dir():
        return target
    if not install:
        raise WarehouseError(f"duckdb {LAST_SINGLE_FILE_DUCKDB} is not installed in {target} (run scripts/setup.sh)")
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--target", str(target),
                           f"duckdb=={LAST_SINGLE_FILE_DUCKDB}"], capture_output=True, text=True)
    if done.returncode != 0 or not (target / "duckdb").is_dir():
        raise WarehouseError(f"could not install duckdb {LAST_SINGLE_FILE_DUCKDB} to read the old file: "
                             f"{(done.stderr.strip().splitlines() or ['pip failed'])[-1]}")
    return target


def legacy_env(pythonpath: Path) -> dict[str, str]:
    """Environment for a child Python whose `import duckdb` finds the version in `pythonpath` first."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(pythonpath), os.environ.get("PYTHONPATH", "")) if p)}


def export_single_file(src: Path, out: Path) -> list[str]:
    """Every table of the DuckDB file `src` as `out/<table>.parquet`; the table names."""
    script = resources.files("arenaforge.warehouse").joinpath("export_single_file.py").read_text()
    cmd = [sys.executable, "-c", script, str(src), str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0 and "version number" in done.stderr:  # written by a newer duckdb than ours
        done = subprocess.run(cmd, capture_output=True, text=True, env=legacy_env(legacy_duckdb_dir()))
    if done.returncode != 0:
        raise WarehouseError(f"cannot read {src}: {(done.stderr.strip().splitlines() or ['export failed'])[-1]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def import_single_file(src: str | Path, wh: Any) -> dict[str, Any]:
    """Copy every table of the single-file warehouse `src` into `wh`; rows new per table, tables skipped."""
    src = Path(src)
    if not src.is_file():
        raise WarehouseError(f"no such file: {src}")
    known = {name for name, kind in wh.relations() if kind == "table"} - {"schema_migrations"}
    copied: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="af-migrate-") as tmp:
        tables = export_single_file(src, Path(tmp))
        for table in tables:
            if table not in known:
                continue
            parquet = str(Path(tmp) / f"{table}.parquet").replace("'", "''")
            with wh.connect() as con:
                theirs = [r[0] for r in con.execute(f"DESCRIBE SELECT * FROM read_parquet('{parquet}')").fetchall()]
                ours = [r[0] for r in con.execute(f'DESCRIBE "{table}"').fetchall()]
            names = ", ".join(f'"{c}"' for c in ours if c in theirs)
            select = f"(SELECT {names} FROM read_parquet('{parquet}'))"
            with wh.transaction() as con:
                copied[table] = wh.store.insert_new(con, table, names, select, [], wh.key_of(table))
    skipped = sorted(set(tables) - known - {"schema_migrations"})
    return {"from": str(src), "to": str(wh.path), "rows_copied": copied, "tables_skipped": skipped}
