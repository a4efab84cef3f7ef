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

# The DuckDB the extension packages are built for; the DuckDB CLI that opens the warehouse must be this version.
DUCKDB_VERSION = duckdb.__version__

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
    """The DuckDB CLI to open the warehouse with: the one installed beside this Python (PyPI `duckdb-cli`, pinned to
    duckdb's version), else `duckdb` on PATH. A one-line error when none is found or when it is another version of
    DuckDB: the extensions LOAD only into the exact version they were built for (`DUCKDB_VERSION`)."""
    beside = Path(sys.executable).parent / "duckdb"
    found = str(beside) if beside.is_file() else shutil.which("duckdb")
    fix = f"pip install duckdb-cli=={DUCKDB_VERSION}"
    if found is None:
        raise WarehouseError(f"no DuckDB CLI found: the warehouse needs DuckDB v{DUCKDB_VERSION} ({fix})")
    version = cli_version(found)
    if version != f"v{DUCKDB_VERSION}":
        raise WarehouseError(f"{found} is DuckDB {version}, but the warehouse's extensions load only into DuckDB "
                             f"v{DUCKDB_VERSION} ({fix})")
    return found


def cli_version(binary: str) -> str:
    """What `binary --version` says its DuckDB is, e.g. `v1.5.5` (PyPI's duckdb-cli 1.5.6 says `v1.5.6`)."""
    import subprocess

    try:
        done = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=60)
    except OSError as err:
        raise WarehouseError(f"cannot run the DuckDB CLI {binary}: {err}") from None
    words = done.stdout.split()
    if done.returncode != 0 or not words:
        raise WarehouseError(f"{binary} --version failed: {(done.stderr or done.stdout).strip()[:200]}")
    return words[0]


def _quote(text: str) -> str:
    return text.replace("'", "''")
