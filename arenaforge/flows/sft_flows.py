"""Flows of ASTRA's SFT track (`arenaforge ingest`, `arenaforge graph build`, `arenaforge sft synth`).

    ingest  : ingest-tools                                   -> tools, servers, rejections
    graph   : build-graphs                                   -> graph_edges
    sft     : sample-chains -> synthesize-tasks -> run-trajectories -> judge-trajectories [-> export-sft]
              runner.kind = ray: run-and-judge-trajectories per batch of tasks in the Ray workers, all at once,
              then record-walks here

Composition only: the stages live in `arenaforge/tracks/sft/stages.py` and pass ids between them. Each
flow runs in one event loop with one `RunScope` (the run's model and sandbox pool) shared by its
stages, and ends with `outcome.finish`: the run's top rejection reasons in its log, and a failed run
(NothingProduced / InfrastructureFailed) when it produced nothing. Relative paths resolve against the
working directory (a served run's is the user's project directory) and are passed on absolute.
Model-driven stages use retries=0 (the model-access layer owns retries); every stage writes
content-addressed records, so a re-run after a crash completes what was missing.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.cache_policies import NONE

from arenaforge.flows.artifacts import MODEL_ENDPOINT, progress, run_summary
from arenaforge.flows.outcome import finish
from arenaforge.flows.ray_runner import on_ray, runs_on_ray, worker_config, worker_scope
from arenaforge.flows.sft_params import GraphParams, IngestParams, SftParams
from arenaforge.services.run_scope import RunScope, open_run_scope
from arenaforge.tracks.sft import stages as sft_stages
from arenaforge.warehouse import Warehouse, recorded_run


def _absolute(path: str) -> str:
    return str(Path(path).expanduser().resolve())


# Stages take the run scope (live objects: an HTTP session, a sandbox pool), never part of a cache key.
ingest_task = task(sft_stages.ingest, name="ingest-tools", retries=0, cache_policy=NONE)
build_graphs_task = task(sft_stages.build_graphs, name="build-graphs", retries=0, tags=[MODEL_ENDPOINT],
                         cache_policy=NONE)
sample_chains_task = task(sft_stages.sample_chains, name="sample-chains", retries=0, tags=[MODEL_ENDPOINT],
                          cache_policy=NONE)
synthesize_tasks_task = task(sft_stages.synthesize_tasks, name="synthesize-tasks", retries=0, tags=[MODEL_ENDPOINT],
                             cache_policy=NONE)
trajectories_task = task(sft_stages.run_trajectories, name="run-trajectories", retries=0, tags=[MODEL_ENDPOINT],
                         cache_policy=NONE)
judge_task = task(sft_stages.judge, name="judge-trajectories", retries=0, tags=[MODEL_ENDPOINT], cache_policy=NONE)
export_task = task(sft_stages.export, name="export-sft", retries=1, cache_policy=NONE)
record_walks_task = task(sft_stages.record_walks, name="record-walks", retries=0, cache_policy=NONE)


async def run_and_judge_in_worker(cfg_json: dict[str, Any], run_id: str | None, task_ids: list[str],
                                  seed: int) -> tuple[list[str], dict[str, int]]:
    """One batch of tasks on a Ray worker: their trajectories run, written and judged (each episode's seed is its
    task's, so a batch's rows are the thread runner's); the walks are recorded by the flow."""
    async with worker_scope(cfg_json, run_id) as scope:
        trajectory_ids, counts = await sft_stages.run_trajectories(scope, task_ids, seed)
        _, judged = await sft_stages.judge(scope, trajectory_ids, record_uses=False)
    return trajectory_ids, {**counts, **judged}


run_and_judge_task = task(run_and_judge_in_worker, name="run-and-judge-trajectories", retries=0,
                          tags=[MODEL_ENDPOINT], cache_policy=NONE)


async def _episodes_on_ray(scope: RunScope, task_ids: list[str], seed: int, batch_size: int) -> dict[str, int]:
    """Every batch of tasks run and judged on the Ray cluster at once; then the walks of every trajectory recorded."""
    batches = [task_ids[i:i + batch_size] for i in range(0, len(task_ids), batch_size)]
    inputs = [{"cfg_json": worker_config(scope.cfg), "run_id": scope.run_id, "task_ids": b, "seed": seed}
              for b in batches]
    trajectory_ids: list[str] = []
    counts: dict[str, int] = {}
    async for ids, batch_counts in on_ray(scope, run_and_judge_task, inputs):
        trajectory_ids += ids
        for key, value in batch_counts.items():
            counts[key] = counts.get(key, 0) + value
    calls = counts.get("tool_calls", 0)
    counts["fault_rate_permille"] = round(counts.get("faults_injected", 0) / calls * 1000) if calls else 0
    await record_walks_task(scope, trajectory_ids)
    return counts


@flow(name="ingest", log_prints=True)
async def ingest(params: IngestParams = IngestParams()) -> dict[str, int]:
    """Ingest tool documents and live MCP servers into normalised tools grouped by server."""
    cfg = params.config()
    wh = Warehouse.from_config(cfg.warehouse)
    params = params.model_copy(update={"paths": [_absolute(p) for p in params.paths]})
    with recorded_run(wh, "ingest", params.model_dump(mode="json")) as (run, counts):
        async with open_run_scope(cfg, wh, run.id) as scope:
            counts.update(await ingest_task(scope, params.paths, params.mcp))
        run_summary("ingest", run.id, counts, warehouse_path=str(wh.path))
        finish("ingest", wh, run.id, counts["tools"], "tools")
    return {**counts, "run_id": run.id}


@flow(name="graph", log_prints=True)
async def graph(params: GraphParams = GraphParams()) -> dict[str, int]:
    """Build each server's tool-call graph (data flow, plus the chains the run's model proposes)."""
    cfg = params.config()
    wh = Warehouse.from_config(cfg.warehouse)
    with recorded_run(wh, "graph", params.model_dump(mode="json")) as (run, counts):
        async with open_run_scope(cfg, wh, run.id) as scope:
            counts.update(await build_graphs_task(scope, params.servers))
        run_summary("graph", run.id, counts, warehouse_path=str(wh.path))
        finish("graph", wh, run.id, counts["servers"], "servers with a graph")
    return {**counts, "run_id": run.id}


@flow(name="sft", log_prints=True)
async def sft(params: SftParams = SftParams()) -> dict[str, Any]:
    """Chains -> tasks -> trajectories -> seven-dimension scores (ASTRA §1a), optionally exported."""
    cfg = params.config()
    wh = Warehouse.from_config(cfg.warehouse)
    seed = cfg.seed if params.seed is None else params.seed
    if params.export_dir:
        params = params.model_copy(update={"export_dir": _absolute(params.export_dir)})
    with recorded_run(wh, "sft", params.model_dump(mode="json")) as (run, counts):
        extra = {}
        async with open_run_scope(cfg, wh, run.id) as scope:
            bar = progress("sft-stages", 4, "sft: chains, tasks, trajectories, judge")
            chain_ids, c = await sample_chains_task(scope, params.servers, seed)
            counts.update(c)
            bar.advance()
            task_ids, c = await synthesize_tasks_task(scope, chain_ids, params.servers, seed,
                                                      server_only=params.server_only)
            counts.update(c)
            bar.advance()
            if runs_on_ray(cfg):
                counts.update(await _episodes_on_ray(scope, task_ids, seed, params.batch_size))
                bar.advance()
            else:
                trajectory_ids, c = await trajectories_task(scope, task_ids, seed)
                counts.update(c)
                bar.advance()
                _, c = await judge_task(scope, trajectory_ids)
                counts.update(c)
            bar.advance()
            if params.export_dir:
                report = await export_task(scope, params.export_dir)
                counts["exported"] = int(report["samples"])
                extra = {"export": report["jsonl"]}
        run_summary("sft", run.id, counts, extra=extra, warehouse_path=str(wh.path))
        finish("sft", wh, run.id, counts.get("trajectories", 0), "trajectories")
    return {**counts, **extra, "run_id": run.id}
