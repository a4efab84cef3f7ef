"""Storage for every artifact: migrations, idempotent upserts, runs, exports.

A DuckLake (catalog in SQLite or PostgreSQL, data as Parquet) that any number of processes read
while several write, or a single DuckDB file (the layout before DuckLake). Knows records only
through their `schemas` models; never imports tasks, flows or environments.
"""

from arenaforge.warehouse.db import Warehouse, absolute_location, migration_files
from arenaforge.warehouse.exports import export_relation
from arenaforge.warehouse.runs import finish_run, recorded_run, start_run

__all__ = ["Warehouse", "absolute_location", "export_relation", "finish_run", "migration_files", "recorded_run",
           "start_run"]
