"""Flows `envs-import-python`, `envs-import-bfcl`, `envs-import-harbor` (`arenaforge envs import ...`): others'
environments into the warehouse, each import one run (a `runs` row) whose id its environments and rejections carry.

Composition only: reading and replaying live in `arenaforge/tracks/envs/import_<source>.py`. Run ids stay out of
record ids, so an environment already stored (ours, or a re-import) keeps its row and its id.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from prefect import flow
from pydantic import BaseModel, Field

from arenaforge.schemas.config import Config, load_config
from arenaforge.schemas.errors import InputError
from arenaforge.schemas.models import Rejection
from arenaforge.warehouse import Warehouse, recorded_run


class ImportParams(BaseModel):
    """What every import takes: where the config comes from."""

    config_path: str | None = Field(default=None, description="arenaforge.toml to load (default: ./arenaforge.toml).")
    overrides: dict[str, Any] = Field(default_factory=dict, description="Dotted config overrides, e.g. warehouse.path.")


class PythonImportParams(ImportParams):
    sources: list[str] = Field(default_factory=list, description="PATH or PATH:Class of the tool code (several: each "
                               "its own namespace).")
    tools: str | None = Field(default=None, description="OpenAI tool documents (JSON file); none: derived from the "
                              "code.")
    initial_state: dict[str, Any] | None = Field(default=None, description="Initial state (keyed by Class/stem when "
                                                 "several).")
    calls: str | None = Field(default=None, description="Gold calls (JSON file), replayed; the final state's hash is "
                              "the check.")
    init_args: Any = Field(default=None, description="Constructor keyword arguments (a JSON object).")
    load_args: Any = Field(default=None, description="Extra loader keyword arguments (a JSON object).")
    name: str | None = Field(default=None, description="Environment name (none: python-<names>).")
    suite: str = Field(default="python", description="Suite name, for `arenaforge eval --suite`.")
    question: str | None = Field(default=None, description="The task prompt the agent is given.")
    requirements: list[str] = Field(default_factory=list, description="Packages the code imports, pinned (installed "
                                    "from local wheels).")
    backend: str | None = Field(default=None, description="auto, docker or process (none: sandbox.backend).")


class BfclImportParams(ImportParams):
    categories: list[str] = Field(default_factory=lambda: ["base", "miss_param", "miss_func", "long_context"],
                                  description="BFCL multi-turn categories.")
    data: str | None = Field(default=None, description="An unpacked bfcl_eval package (none: the installed bfcl-eval).")
    limit: int | None = Field(default=None, description="At most this many tasks per category.")
    backend: str | None = Field(default=None, description="auto, docker or process (none: sandbox.backend).")


class HarborImportParams(ImportParams):
    root: str = Field(default=".", description="A Harbor task directory, or a folder of them.")
    suite: str = Field(default="harbor", description="Suite name of others' tasks, for `arenaforge eval --suite`.")
    build_args: dict[str, str] = Field(default_factory=dict, description="KEY=VALUE for the tasks' docker builds.")


@contextmanager
def _import_run(flow_name: str, params: ImportParams, run_params: dict[str, Any] | None = None
                ) -> Iterator[tuple[Config, Warehouse, Any, dict[str, int]]]:
    cfg = load_config(params.config_path, overrides=params.overrides)
    wh = Warehouse.from_config(cfg.warehouse)
    with recorded_run(wh, flow_name, run_params or params.model_dump(mode="json")) as (run, counts):
        yield cfg, wh, run, counts


def _of_run(records: list[Any], run_id: str) -> list[Any]:
    return [r.model_copy(update={"run_id": run_id}) for r in records]


@flow(name="envs-import-python")
async def import_python(params: PythonImportParams = PythonImportParams()) -> dict[str, Any]:
    """Your own Python module or class as a warehouse environment (lineage: the files and their SHA-256)."""
    from arenaforge.environments.runtime import create_pool
    from arenaforge.tracks.envs.import_python import (
        import_environment,
        python_environment,
        read_calls,
        read_source,
        read_tool_docs,
    )

    if not params.sources:
        raise InputError("envs-import-python: sources: give the tool code (PATH or PATH:Class)")
    read = [read_source(s) for s in params.sources]
    env = python_environment(read, name=params.name, tool_docs=read_tool_docs(params.tools) if params.tools else None,
                             initial_state=params.initial_state, calls=read_calls(params.calls) if params.calls else [],
                             init_args=params.init_args, load_args=params.load_args, question=params.question,
                             requirements=params.requirements)
    with _import_run("envs-import-python", params) as (cfg, wh, run, counts):
        backend = {"backend": params.backend} if params.backend else {}
        sandbox = cfg.sandbox.model_copy(update={"pool_size": 1, **backend})
        async with await create_pool(sandbox) as pool:
            imported = await import_environment(pool, env, params.suite, read)
        imported = _of_run([imported], run.id)[0]
        counts["new"] = wh.upsert([imported])
    if isinstance(imported, Rejection):
        raise InputError(f"{imported.subject}: {imported.detail} (rejection {imported.id})")
    return {"id": imported.id, "name": imported.name, "suite": params.suite, "tools": [t.name for t in imported.tools],
            "gold_calls": len(imported.calls), "gold_state_sha256": imported.native.gold_state_sha256,
            "source": imported.native.source}


@flow(name="envs-import-bfcl")
async def import_bfcl(params: BfclImportParams = BfclImportParams()) -> dict[str, Any]:
    """BFCL multi-turn tasks as environments, each replayed in the sandbox to keep BFCL's own checks."""
    from collections import Counter

    from arenaforge.environments.runtime import create_pool
    from arenaforge.tracks.envs.import_bfcl import import_suite, locate

    source = locate(params.data)
    with _import_run("envs-import-bfcl", params) as (cfg, wh, run, counts):
        # BFCL returns whole files and long_context states are megabytes: neither may be cut
        sandbox = cfg.sandbox.model_copy(update={"output_limit_bytes": max(cfg.sandbox.output_limit_bytes, 8 << 20),
                                                 **({"backend": params.backend} if params.backend else {})})
        async with await create_pool(sandbox) as pool:
            envs, rejections = await import_suite(pool, source, list(params.categories), params.limit)
        envs, rejections = _of_run(envs, run.id), _of_run(rejections, run.id)
        counts["new"] = wh.upsert([*envs, *rejections]) - len(rejections)
        counts["rejected"] = len(rejections)
    return {"run_id": run.id, "bfcl_eval": source.version, "imported": dict(Counter(e.native.suite for e in envs)),
            "rejected": dict(Counter(f"{r.reason}" for r in rejections)),
            "rejected_examples": [f"{r.subject}: {r.detail[:160]}" for r in rejections[:3]]}


@flow(name="envs-import-harbor")
async def import_harbor(params: HarborImportParams = HarborImportParams()) -> dict[str, Any]:
    """Harbor tasks: ours come back as the same environment; others' become container tasks scored by their tests."""
    from collections import Counter
    from pathlib import Path

    from arenaforge.environments.containers import TaskContainers
    from arenaforge.tracks.envs.import_harbor import import_tasks

    run_params = {"root": str(Path(params.root).resolve()), "suite": params.suite, "build_args": params.build_args}
    with _import_run("envs-import-harbor", params, run_params) as (_, wh, run, counts):
        containers = TaskContainers()
        try:
            envs, rejections = await import_tasks(containers, params.root, params.suite, params.build_args)
        finally:
            await containers.shutdown()
        envs, rejections = _of_run(envs, run.id), _of_run(rejections, run.id)
        counts["new"] = wh.upsert(envs) if envs else 0
        counts["rejected"] = len(rejections)
        if rejections:
            wh.upsert(rejections)
    return {"run_id": run.id, "suite": params.suite, "imported": len(envs), "new": counts["new"],
            "ours": sum(e.container is None for e in envs), "ids": [e.id for e in envs],
            "rejected": dict(Counter(str(r.reason) for r in rejections)),
            "rejections": [f"{r.subject}: {r.reason}: {r.detail.splitlines()[0] if r.detail else ''}"
                           for r in rejections]}
