"""Flows of ASTRA's SFT track (`arenaforge ingest`, `arenaforge graph build`, `arenaforge sft synth`).

    ingest  : ingest-tools                                   -> tools, servers, rejections
    graph   : build-graphs                                   -> graph_edges
    sft     : sample-chains -> synthesize-tasks -> run-trajectories -> judge-trajectories [-> export-sft]

Composition only: the stages live in `arenaforge/tasks/sft/stages.py` and pass ids between them.
Model-driven stages use retries=0 (the model-access layer owns retries); every stage writes
content-addressed records, so a re-run after a crash completes what was missing.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, task
from pydantic import BaseModel, Field

from arenaforge.flows.artifacts import MODEL_ENDPOINT, progress, run_summary
from arenaforge.schemas.config import Config, load_config
from arenaforge.tasks.sft import stages as sft_stages
from arenaforge.warehouse import Warehouse
from arenaforge.warehouse.runs import recorded_run


class _ConfigRef(BaseModel):
    config_path: str | None = Field(default=None, description="arenaforge.toml to load (default: ./arenaforge.toml).")
    overrides: dict[str, Any] = Field(default_factory=dict, description="Dotted config overrides, e.g. model.backend.")

    def config(self) -> Config:
        return load_config(self.config_path, overrides=self.overrides)


class IngestParams(_ConfigRef):
    paths: list[str] = Field(default_factory=list, description="Tool-document files or folders (formats auto-detected).")
    mcp: list[str] = Field(default_factory=list, description="Live MCP server commands, e.g. 'mcp-server-time'.")


class GraphParams(_ConfigRef):
    servers: list[str] = Field(default_factory=list, description="Servers to (re)build; empty = all.")


class SftParams(_ConfigRef):
    servers: list[str] = Field(default_factory=list, description="Servers to synthesize for; empty = all.")
    seed: int | None = Field(default=None, description="Seed of walks, queries and simulators (default: config seed).")
    server_only: bool = Field(default=True, description="Also write server-only tasks (not conditioned on a chain).")
    export_dir: str | None = Field(default=None, description="Export kept trajectories of this run here (JSONL+Parquet).")


def _warehouse(cfg: Config) -> Warehouse:
    return Warehouse(cfg.warehouse.path, lock_timeout_s=cfg.warehouse.lock_timeout_s,
                     data_path=cfg.warehouse.data_path)


@task(name="ingest-tools", retries=0)
def ingest_task(params: IngestParams, run_id: str) -> dict[str, int]:
    cfg = params.config()
    return sft_stages.ingest(cfg, _warehouse(cfg), run_id, params.paths, params.mcp)


@task(name="build-graphs", retries=0, tags=[MODEL_ENDPOINT])
def build_graphs_task(params: GraphParams, run_id: str) -> dict[str, int]:
    cfg = params.config()
    return sft_stages.build_graphs(cfg, _warehouse(cfg), run_id, params.servers)


@task(name="sample-chains", retries=0, tags=[MODEL_ENDPOINT])
def sample_chains_task(params: SftParams, run_id: str, seed: int) -> tuple[list[str], dict[str, int]]:
    cfg = params.config()
    return sft_stages.sample_chains(cfg, _warehouse(cfg), run_id, params.servers, seed)


@task(name="synthesize-tasks", retries=0, tags=[MODEL_ENDPOINT])
def synthesize_tasks_task(params: SftParams, run_id: str, chain_ids: list[str], seed: int
                          ) -> tuple[list[str], dict[str, int]]:
    cfg = params.config()
    return sft_stages.synthesize_tasks(cfg, _warehouse(cfg), run_id, chain_ids, params.servers, seed,
                                       server_only=params.server_only)


@task(name="run-trajectories", retries=0, tags=[MODEL_ENDPOINT])
def trajectories_task(params: SftParams, run_id: str, task_ids: list[str], seed: int) -> tuple[list[str], dict[str, int]]:
    cfg = params.config()
    return sft_stages.run_trajectories(cfg, _warehouse(cfg), run_id, task_ids, seed)


@task(name="judge-trajectories", retries=0, tags=[MODEL_ENDPOINT])
def judge_task(params: SftParams, run_id: str, trajectory_ids: list[str]) -> tuple[list[str], dict[str, int]]:
    cfg = params.config()
    return sft_stages.judge(cfg, _warehouse(cfg), run_id, trajectory_ids)


@task(name="export-sft", retries=1)
def export_task(params: SftParams, run_id: str) -> dict[str, Any]:
    cfg = params.config()
    return sft_stages.export(cfg, _warehouse(cfg), params.export_dir, run_id=run_id)


@flow(name="ingest", log_prints=True)
def ingest(params: IngestParams) -> dict[str, int]:
    """Ingest tool documents and live MCP servers into normalised tools grouped by server."""
    cfg = params.config()
    wh = _warehouse(cfg)
    with recorded_run(wh, "ingest", params.model_dump(mode="json")) as (run, counts):
        counts.update(ingest_task(params, run.id))
        run_summary("ingest", run.id, counts, warehouse_path=str(wh.path))
    return counts


@flow(name="graph", log_prints=True)
def graph(params: GraphParams) -> dict[str, int]:
    """Build each server's tool-call graph (data flow; plus model-proposed chains on openai)."""
    cfg = params.config()
    wh = _warehouse(cfg)
    with recorded_run(wh, "graph", params.model_dump(mode="json")) as (run, counts):
        counts.update(build_graphs_task(params, run.id))
        run_summary("graph", run.id, counts, warehouse_path=str(wh.path))
    return counts


@flow(name="sft", log_prints=True)
def sft(params: SftParams) -> dict[str, Any]:
    """Chains -> tasks -> trajectories -> seven-dimension scores (ASTRA §1a), optionally exported."""
    cfg = params.config()
    wh = _warehouse(cfg)
    seed = cfg.seed if params.seed is None else params.seed
    with recorded_run(wh, "sft", params.model_dump(mode="json")) as (run, counts):
        bar = progress("sft-stages", 4, "sft: chains, tasks, trajectories, judge")
        chain_ids, c = sample_chains_task(params, run.id, seed)
        counts.update(c)
        bar.advance()
        task_ids, c = synthesize_tasks_task(params, run.id, chain_ids, seed)
        counts.update(c)
        bar.advance()
        trajectory_ids, c = trajectories_task(params, run.id, task_ids, seed)
        counts.update(c)
        bar.advance()
        _, c = judge_task(params, run.id, trajectory_ids)
        counts.update(c)
        bar.advance()
        extra = {}
        if params.export_dir:
            report = export_task(params, run.id)
            counts["exported"] = int(report["samples"])
            extra = {"export": report["jsonl"]}
        run_summary("sft", run.id, counts, extra=extra, warehouse_path=str(wh.path))
    return {**counts, "run_id": run.id}
