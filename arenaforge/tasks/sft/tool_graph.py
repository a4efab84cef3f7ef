"""Tool-call transition graphs per server, weighted bounded walks, chain verification (ASTRA §1a.2).

Nodes are a server's tools; a directed edge a -> b says "b may legally follow a". Edges come from
  * data flow (both backends): an output field of `a` (its response schema, else its description)
    feeds a parameter of `b`, matched by name, type and MiniLM similarity of the names;
  * model-proposed chains (openai backend): consecutive pairs of chains the model proposes.
Edges live in the warehouse table `graph_edges` with a `uses` count: walks pick the next tool with
probability ~ weight / (1 + uses), and every run adds the edges its trajectories walked, so rarely
used edges are sampled more on the next run. Walks are seeded, length-bounded and acyclic.

Verification is a filter on sampled chains: offline, every required parameter must be satisfiable
from the task (first call, or a user-known value) or from an earlier call's output; openai, a
majority of judges must accept the chain and a back-translation (chain -> task -> chain) must
return it unchanged.
"""

from __future__ import annotations

import asyncio
import functools
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import networkx as nx

from arenaforge.schemas.base import Provenance
from arenaforge.schemas.config import Config, SftConfig
from arenaforge.schemas.errors import InputError, ParseError, ProviderError
from arenaforge.schemas.models import Rejection, Server, Tool, ToolChain
from arenaforge.tasks.models import ChatModel, complete_json
from arenaforge.tasks.prompts import load_prompt
from arenaforge.warehouse.db import Warehouse, column_lists, column_rows

_ID_LIKE = re.compile(r"(^|_)(id|ids|uuid|token|handle|cursor|key|sha|hash|ref)$")
_STOP = {"the", "a", "an", "of", "for", "and", "or", "to", "in", "on", "by", "with", "its", "it", "is", "this", "that",
         "from", "get", "gets", "set", "returns", "return", "given", "specified", "information", "details", "data"}


# --------------------------------------------------------------------------- fields
@dataclass(frozen=True)
class SchemaField:
    name: str
    type: str | None
    required: bool = False

    @property
    def words(self) -> str:
        return humanize(self.name)


@functools.lru_cache(maxsize=65536)
def humanize(name: str) -> str:
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name)
    return re.sub(r"[^a-zA-Z0-9]+", " ", spaced).strip().lower()


@functools.lru_cache(maxsize=65536)
def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _type_of(schema: Any) -> str | None:
    if not isinstance(schema, dict):
        return None
    t = schema.get("type")
    if isinstance(t, list):
        t = next((x for x in t if x != "null"), None)
    return t if isinstance(t, str) else None


def output_fields(tool: Tool) -> list[SchemaField]:
    """Leaf and object fields of the tool's response schema (nested objects and array items included)."""
    found: list[SchemaField] = []

    def walk(schema: Any, depth: int) -> None:
        if not isinstance(schema, dict) or depth > 4:
            return
        if isinstance(schema.get("items"), dict):
            walk(schema["items"], depth + 1)
        for name, sub in (schema.get("properties") or {}).items():
            found.append(SchemaField(name, _type_of(sub)))
            walk(sub, depth + 1)

    walk(tool.returns, 0)
    return found


def param_fields(tool: Tool) -> list[SchemaField]:
    params = tool.function.parameters
    required = set(params.get("required") or [])
    return [SchemaField(n, _type_of(s), n in required) for n, s in (params.get("properties") or {}).items()]


@functools.lru_cache(maxsize=65536)
def id_like(name: str) -> bool:
    return bool(_ID_LIKE.search(humanize(name).replace(" ", "_")))


def _types_compatible(out: str | None, param: str | None, name: str) -> bool:
    if out is None or param is None or out == param:
        return True
    if {out, param} == {"integer", "number"}:
        return True
    return id_like(name) and {out, param} <= {"string", "integer", "number"}


# --------------------------------------------------------------------------- data-flow edges
@dataclass(frozen=True)
class Edge:
    src: str
    dst: str
    weight: float
    origin: str
    evidence: str


Similarity = Callable[[list[str], list[str]], Any]


def _embedding_similarity(a: list[str], b: list[str]) -> Any:
    from arenaforge.tasks.embeddings import similarity

    return similarity(a, b)


def dataflow_edges(tools: Sequence[Tool], threshold: float = 0.6, similarity: Similarity | None = None) -> list[Edge]:
    """Edges a -> b where an output of a can fill a parameter of b (name, type, embedding similarity)."""
    outs = {t.function.name: output_fields(t) for t in tools}
    params = {t.function.name: param_fields(t) for t in tools}
    desc_words = {t.function.name: " " + humanize(t.function.description) + " " for t in tools}
    sim_index: dict[tuple[str, str], float] = {}
    if similarity is not None:
        out_words = sorted({f.words for fs in outs.values() for f in fs if f.words})
        par_words = sorted({f.words for fs in params.values() for f in fs if f.words})
        if out_words and par_words:
            matrix = similarity(out_words, par_words)
            for i, ow in enumerate(out_words):
                for j, pw in enumerate(par_words):
                    if matrix[i][j] >= threshold:
                        sim_index[(ow, pw)] = float(matrix[i][j])
    edges = []
    for a in tools:
        an = a.function.name
        a_outs = outs[an]
        a_norm = {_norm(f.name): f for f in a_outs}
        for b in tools:
            bn = b.function.name
            if an == bn:
                continue
            best: tuple[float, str] | None = None
            for p in params[bn]:
                score, why = 0.0, ""
                hit = a_norm.get(_norm(p.name))
                if hit is not None and _types_compatible(hit.type, p.type, p.name):
                    score, why = 1.0, f"{hit.name} -> {p.name} (name)"
                elif a_outs and not id_like(p.name):  # ids of different entities are never interchangeable
                    for f in a_outs:
                        s = sim_index.get((f.words, p.words))
                        if s is not None and s > score and _types_compatible(f.type, p.type, p.name):
                            score, why = s, f"{f.name} -> {p.name} (embedding {s:.2f})"
                elif p.words and len(p.words) > 3 and p.words not in _STOP and f" {p.words} " in desc_words[an]:
                    score, why = 0.7, f"description of {an} mentions {p.words!r} -> {p.name}"
                if score and p.required:
                    score = min(1.0, score + 0.1)  # feeding a required parameter is stronger evidence
                if score and (best is None or score > best[0]):
                    best = (score, why)
            if best is not None:
                edges.append(Edge(an, bn, round(min(best[0], 1.0), 4), "dataflow", best[1]))
    return edges


# --------------------------------------------------------------------------- backends: edge proposers
class EdgeProposer(Protocol):
    async def propose(self, server: Server, tools: Sequence[Tool]) -> tuple[list[Edge], list[Rejection]]: ...


class DataflowProposer:
    """Offline: data-flow matching only."""

    def __init__(self, cfg: SftConfig) -> None:
        self.cfg = cfg
        self.similarity = _embedding_similarity if cfg.use_embeddings else None

    async def propose(self, server: Server, tools: Sequence[Tool]) -> tuple[list[Edge], list[Rejection]]:
        return dataflow_edges(tools, self.cfg.embedding_threshold, self.similarity), []


CHAINS_SCHEMA = {
    "type": "object",
    "properties": {"chains": {"type": "array", "items": {"type": "array", "items": {"type": "string"}, "minItems": 2}}},
    "required": ["chains"],
}


class ModelProposer:
    """openai: data-flow edges plus the consecutive pairs of chains the model proposes."""

    def __init__(self, cfg: SftConfig, model: ChatModel) -> None:
        self.dataflow = DataflowProposer(cfg)
        self.model = model
        self.prompt = load_prompt("sft_propose_chains")

    async def propose(self, server: Server, tools: Sequence[Tool]) -> tuple[list[Edge], list[Rejection]]:
        edges, _ = await self.dataflow.propose(server, tools)
        names = {t.function.name for t in tools}
        text = self.prompt.render(server=server.name, description=server.description or server.title,
                                  tools=_tool_lines(tools))
        try:
            answer = await complete_json(self.model, "propose_chains", [{"role": "user", "content": text}], CHAINS_SCHEMA)
        except (ParseError, ProviderError) as err:
            return edges, [Rejection(stage="graph", subject=server.name, reason="model_failed", detail=str(err))]
        pairs: dict[tuple[str, str], int] = {}
        unknown = []
        for chain in answer["chains"]:
            if not set(chain) <= names:
                unknown.append(chain)
                continue
            for a, b in zip(chain, chain[1:], strict=False):
                if a != b:
                    pairs[(a, b)] = pairs.get((a, b), 0) + 1
        rejections = [Rejection(stage="graph", subject=server.name, reason="unknown_tool_in_chain",
                                detail=f"proposed chain names tools the server lacks: {c}", payload=c) for c in unknown]
        by_pair = {(e.src, e.dst): e for e in edges}
        for (a, b), n in pairs.items():
            old = by_pair.get((a, b))
            weight = min(1.0, 0.6 + 0.2 * n)
            if old is None:
                by_pair[(a, b)] = Edge(a, b, weight, "model", f"proposed in {n} chain(s)")
            else:
                by_pair[(a, b)] = Edge(a, b, max(old.weight, weight), "both", f"{old.evidence}; proposed in {n} chain(s)")
        return list(by_pair.values()), rejections


def _tool_lines(tools: Sequence[Tool]) -> str:
    lines = []
    for t in tools:
        params = ", ".join(f"{f.name}{'*' if f.required else ''}: {f.type or 'any'}" for f in param_fields(t))
        outs = ", ".join(f.name for f in output_fields(t)[:8])
        lines.append(f"- {t.function.name}({params}) -> {outs or 'see description'}: {t.function.description[:200]}")
    return "\n".join(lines)


# --------------------------------------------------------------------------- storage
_EDGE_COLUMNS = [("server", "VARCHAR"), ("src", "VARCHAR"), ("dst", "VARCHAR"), ("weight", "DOUBLE"),
                 ("origin", "VARCHAR"), ("evidence", "VARCHAR")]


def save_edges(wh: Warehouse, edges_by_server: dict[str, list[Edge]]) -> int:
    """Replace the edges of these servers (keeping the `uses` of edges that survive); one transaction."""
    rows = [(s, e.src, e.dst, e.weight, e.origin, e.evidence) for s, edges in edges_by_server.items() for e in edges]
    with wh.transaction() as con:
        con.execute(f"CREATE TEMP TABLE _servers AS SELECT * FROM {column_rows(_EDGE_COLUMNS[:1])}", [list(edges_by_server)])
        con.execute(f"CREATE TEMP TABLE _edges AS SELECT * FROM {column_rows(_EDGE_COLUMNS)}",
                    column_lists(rows, len(_EDGE_COLUMNS)))
        con.execute("DELETE FROM graph_edges WHERE server IN (SELECT server FROM _servers) "
                    "AND (server, src, dst) NOT IN (SELECT server, src, dst FROM _edges)")
        con.execute(  # MERGE, not ON CONFLICT: a DuckLake warehouse has no primary keys
            "MERGE INTO graph_edges g USING _edges e ON g.server = e.server AND g.src = e.src AND g.dst = e.dst "
            "WHEN MATCHED THEN UPDATE SET weight = e.weight, origin = e.origin, evidence = e.evidence, updated_at = now() "
            "WHEN NOT MATCHED THEN INSERT (server, src, dst, weight, uses, origin, evidence) "
            "VALUES (e.server, e.src, e.dst, e.weight, 0, e.origin, e.evidence)")
        con.execute("DROP TABLE _edges")
        con.execute("DROP TABLE _servers")
    return len(rows)


def record_uses(wh: Warehouse, walked: Sequence[tuple[str, str, str]]) -> int:
    """Add one use per (server, src, dst) walked by a synthesized trajectory; one transaction."""
    counts: dict[tuple[str, str, str], int] = {}
    for key in walked:
        counts[key] = counts.get(key, 0) + 1
    if not counts:
        return 0
    uses = [("server", "VARCHAR"), ("src", "VARCHAR"), ("dst", "VARCHAR"), ("n", "BIGINT")]
    with wh.transaction() as con:
        con.execute(f"UPDATE graph_edges SET uses = graph_edges.uses + u.n, updated_at = now() FROM {column_rows(uses)} u "
                    "WHERE graph_edges.server = u.server AND graph_edges.src = u.src AND graph_edges.dst = u.dst",
                    column_lists([(*k, n) for k, n in counts.items()], len(uses)))
    return sum(counts.values())


def load_servers(wh: Warehouse, names: Sequence[str] | None = None) -> tuple[list[Server], dict[str, list[Tool]]]:
    """Servers (latest record per name) and their tools, in two queries."""
    servers: dict[str, Server] = {}
    where, params = ("record->>'name' = ANY(?)", [list(names)]) if names else ("", [])
    for s in wh.load(Server, where=where, params=params):
        servers[s.name] = s
    if names:
        missing = sorted(set(names) - set(servers))
        if missing:
            raise InputError(f"unknown server(s): {', '.join(missing)}; see `arenaforge db show v_servers`")
    tools: dict[str, dict[str, Tool]] = {n: {} for n in servers}
    where, params = ("record->>'server' = ANY(?)", [list(names)]) if names else ("", [])
    for t in wh.load(Tool, where=where, params=params):
        if t.server in servers and t.function.name in servers[t.server].tool_names:
            tools[t.server][t.function.name] = t
    return list(servers.values()), {n: [ts[k] for k in sorted(ts)] for n, ts in tools.items()}


def load_graphs(wh: Warehouse, servers: Sequence[Server]) -> dict[str, nx.DiGraph]:
    """One DiGraph per server: every tool a node, stored edges with weight/uses/origin."""
    graphs = {}
    for s in servers:
        g = nx.DiGraph(server=s.name)
        g.add_nodes_from(s.tool_names)
        graphs[s.name] = g
    _, rows = wh.query("SELECT server, src, dst, weight, uses, origin, evidence FROM graph_edges")
    for server, src, dst, weight, uses, origin, evidence in rows:
        g = graphs.get(server)
        if g is not None and src in g and dst in g:
            g.add_edge(src, dst, weight=weight, uses=uses, origin=origin, evidence=evidence)
    return graphs


def build_graph(tools: Sequence[Tool], edges: Sequence[Edge]) -> nx.DiGraph:
    g = nx.DiGraph()
    g.add_nodes_from(t.function.name for t in tools)
    for e in edges:
        g.add_edge(e.src, e.dst, weight=e.weight, uses=0, origin=e.origin, evidence=e.evidence)
    return g


# --------------------------------------------------------------------------- walks
def sample_walk(g: nx.DiGraph, rng: random.Random, min_len: int, max_len: int) -> list[str]:
    """One acyclic walk of length in [1, max_len] (aiming at a uniform target in [min_len, max_len]).

    Next tool ~ weight / (1 + uses); the walk's edges get a provisional use at once, so later
    walks in the same run also spread over the graph.
    """
    nodes = sorted(g.nodes)
    if not nodes:
        return []
    target = rng.randint(min_len, max(min_len, max_len))
    if target > 1:
        starts = [n for n in nodes if g.out_degree(n) > 0]
        if starts:
            weights = [sum(_pick_weight(g, n, s) for s in g.successors(n)) for n in starts]
            current = rng.choices(starts, weights=weights)[0]
        else:
            current = rng.choice(nodes)
    else:
        current = rng.choice(nodes)
    path = [current]
    while len(path) < target:
        options = sorted(s for s in g.successors(current) if s not in path)
        if not options:
            break
        nxt = rng.choices(options, weights=[_pick_weight(g, current, s) for s in options])[0]
        g[current][nxt]["uses"] = g[current][nxt].get("uses", 0) + 1
        path.append(nxt)
        current = nxt
    return path


def _pick_weight(g: nx.DiGraph, a: str, b: str) -> float:
    data = g[a][b]
    return max(float(data.get("weight", 1.0)), 1e-3) / (1.0 + float(data.get("uses", 0)))


def server_rng(seed: int, server: str, salt: str = "") -> random.Random:
    from arenaforge.schemas.ids import sha256_hex

    return random.Random(int(sha256_hex(f"{seed}:{server}:{salt}")[:16], 16))


# --------------------------------------------------------------------------- verification
def satisfiable(chain: Sequence[Tool], g: nx.DiGraph | None = None) -> list[str]:
    """Why the chain is not executable from the task plus earlier outputs ([] when it is)."""
    reasons = []
    produced: set[str] = set()
    described = ""
    for i, tool in enumerate(chain):
        name = tool.function.name
        if g is not None and i > 0 and not g.has_edge(chain[i - 1].function.name, name):
            reasons.append(f"{chain[i - 1].function.name} -> {name}: not an edge of the graph")
        for p in param_fields(tool):
            if not p.required or i == 0 or not id_like(p.name):
                continue  # the first call's values and user-known values come from the task
            if _norm(p.name) in produced or (not produced and f" {p.words} " in described):
                continue
            reasons.append(f"{name}.{p.name}: no earlier call returns it and the user cannot know it")
        produced |= {_norm(f.name) for f in output_fields(tool)}
        described += " " + humanize(tool.function.description) + " "
    return reasons


class ChainVerifier(Protocol):
    async def verify(self, server: Server, chain: Sequence[Tool], g: nx.DiGraph,
                     tools: Sequence[Tool] = ()) -> tuple[bool, list[str]]: ...


class RuleVerifier:
    async def verify(self, server: Server, chain: Sequence[Tool], g: nx.DiGraph,
                     tools: Sequence[Tool] = ()) -> tuple[bool, list[str]]:
        reasons = satisfiable(chain, g)
        return not reasons, reasons


VOTE_SCHEMA = {"type": "object", "properties": {"valid": {"type": "boolean"}, "reason": {"type": "string"}},
               "required": ["valid"]}
QUERY_SCHEMA = {"type": "object", "properties": {"query": {"type": "string", "minLength": 1}}, "required": ["query"]}
PLAN_SCHEMA = {"type": "object", "properties": {"tools": {"type": "array", "items": {"type": "string"}}},
               "required": ["tools"]}


class VoteVerifier:
    """openai: majority of `votes` judges, then back-translation chain -> query -> chain must round-trip."""

    def __init__(self, cfg: SftConfig, model: ChatModel) -> None:
        self.votes = cfg.verify_votes
        self.model = model
        self.vote_prompt = load_prompt("sft_verify_chain")
        self.query_prompt = load_prompt("sft_chain_to_query")
        self.plan_prompt = load_prompt("sft_query_to_chain")

    async def verify(self, server: Server, chain: Sequence[Tool], g: nx.DiGraph,
                     tools: Sequence[Tool] = ()) -> tuple[bool, list[str]]:
        names = [t.function.name for t in chain]
        tools_text = _tool_lines(chain)
        try:
            ballots = await asyncio.gather(*[
                complete_json(self.model, "verify_chain", [{"role": "user", "content": self.vote_prompt.render(
                    server=server.name, tools=tools_text, chain=" -> ".join(names), judge=i + 1)}], VOTE_SCHEMA)
                for i in range(self.votes)])
            yes = sum(1 for b in ballots if b["valid"])
            reasons = [f"vote: {b.get('reason', '')}" for b in ballots if not b["valid"]]
            if yes * 2 <= self.votes:
                return False, [f"majority vote rejected the chain ({yes}/{self.votes})", *reasons]
            query = await complete_json(self.model, "chain_to_query", [{"role": "user", "content": self.query_prompt.render(
                server=server.name, tools=tools_text, chain=" -> ".join(names))}], QUERY_SCHEMA)
            all_tools = _tool_lines(tools or chain)  # the planner chooses among every tool of the server
            plan = await complete_json(self.model, "query_to_chain", [{"role": "user", "content": self.plan_prompt.render(
                server=server.name, tools=all_tools, query=query["query"])}], PLAN_SCHEMA)
        except (ParseError, ProviderError) as err:
            return False, [f"model failed: {err}"]
        if plan["tools"] != names:
            return False, [f"back-translation returned {plan['tools']} instead of {names}"]
        return True, []


# --------------------------------------------------------------------------- the stage functions
def graph_backends(cfg: Config, model: ChatModel | None) -> tuple[EdgeProposer, ChainVerifier]:
    proposers: dict[str, Callable[[], EdgeProposer]] = {
        "offline": lambda: DataflowProposer(cfg.sft),
        "openai": lambda: ModelProposer(cfg.sft, _need(model)),
    }
    verifiers: dict[str, Callable[[], ChainVerifier]] = {
        "offline": lambda: RuleVerifier(),
        "openai": lambda: VoteVerifier(cfg.sft, _need(model)),
    }
    return proposers[cfg.model.backend](), verifiers[cfg.model.backend]()


def _need(model: ChatModel | None) -> ChatModel:
    if model is None:
        raise ProviderError("the openai backend needs a chat model")
    return model


async def propose_edges(servers: Sequence[Server], tools: dict[str, list[Tool]], proposer: EdgeProposer
                        ) -> tuple[dict[str, list[Edge]], list[Rejection]]:
    results = await asyncio.gather(*[proposer.propose(s, tools.get(s.name, [])) for s in servers])
    edges = {s.name: e for s, (e, _) in zip(servers, results, strict=True)}
    return edges, [r for _, rs in results for r in rs]


@dataclass
class ChainBatch:
    chains: list[ToolChain] = field(default_factory=list)
    rejections: list[Rejection] = field(default_factory=list)


async def sample_chains(servers: Sequence[Server], tools: dict[str, list[Tool]], graphs: dict[str, nx.DiGraph],
                        verifier: ChainVerifier, cfg: SftConfig, seed: int, run_id: str | None,
                        provenance: Provenance) -> ChainBatch:
    """`chains_per_server` seeded walks per server, deduplicated and verified (failures kept, verified=False)."""
    batch = ChainBatch()
    jobs = []
    for s in servers:
        g = graphs[s.name]
        by_name = {t.function.name: t for t in tools.get(s.name, [])}
        if not by_name:
            continue
        rng = server_rng(seed, s.name, "walk")
        seen: set[tuple[str, ...]] = set()
        for _ in range(cfg.chains_per_server):
            walk = tuple(sample_walk(g, rng, cfg.chain_min_len, cfg.chain_max_len))
            if walk and walk not in seen and all(n in by_name for n in walk):
                seen.add(walk)
                jobs.append((s, [by_name[n] for n in walk], g))
    verdicts = await asyncio.gather(*[verifier.verify(s, chain, g, tools.get(s.name, [])) for s, chain, g in jobs])
    for (s, chain, _), (ok, reasons) in zip(jobs, verdicts, strict=True):
        record = ToolChain(server=s.name, tools=[t.function.name for t in chain], verified=ok, reasons=reasons,
                           parents=[t.id for t in chain], run_id=run_id, provenance=provenance)
        batch.chains.append(record)
        if not ok:
            batch.rejections.append(Rejection(stage="verify_chain", subject=record.id, reason="chain_unverified",
                                              detail="; ".join(reasons)[:1000], payload=record.tools, run_id=run_id))
    return batch


# --------------------------------------------------------------------------- drawing
def draw_graph(g: nx.DiGraph, path: Path, title: str | None = None) -> Path:
    """PNG of the graph: edge width ~ weight, label = uses."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    n = max(g.number_of_nodes(), 1)
    fig, ax = plt.subplots(figsize=(min(4 + n * 0.6, 24), min(3 + n * 0.45, 18)))
    pos = nx.spring_layout(g, seed=0, k=1.5 / max(n, 1) ** 0.5) if n > 1 else {v: (0.0, 0.0) for v in g.nodes}
    widths = [0.5 + 2.5 * float(d.get("weight", 0.5)) for _, _, d in g.edges(data=True)]
    nx.draw_networkx_nodes(g, pos, ax=ax, node_color="#9ecae1", node_size=900)
    nx.draw_networkx_labels(g, pos, ax=ax, font_size=8)
    nx.draw_networkx_edges(g, pos, ax=ax, width=widths, arrows=True, arrowsize=14, edge_color="#555555",
                           connectionstyle="arc3,rad=0.08", node_size=900)
    nx.draw_networkx_edge_labels(g, pos, ax=ax, font_size=7,
                                 edge_labels={(a, b): str(d.get("uses", 0)) for a, b, d in g.edges(data=True)})
    ax.set_title(title or f"{g.graph.get('server', '')}: {g.number_of_nodes()} tools, {g.number_of_edges()} edges "
                 "(width = weight, label = uses)")
    ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
