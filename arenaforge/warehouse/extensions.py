"""The DuckDB extensions and CLI the warehouse uses, found in their PyPI packages.

DuckLake and its catalog extensions ship on PyPI as packages whose version must equal duckdb's
(`duckdb-extension-ducklake==X` goes with `duckdb==X`); nothing is downloaded at run time, every
extension is LOADed by file path. The `-sqlite-scanner` / `-postgres-scanner` packages are the ones
to use: the `-sqlite` / `-postgres` packages hold the same binary under a file name whose entry point
DuckDB does not find.
"""

from __future__ import annotations

import shutil
import sys
from importlib import resources
from pathlib import Path

import duckdb

from arenaforge.schemas.errors import WarehouseError

# Worker threads of a lake's DuckDB. The warehouse's statements are small (a batch of rows, a catalog
# lookup); spreading each over threads only adds scheduling: measured on the pipeline's write pattern,
# 1 thread spent half the CPU per row of the default and wrote 1.8x the rows/s on a loaded 2-core box.
# Large scans (a user's analysis) run in their own DuckDB: `arenaforge db cli`.
ENGINE_THREADS = 1

# extension name -> the PyPI package (import name) that carries it
PACKAGES = {
    "ducklake": "duckdb_extension_ducklake",
    "sqlite_scanner": "duckdb_extension_sqlite_scanner",
    "postgres_scanner": "duckdb_extension_postgres_scanner",
}


def extension_path(name: str) -> str:
    """Absolute path of the extension file matching the running duckdb; a one-line error when absent."""
    version = duckdb.__version__
    package = PACKAGES[name]
    hint = f"pip install {package.replace('_', '-')}=={version}"
    try:
        root = resources.files(package)
    except ModuleNotFoundError:
        raise WarehouseError(f"the DuckDB extension {name} is not installed ({hint})") from None
    path = Path(str(root)) / "extensions" / f"v{version}" / f"{name}.duckdb_extension"
    if not path.is_file():
        raise WarehouseError(f"no {name} extension for duckdb {version} in {root} ({hint})")
    return str(path)


_VERIFIED: set[str] = set()  # extension files whose signature this process has checked


def database(paths: list[str]) -> duckdb.DuckDBPyConnection:
    """An in-memory DuckDB with these extension files loaded. DuckDB checks an extension's signature
    by hashing its file (~0.27 s for these 35 MB) at every LOAD into every database; a process checks
    each file once, then loads it unchecked into the databases it opens later (~1 ms)."""
    checked = all(p in _VERIFIED for p in paths)
    db = duckdb.connect(config={"threads": ENGINE_THREADS, **({"allow_unsigned_extensions": "true"} if checked else {})})
    for path in paths:
        db.execute(f"LOAD '{_quote(path)}'")
        _VERIFIED.add(path)
    return quiet(db)


def quiet(con: duckdb.DuckDBPyConnection) -> duckdb.DuckDBPyConnection:
    """`con` without DuckDB's progress bar, a per-connection setting (it cannot be set globally): DuckDB
    draws it on stdout once a query passes 2 s, even into a pipe (measured), so under load it landed in
    the output of processes using the warehouse (a test writer's "ready" line)."""
    con.execute("SET enable_progress_bar = false")
    return con


def load_sql(names: list[str]) -> str:
    """`LOAD '<path>';` for each extension, in order."""
    return " ".join(f"LOAD '{_quote(extension_path(n))}';" for n in names)


def cli_binary() -> str:
    """The DuckDB CLI installed beside this Python (PyPI `duckdb-cli`, pinned to duckdb's version)."""
    beside = Path(sys.executable).parent / "duckdb"
    found = str(beside) if beside.is_file() else shutil.which("duckdb")
    if found is None:
        raise WarehouseError(f"no DuckDB CLI found (pip install duckdb-cli=={duckdb.__version__})")
    return found


def _quote(text: str) -> str:
    return text.replace("'", "''")
