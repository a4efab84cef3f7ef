"""Benchmarks, one module per capability, each with `main(**options) -> dict` printed as JSON by
`arenaforge bench <name>`. They measure; they never assert."""

from pathlib import Path

from arenaforge.schemas.errors import ConfigError


def bench_warehouse_path(folder: Path, layout: str) -> str:
    """Where a benchmark's warehouse goes in `folder`: a DuckLake (`lake`) or one DuckDB file (`file`)."""
    if layout not in ("lake", "file"):
        raise ConfigError(f"unknown warehouse layout {layout!r}: lake or file")
    return f"file:{folder / 'bench.duckdb'}" if layout == "file" else str(folder / "bench.lake")
