"""DuckDB storage for every artifact: migrations, idempotent upserts, runs, exports.

Knows records only through their `schemas` models; never imports tasks, flows or environments.
"""

from arenaforge.warehouse.db import Warehouse, migration_files
from arenaforge.warehouse.exports import export_relation
from arenaforge.warehouse.runs import finish_run, recorded_run, start_run

__all__ = ["Warehouse", "export_relation", "finish_run", "migration_files", "recorded_run", "start_run"]
