"""The session's `arenaforge serve` stack for tests (see the `served` fixture in tests/conftest.py).

Connects to the session `prefect_server` (prefect.api_url) instead of starting a second
server, registers every deployment in arenaforge.flows.registry.FLOWS plus `probe` (a tiny flow in
tests/flows/serve_probe.py that writes rows, so the tests do not depend on which capability
flows have landed), and starts a worker on its own work pool.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.support.requirements import REPO

PROBE = {"probe": "tests.flows.serve_probe:probe"}
SCHEDULES = {"probe": {"interval_s": 3600, "active": False, "parameters": {"params": {"tag": "scheduled", "n": 2}}}}


def served_flows() -> dict[str, str]:
    from arenaforge.flows.registry import FLOWS

    return {**FLOWS, **PROBE}


def start_served(prefect_server: Any, root: Path) -> Any:
    from arenaforge.flows.serve import Stack
    from arenaforge.schemas.config import load_config
    from arenaforge.warehouse import Warehouse

    db = root / "served.duckdb"
    cfg = load_config(
        path=None,
        overrides={
            "warehouse.path": str(db),
            "prefect.api_url": prefect_server.api_url,
            "prefect.home": str(root / "home"),
            "prefect.work_pool": "arenaforge-test",
            "prefect.schedules": SCHEDULES,
            "prefect.worker_limit": 4,
            "project_dir": str(root),
        },
        environ={},
    )
    # flow runs work in `root` (the project directory); the probe flow lives in tests/, so its
    # import path is added (arenaforge itself is installed)
    stack = Stack(cfg, flows=served_flows(), extra_env={"PREFECT_LOGGING_LEVEL": "INFO", "PYTHONPATH": str(REPO)})
    stack.warehouse = Warehouse(db, lock_timeout_s=60)  # type: ignore[attr-defined]
    stack.__enter__()
    return stack
