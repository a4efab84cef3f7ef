"""Stage entry points of the SFT flows: load inputs by reference, run one stage, write one batch.

Each function takes the config, the warehouse, the run id and references (server names, record
ids), builds the stage's backend once (offline or openai, see each stage module's factory), runs
the stage's async core, and writes its records and rejections in ONE `upsert` (opening DuckDB
costs ~40 ms, so the hot path never writes per record). It returns (ids produced, counts), which
the flows in `arenaforge/flows/sft_flows.py` pass on. Nothing here imports Prefect.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from arenaforge.schemas.base import Provenance
from arenaforge.schemas.config import Config
from arenaforge.schemas.models import Rejection, Server, Task, Tool, ToolChain, Trajectory
from arenaforge.tasks.sft import export as export_sft
from arenaforge.tasks.sft import ingest_tools
from arenaforge.tasks.sft import judge_trajectories
from arenaforge.tasks.sft import score_queries
from arenaforge.tasks.sft import agent as sft_agent
from arenaforge.tasks.sft import synthesize_queries
from arenaforge.tasks.sft import tool_graph
from arenaforge.tasks.models import ChatModel, chat_model
from arenaforge.tasks.sft.tool_simulator import has_code, simulator_factory
from arenaforge.warehouse.db import Warehouse


@contextlib.contextmanager
def model_scope(cfg: Config, wh: Warehouse, run_id: str | None) -> Iterator[ChatModel | None]:
    """The run's ChatModel for the openai backend (cache + usage flushed on exit); None offline."""
    factories = {"offline": contextlib.nullcontext, "openai": lambda: chat_model(cfg.model, wh, run_id)}
    with factories[cfg.model.backend]() as model:
        yield model


def provenance(cfg: Config, seed: int | None = None, prompt_hash: str | None = None) -> Provenance:
    model = cfg.model.model if cfg.model.backend == "openai" else None
    return Provenance(backend=cfg.model.backend, model=model, seed=seed, prompt_hash=prompt_hash)


def _stamp(rejections: Sequence[Rejection], run_id: str | None) -> list[Rejection]:
    return [r if r.run_id == run_id else r.model_copy(update={"run_id": run_id}) for r in rejections]


# --------------------------------------------------------------------------- ingest
def ingest(cfg: Config, wh: Warehouse, run_id: str | None, paths: Sequence[str] = (), mcp: Sequence[str] = ()
           ) -> dict[str, int]:
    result = ingest_tools.ingest_paths(paths, cfg.sft) if paths else ingest_tools.IngestResult()
    if mcp:
        result.extend(ingest_tools.ingest_mcp(mcp, cfg.sft))
    records: list[Any] = [t.model_copy(update={"run_id": run_id}) for t in result.tools]
    records += [s.model_copy(update={"run_id": run_id}) for s in result.servers]
    records += _stamp(result.rejections, run_id)
    new = wh.upsert(records)
    return {**result.counts(), "new_rows": new}


# --------------------------------------------------------------------------- graph
def build_graphs(cfg: Config, wh: Warehouse, run_id: str | None, servers: Sequence[str] = ()) -> dict[str, int]:
    server_list, tools = tool_graph.load_servers(wh, servers or None)
    with model_scope(cfg, wh, run_id) as model:
        proposer, _ = tool_graph.graph_backends(cfg, model)
        edges, rejections = asyncio.run(tool_graph.propose_edges(server_list, tools, proposer))
    n = tool_graph.save_edges(wh, edges)
    if rejections:
        wh.upsert(_stamp(rejections, run_id))
    return {"servers": len(server_list), "edges": n, "rejections": len(rejections)}


def sample_chains(cfg: Config, wh: Warehouse, run_id: str | None, servers: Sequence[str] = (), seed: int = 0
                  ) -> tuple[list[str], dict[str, int]]:
    server_list, tools = tool_graph.load_servers(wh, servers or None)
    graphs = tool_graph.load_graphs(wh, server_list)
    with model_scope(cfg, wh, run_id) as model:
        _, verifier = tool_graph.graph_backends(cfg, model)
        batch = asyncio.run(tool_graph.sample_chains(server_list, tools, graphs, verifier, cfg.sft, seed, run_id,
                                                     provenance(cfg, seed)))
    wh.upsert([*batch.chains, *_stamp(batch.rejections, run_id)])
    verified = [c.id for c in batch.chains if c.verified]
    return verified, {"chains": len(batch.chains), "verified_chains": len(verified)}


# --------------------------------------------------------------------------- tasks
def synthesize_tasks(cfg: Config, wh: Warehouse, run_id: str | None, chain_ids: Sequence[str],
                     servers: Sequence[str] = (), seed: int = 0, server_only: bool = False
                     ) -> tuple[list[str], dict[str, int]]:
    """Chain-conditioned tasks for the chains, plus (server_only) server-only tasks for `servers` (empty = all);
    scored, accepted or not."""
    chains = wh.load(ToolChain, where="id = ANY(?)", params=[list(chain_ids)]) if chain_ids else []
    server_list, tools = tool_graph.load_servers(wh, servers or None)
    by_name = {s.name: s for s in server_list}
    chains = [c for c in chains if c.server in by_name]
    jobs: list[tuple[Server, Sequence[Tool], ToolChain | None, Any]] = []
    for c in sorted(chains, key=lambda c: c.id):
        jobs.append((by_name[c.server], tools[c.server], c, tool_graph.server_rng(seed, c.id, "query")))
    for s in server_list if server_only else []:
        for k in range(cfg.sft.server_only_per_server):
            if tools.get(s.name):
                jobs.append((s, tools[s.name], None, tool_graph.server_rng(seed, s.name, f"server-query-{k}")))
    with model_scope(cfg, wh, run_id) as model:
        writer = synthesize_queries.query_writer(cfg, model)
        scorer = score_queries.query_scorer(cfg, model)

        async def go() -> tuple[list[Task], list[Rejection]]:
            drafts, rejected = await synthesize_queries.write_queries(jobs, writer)
            parents = {s.name: [s.id] for s in server_list}
            made, more = await score_queries.score_drafts(drafts, tools, scorer, cfg.sft, run_id, provenance(cfg, seed),
                                                          parents)
            return made, rejected + more

        made, rejections = asyncio.run(go())
    wh.upsert([*made, *_stamp(rejections, run_id)])
    accepted = [t.id for t in made if t.accepted]
    return accepted, {"tasks": len(made), "accepted_tasks": len(accepted), "rejected_tasks": len(made) - len(accepted)}


# --------------------------------------------------------------------------- trajectories
def run_trajectories(cfg: Config, wh: Warehouse, run_id: str | None, task_ids: Sequence[str], seed: int = 0
                     ) -> tuple[list[str], dict[str, int]]:
    tasks = wh.load(Task, where="id = ANY(?)", params=[list(task_ids)]) if task_ids else []
    chain_ids = sorted({t.chain_id for t in tasks if t.chain_id})
    chains = {c.id: c for c in wh.load(ToolChain, where="id = ANY(?)", params=[chain_ids])} if chain_ids else {}
    server_list, tools = tool_graph.load_servers(wh, sorted({t.server for t in tasks})) if tasks else ([], {})
    servers = {s.name: s for s in server_list}
    needs_sandbox = any(has_code(tools[s]) and not servers[s].launch for s in servers)

    async def go(model: ChatModel | None) -> sft_agent.TrajectoryBatch:
        from arenaforge.environments.runtime import create_pool  # the sandbox runtime, only when some tools have code

        pool = await create_pool(cfg.sandbox) if needs_sandbox else None
        try:
            return await sft_agent.run_episodes(tasks, servers, tools, chains, sft_agent.agent_for(cfg, model),
                                                simulator_factory(cfg, model), cfg, seed, run_id,
                                                provenance(cfg, seed), sandbox_pool=pool)
        finally:
            if pool is not None:
                await pool.shutdown()

    with model_scope(cfg, wh, run_id) as model:
        batch = asyncio.run(go(model))
    wh.upsert([*batch.trajectories, *_stamp(batch.rejections, run_id)])
    tool_graph.record_uses(wh, batch.walked)
    rate = batch.faults / batch.calls if batch.calls else 0.0
    return [t.id for t in batch.trajectories], {
        "trajectories": len(batch.trajectories), "tool_calls": batch.calls, "faults_injected": batch.faults,
        "fault_rate_permille": round(rate * 1000), "trajectory_rejections": len(batch.rejections)}


def judge(cfg: Config, wh: Warehouse, run_id: str | None, trajectory_ids: Sequence[str]
          ) -> tuple[list[str], dict[str, int]]:
    trajectories = wh.load(Trajectory, where="id = ANY(?)", params=[list(trajectory_ids)]) if trajectory_ids else []
    task_ids = sorted({t.task_id for t in trajectories})
    tasks = {t.id: t for t in wh.load(Task, where="id = ANY(?)", params=[task_ids])} if task_ids else {}
    chain_ids = sorted({t.chain_id for t in tasks.values() if t.chain_id})
    chains = {c.id: c for c in wh.load(ToolChain, where="id = ANY(?)", params=[chain_ids])} if chain_ids else {}
    with model_scope(cfg, wh, run_id) as model:
        judge_impl, kind = judge_trajectories.judge_for(cfg, model)
        scores, rejections = asyncio.run(judge_trajectories.judge_trajectories(
            trajectories, tasks, chains, judge_impl, kind, cfg.sft.keep_threshold, run_id, provenance(cfg)))
    wh.upsert([*scores, *_stamp(rejections, run_id)])
    kept = [s.id for s in scores if s.keep]
    return kept, {"scored": len(scores), "kept": len(kept)}


def export(cfg: Config, wh: Warehouse, out_dir: str | Path | None = None, run_id: str | None = None,
           min_score: float | None = None) -> dict[str, Any]:
    return export_sft.export_sft(wh, out_dir or cfg.out_dir, run_id=run_id, min_score=min_score)
