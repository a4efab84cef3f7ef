"""`arenaforge bench sft`: SFT-track throughput on a generated corpus (offline backend).

Generates `tools` tool documents in `servers` servers (entity-centred services whose tools pass
ids to each other, like real APIs), then times, on a fresh warehouse in a temp folder:
  * warehouse open: the process's first open of the new warehouse (a lake's extensions and migrations);
  * ingest: normalisation + filters + one warehouse write of every tool and server;
  * graph: data-flow edges for every server (optionally with MiniLM similarity; model load timed apart)
    and their write to `graph_edges`;
  * chains: `chains_per_server` weighted walks per server, verified;
  * end to end on `e2e_servers` servers: chains -> tasks (+3 augmentations) -> trajectories
    (agent + simulator with 20% faults) -> judge -> export, each stage one warehouse batch;
    reported as trajectories per minute (goal >= 1,000).
"""

from __future__ import annotations

import random
import tempfile
import time
from pathlib import Path
from typing import Any

from arenaforge.benchmarks import bench_warehouse_path

_ENTITIES = ["order", "product", "customer", "invoice", "ticket", "flight", "hotel", "booking", "payment", "shipment",
             "account", "project", "task", "document", "playlist", "track", "recipe", "patient", "appointment", "vehicle",
             "route", "station", "course", "student", "exam", "property", "listing", "campaign", "lead", "contract",
             "device", "sensor", "alert", "repository", "issue", "release", "article", "author", "event", "venue"]
_FIELDS = {"name": "string", "status": "string", "price": "number", "quantity": "integer", "city": "string",
           "date": "string", "email": "string", "rating": "number", "category": "string", "notes": "string"}


def generate_corpus(n_tools: int, n_servers: int, seed: int = 0) -> tuple[list[Any], list[Any]]:
    """Raw tools and servers (arenaforge.tracks.sft.ingest_tools.RawTool / RawServer) of a synthetic corpus."""
    from arenaforge.tracks.sft.ingest_tools import RawServer, RawTool

    rng = random.Random(seed)
    tools: list[RawTool] = []
    servers: list[RawServer] = []
    per = [n_tools // n_servers + (1 if i < n_tools % n_servers else 0) for i in range(n_servers)]
    for i, count in enumerate(per):
        entities = rng.sample(_ENTITIES, k=min(len(_ENTITIES), max(2, count // 4 + 1)))
        name = f"svc{i:04d}-{entities[0]}"
        servers.append(RawServer(name=name, source="openai", title=f"{entities[0].title()} service {i}",
                                 description=f"Manage {', '.join(e + 's' for e in entities)}.", domain=entities[0]))
        made = 0
        k = 0
        while made < count:
            ent = entities[k % len(entities)]
            other = entities[(k + 1) % len(entities)]
            fields = rng.sample(list(_FIELDS), k=3)
            obj = {"type": "object", "properties": {f"{ent}_id": {"type": "string"}, f"{other}_id": {"type": "string"},
                                                    **{f: {"type": _FIELDS[f]} for f in fields}},
                   "required": [f"{ent}_id"]}
            variant = k // len(entities)
            specs = [
                (f"search_{ent}s", f"Search {ent}s by keywords and return matching {ent}s with their ids.",
                 {"query": {"type": "string", "description": "Keywords."},
                  "limit": {"type": "integer", "minimum": 1, "maximum": 20, "description": "Max results."}}, ["query"],
                 {"type": "object", "properties": {f"{ent}s": {"type": "array", "items": obj}}, "required": [f"{ent}s"]}),
                (f"get_{ent}", f"Get the details of one {ent} by its {ent} id.",
                 {f"{ent}_id": {"type": "string", "description": f"Id of the {ent}."}}, [f"{ent}_id"], obj),
                (f"create_{ent}", f"Create a {ent} linked to a {other} and return the new {ent}.",
                 {f"{other}_id": {"type": "string", "description": f"Id of the {other}."},
                  fields[0]: {"type": _FIELDS[fields[0]], "description": fields[0]}}, [f"{other}_id", fields[0]], obj),
                (f"update_{ent}_{fields[1]}", f"Update the {fields[1]} of a {ent} by its {ent} id.",
                 {f"{ent}_id": {"type": "string", "description": f"Id of the {ent}."},
                  fields[1]: {"type": _FIELDS[fields[1]], "description": f"New {fields[1]}."}}, [f"{ent}_id", fields[1]], obj),
            ]
            for tool_name, desc, props, required, returns in specs:
                if made >= count:
                    break
                suffix = f"_v{variant}" if variant else ""
                tools.append(RawTool(server=name, name=tool_name + suffix, description=desc,
                                     parameters={"type": "object", "properties": props, "required": required},
                                     returns=returns, source="openai", source_ref=f"generated:{i}"))
                made += 1
            k += 1
    return tools, servers


async def main(tools: int = 20000, servers: int = 1500, e2e_servers: int = 250, chains_per_server: int = 4,
               embeddings: bool = False, seed: int = 0, layout: str = "lake") -> dict:
    """Ingest, graph build, chain sampling and end-to-end trajectories/minute on a generated corpus.

    `layout`: the warehouse, `lake` (DuckLake, the default) or `file` (one DuckDB file, the layout before
    DuckLake), to time the stages apart from the storage under them.

    Args:
        tools: Tools in the generated corpus.
        servers: Servers the tools are spread over.
        e2e_servers: Servers the end-to-end run synthesizes trajectories for.
        chains_per_server: Tool chains sampled per server in the end-to-end run.
        embeddings: Add MiniLM similarity edges to the graph (slower).
        seed: Seed of the corpus and the walks.
        layout: Warehouse: lake (DuckLake) or file (one DuckDB file).
    """
    from arenaforge.schemas.config import Config, SftConfig, WarehouseConfig
    from arenaforge.services.heap import tenured_heap
    from arenaforge.services.run_scope import open_run_scope
    from arenaforge.tracks.sft import chains, tool_graph
    from arenaforge.tracks.sft import stages as sft_stages
    from arenaforge.tracks.sft.ingest_tools import finalise
    from arenaforge.warehouse import Warehouse

    out: dict[str, Any] = {"tools": tools, "servers": servers, "e2e_servers": e2e_servers, "embeddings": embeddings,
                           "layout": layout}
    # tenured as a flow's run scope is from ingest on (`services/heap.py`); the run scopes below nest in this one
    with tempfile.TemporaryDirectory() as tmp, tenured_heap():
        db = bench_warehouse_path(Path(tmp), layout)
        cfg = Config(warehouse=WarehouseConfig(path=db), out_dir=str(Path(tmp) / "out"),
                     sft=SftConfig(use_embeddings=embeddings, chains_per_server=chains_per_server))
        wh = Warehouse(db)

        t0 = time.perf_counter()
        raw_tools, raw_servers = generate_corpus(tools, servers, seed)
        out["generate_s"] = round(time.perf_counter() - t0, 2)

        cpu: dict[str, float] = {}  # CPU seconds of this process per stage: waiting for a core does not count
        out["cpu_s"] = cpu
        # the warehouse's one-off first open in this process (a lake: extension load and its signature
        # check, ATTACH, a new lake's migrations), apart from ingest's write
        t0, c0 = time.perf_counter(), time.process_time()
        wh.applied_migrations()
        out["warehouse_open_s"] = round(time.perf_counter() - t0, 2)
        cpu["warehouse_open"] = round(time.process_time() - c0, 2)
        t0, c0 = time.perf_counter(), time.process_time()
        result = finalise(raw_tools, raw_servers, cfg.sft)
        wh.upsert([*result.tools, *result.servers, *result.rejections])
        out["ingest_s"] = round(time.perf_counter() - t0, 2)
        cpu["ingest"] = round(time.process_time() - c0, 2)
        out["tools_kept"] = len(result.tools)
        out["servers_kept"] = len(result.servers)

        if embeddings:
            t0 = time.perf_counter()
            from arenaforge.services.embeddings import embed

            embed(["warm up"])
            out["embedding_model_load_s"] = round(time.perf_counter() - t0, 2)

        by_server: dict[str, list[Any]] = {}
        for t in result.tools:
            by_server.setdefault(t.server, []).append(t)
        async with open_run_scope(cfg, wh, "bench") as run:
            proposer, verifier = chains.EdgeProposer(cfg.sft, run.model), chains.ChainVerifier(cfg.sft, run.model)
            t0, c0 = time.perf_counter(), time.process_time()
            edges, _ = await chains.propose_edges(result.servers, by_server, proposer)
            out["graph_edges_compute_s"] = round(time.perf_counter() - t0, 2)
            t1 = time.perf_counter()
            out["edges"] = tool_graph.save_edges(wh, edges)
            out["graph_edges_write_s"] = round(time.perf_counter() - t1, 2)
            out["graph_build_s"] = round(time.perf_counter() - t0, 2)
            cpu["graph_build"] = round(time.process_time() - c0, 2)

            t0, c0 = time.perf_counter(), time.process_time()
            graphs = tool_graph.load_graphs(wh, result.servers)
            batch = await chains.sample_chains(result.servers, by_server, graphs, verifier, cfg.sft, seed, "bench",
                                                   run.provenance(seed))
        out["chain_sampling_s"] = round(time.perf_counter() - t0, 2)
        cpu["chain_sampling"] = round(time.process_time() - c0, 2)
        out["chains"] = len(batch.chains)
        out["verified_chains"] = sum(c.verified for c in batch.chains)
        out["chains_per_s"] = round(len(batch.chains) / max(out["chain_sampling_s"], 1e-9))

        subset = [s.name for s in result.servers[:e2e_servers]]
        t0, c0 = time.perf_counter(), time.process_time()
        async with open_run_scope(cfg, wh, "bench-e2e") as run:
            chain_ids, _ = await sft_stages.sample_chains(run, subset, seed + 1)
            t1, c1 = time.perf_counter(), time.process_time()
            task_ids, tc = await sft_stages.synthesize_tasks(run, chain_ids, subset, seed + 1)
            t2, c2 = time.perf_counter(), time.process_time()
            traj_ids, jc = await sft_stages.run_trajectories(run, task_ids, seed + 1)
            t3, c3 = time.perf_counter(), time.process_time()
            kept, kc = await sft_stages.judge(run, traj_ids)
            t4, c4 = time.perf_counter(), time.process_time()
            report = await sft_stages.export(run, Path(tmp) / "out")
            t5, c5 = time.perf_counter(), time.process_time()
        total = t5 - t0
        out["e2e"] = {
            "chains": len(chain_ids), "tasks": tc["tasks"], "accepted_tasks": tc["accepted_tasks"],
            "trajectories": len(traj_ids), "kept": len(kept), "exported": report["samples"],
            "stage_s": {"chains": round(t1 - t0, 2), "tasks": round(t2 - t1, 2), "trajectories": round(t3 - t2, 2),
                        "judge": round(t4 - t3, 2), "export": round(t5 - t4, 2)},
            "total_s": round(total, 2),
            "stage_cpu_s": {"chains": round(c1 - c0, 2), "tasks": round(c2 - c1, 2), "trajectories": round(c3 - c2, 2),
                            "judge": round(c4 - c3, 2), "export": round(c5 - c4, 2)},
            "total_cpu_s": round(c5 - c0, 2),
            "trajectories_per_min": round(len(traj_ids) / total * 60),
            "achieved_fault_rate": round(jc["faults_injected"] / max(jc["tool_calls"], 1), 4),
            "tool_calls_per_sample": report["tool_calls_per_sample"],
            "messages_per_sample": report["messages_per_sample"],
        }
    return out
