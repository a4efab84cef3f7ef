"""Stage entry points of the SFT flows: load inputs by reference, run one stage, write one batch.

Each stage is a coroutine over the run's `RunScope` (config, warehouse, run id, the run's model and
sandbox pool) and references (server names, record ids). It writes its records and rejections in ONE
`upsert` (opening DuckDB costs ~40 ms, so the hot path never writes per record) and returns
(ids produced, counts), which the flows in `flows/sft_flows.py` pass on. Nothing here imports Prefect.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from arenaforge.schemas.base import Provenance
from arenaforge.schemas.models import Rejection, Server, Task, Tool, ToolChain, Trajectory
from arenaforge.services.models import ChatModel, open_chat_model
from arenaforge.services.run_scope import RunScope
from arenaforge.tracks.sft import agent as sft_agent
from arenaforge.tracks.sft import (
    chains,
    ingest_tools,
    judge_trajectories,
    score_queries,
    synthesize_queries,
    tool_graph,
)
from arenaforge.tracks.sft import export as export_sft
from arenaforge.tracks.sft.tool_simulator import has_code, simulator_factory
from arenaforge.warehouse import lookups


def _stamp(rejections: Sequence[Rejection], run_id: str | None) -> list[Rejection]:
    return [r if r.run_id == run_id else r.model_copy(update={"run_id": run_id}) for r in rejections]


# --------------------------------------------------------------------------- ingest
async def ingest(run: RunScope, paths: Sequence[str] = (), mcp: Sequence[str] = ()) -> dict[str, int]:
    cfg = run.cfg
    result = await asyncio.to_thread(ingest_tools.ingest_paths, paths, cfg.sft) if paths else ingest_tools.IngestResult()
    if mcp:
        result.extend(await ingest_tools.ingest_mcp(mcp, cfg.sft))
    records: list[Any] = [t.model_copy(update={"run_id": run.run_id}) for t in result.tools]
    records += [s.model_copy(update={"run_id": run.run_id}) for s in result.servers]
    records += _stamp(result.rejections, run.run_id)
    new = await asyncio.to_thread(run.wh.upsert, records)
    return {**result.counts(), "new_rows": new}


# --------------------------------------------------------------------------- graph
async def build_graphs(run: RunScope, servers: Sequence[str] = ()) -> dict[str, int]:
    server_list, tools = await asyncio.to_thread(tool_graph.load_servers, run.wh, servers or None)
    proposer = chains.EdgeProposer(run.cfg.sft, run.model)
    edges, rejections = await chains.propose_edges(server_list, tools, proposer)
    n = await asyncio.to_thread(tool_graph.save_edges, run.wh, edges)
    if rejections:
        await asyncio.to_thread(run.wh.upsert, _stamp(rejections, run.run_id))
    return {"servers": len(server_list), "edges": n, "rejections": len(rejections)}


async def sample_chains(run: RunScope, servers: Sequence[str] = (), seed: int = 0) -> tuple[list[str], dict[str, int]]:
    wh, run_id = run.wh, run.run_id
    server_list, tools = await asyncio.to_thread(tool_graph.load_servers, wh, servers or None)
    graphs = await asyncio.to_thread(tool_graph.load_graphs, wh, server_list)
    verifier = chains.ChainVerifier(run.cfg.sft, run.model)
    batch = await chains.sample_chains(server_list, tools, graphs, verifier, run.cfg.sft, seed, run_id,
                                           run.provenance(seed))
    await asyncio.to_thread(wh.upsert, [*batch.chains, *_stamp(batch.rejections, run_id)])
    verified = [c.id for c in batch.chains if c.verified]
    return verified, {"chains": len(batch.chains), "verified_chains": len(verified)}


# --------------------------------------------------------------------------- tasks
async def synthesize_tasks(run: RunScope, chain_ids: Sequence[str], servers: Sequence[str] = (), seed: int = 0,
                           server_only: bool = False) -> tuple[list[str], dict[str, int]]:
    """Chain-conditioned tasks for the chains, plus (server_only) server-only tasks for `servers` (empty = all);
    scored, accepted or not."""
    cfg, wh, run_id = run.cfg, run.wh, run.run_id
    chains = lookups.by_ids(wh, ToolChain, chain_ids)
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
    writer = synthesize_queries.QueryWriter(run.model, cfg.sft.augmentations, cfg.sft.query_values == "program")
    drafts, rejections = await synthesize_queries.write_queries(jobs, writer)
    parents = {s.name: [s.id] for s in server_list}
    async with judging_model(run) as scoring:
        made, more = await score_queries.score_drafts(drafts, tools, score_queries.QueryScorer(scoring), cfg.sft,
                                                      run_id, judged_by(run.provenance(seed), scoring), parents)
    rejections += more
    await asyncio.to_thread(wh.upsert, [*made, *_stamp(rejections, run_id)])
    accepted = [t.id for t in made if t.accepted]
    return accepted, {"tasks": len(made), "accepted_tasks": len(accepted), "rejected_tasks": len(made) - len(accepted)}


@contextlib.asynccontextmanager
async def judging_model(run: RunScope) -> AsyncIterator[ChatModel]:
    """Who scores tasks and judges trajectories: the run's model, or (`sft.judge = rules`) the offline provider,
    whose scorer and judge are rules that read the task and the conversation (its calls are accounted as such)."""
    if run.cfg.sft.judge == "model":
        yield run.model
        return
    async with open_chat_model(run.cfg.model.model_copy(update={"backend": "offline"}), run.wh, run.run_id) as rules:
        yield rules


def judged_by(provenance: Provenance, model: ChatModel) -> Provenance:
    return provenance.model_copy(update={"backend": model.kind, "model": model.name})


# --------------------------------------------------------------------------- trajectories
async def run_trajectories(run: RunScope, task_ids: Sequence[str], seed: int = 0) -> tuple[list[str], dict[str, int]]:
    cfg, wh, run_id = run.cfg, run.wh, run.run_id
    tasks = lookups.by_ids(wh, Task, task_ids)
    chain_ids = sorted({t.chain_id for t in tasks if t.chain_id})
    chains = {c.id: c for c in lookups.by_ids(wh, ToolChain, chain_ids)}
    server_list, tools = tool_graph.load_servers(wh, sorted({t.server for t in tasks})) if tasks else ([], {})
    servers = {s.name: s for s in server_list}
    needs_sandbox = any(has_code(tools[s]) and not servers[s].launch for s in servers)

    pool = await run.sandbox() if needs_sandbox else None  # the sandbox runtime, only when some tools have code
    agent = sft_agent.Agent(run.model, cfg.sft.max_turns, cfg.sft.max_retries_per_call, cfg.sft.agent_first_turn,
                            cfg.sft.grounded_arguments)
    batch = await sft_agent.run_episodes(tasks, servers, tools, chains, agent, simulator_factory(cfg, run.model), cfg,
                                         seed, run_id, run.provenance(seed), sandbox_pool=pool)
    await asyncio.to_thread(wh.upsert, [*batch.trajectories, *_stamp(batch.rejections, run_id)])
    rate = batch.faults / batch.calls if batch.calls else 0.0
    return [t.id for t in batch.trajectories], {
        "trajectories": len(batch.trajectories), "tool_calls": batch.calls, "faults_injected": batch.faults,
        "fault_rate_permille": round(rate * 1000), "trajectory_rejections": len(batch.rejections)}


async def judge(run: RunScope, trajectory_ids: Sequence[str], record_uses: bool = True
                ) -> tuple[list[str], dict[str, int]]:
    """Seven-dimension scores of the trajectories; then (`record_uses`) the graph edges they walked count as used
    (a batch judged on a Ray worker leaves that to the flow, once every batch is judged: `record_walks`)."""
    wh, run_id = run.wh, run.run_id
    trajectories = lookups.by_ids(wh, Trajectory, trajectory_ids)
    task_ids = sorted({t.task_id for t in trajectories})
    tasks = {t.id: t for t in lookups.by_ids(wh, Task, task_ids)}
    chain_ids = sorted({t.chain_id for t in tasks.values() if t.chain_id})
    chains = {c.id: c for c in lookups.by_ids(wh, ToolChain, chain_ids)}
    async with judging_model(run) as judging:
        scores, rejections = await judge_trajectories.judge_trajectories(
            trajectories, tasks, chains, judge_trajectories.TrajectoryJudge(judging), run.cfg.sft.keep_threshold,
            run_id, judged_by(run.provenance(), judging), run.cfg.sft.grounded_arguments)
    await asyncio.to_thread(wh.upsert, [*scores, *_stamp(rejections, run_id)])
    # The walks count as used only once the run's trajectories are judged: a run killed before this point is redone
    # by its re-run with the same chains (the same rows), never skipped for having "used" them.
    if record_uses:
        await asyncio.to_thread(tool_graph.record_uses, wh, tool_graph.walked_edges(trajectories))
    kept = [s.id for s in scores if s.keep]
    return kept, {"scored": len(scores), "kept": len(kept)}


async def record_walks(run: RunScope, trajectory_ids: Sequence[str]) -> int:
    """The graph edges the (judged) trajectories walked count as used: what `judge` does after scoring."""
    trajectories = lookups.by_ids(run.wh, Trajectory, trajectory_ids)
    return await asyncio.to_thread(tool_graph.record_uses, run.wh, tool_graph.walked_edges(trajectories))


async def export(run: RunScope, out_dir: str | Path | None = None, min_score: float | None = None) -> dict[str, Any]:
    return await asyncio.to_thread(export_sft.export_sft, run.wh, out_dir or run.cfg.out_dir, run_id=run.run_id,
                                   min_score=min_score)
