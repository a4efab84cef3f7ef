"""`runner.kind = "ray"`: a flow's batches as Prefect task runs on a Ray cluster (prefect-ray's `RayTaskRunner`).

A batch's inputs are plain values (the run's config, run id, parameters, record ids): the flow's live objects (HTTP
session, sandbox pool, MCP servers) do not travel, so each worker opens a run scope of its own from the config and
writes to the same warehouse under the flow's run id. The workers report their task runs to the flow's Prefect API.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

from arenaforge.schemas.config import Config
from arenaforge.schemas.errors import ConfigError
from arenaforge.services.run_scope import RunScope, open_run_scope
from arenaforge.warehouse import Warehouse


def runs_on_ray(cfg: Config) -> bool:
    """Whether the run's batches go to the Ray workers: the one place a flow's runner (`runner.kind`) is named."""
    return cfg.runner.kind == "ray"


def worker_config(cfg: Config) -> dict[str, Any]:
    """The run's config as the workers get it: plain JSON, the warehouse path absolute (workers start elsewhere)."""
    cfg_json = cfg.model_dump(mode="json")
    cfg_json["warehouse"]["path"] = str(Path(cfg.warehouse.path).resolve())
    return cfg_json


@contextlib.asynccontextmanager
async def worker_scope(cfg_json: dict[str, Any], run_id: str | None) -> AsyncIterator[RunScope]:
    """The run scope a Ray worker runs a batch in: its own model client and sandbox pool, the flow's warehouse and run."""
    cfg = Config.model_validate(cfg_json)
    async with open_run_scope(cfg, Warehouse.from_config(cfg.warehouse), run_id) as scope:
        yield scope


async def on_ray(scope: RunScope, job: Any, inputs: list[dict[str, Any]],
                 finish: Callable[[Any], Any] | None = None) -> AsyncIterator[Any]:
    """Submit `job` (a Prefect task) once per entry of `inputs` to the cluster at `runner.address`, all at once;
    yield each result in submission order (through `finish`, awaited in this process, when given)."""
    try:
        from prefect_ray import RayTaskRunner
    except ImportError:
        raise ConfigError("runner.kind = ray needs prefect-ray: pip install 'arenaforge[ray]'") from None
    env = {k: v for k, v in os.environ.items() if k.startswith(("PREFECT_", "ARENAFORGE_"))}
    runner = RayTaskRunner(address=scope.cfg.runner.address,
                           init_kwargs={"runtime_env": {"env_vars": env}, "log_to_driver": False})
    with runner:
        futures = [runner.submit(job, parameters) for parameters in inputs]
        for future in futures:
            result = await asyncio.to_thread(future.result)
            yield await finish(result) if finish is not None else result
