"""Tool-call transition graphs per server and weighted bounded walks (ASTRA §1a.2).

Nodes are a server's tools; a directed edge a -> b says "b may legally follow a". Edges come from
  * data flow: an output field of `a` (its response schema, else its description) feeds a parameter
    of `b`, matched by name, type and MiniLM similarity of the names;
  * model-proposed chains: consecutive pairs of the chains the run's model proposes (the offline
    provider proposes none: its edges are the data-flow ones).
Edges live in the warehouse table `graph_edges` with a `uses` count: walks pick the next tool with
probability ~ weight / (1 + uses), and every run adds the edges its trajectories walked, so rarely
used edges are sampled more on the next run. Walks are seeded, length-bounded and acyclic.

`satisfiable` says whether a chain is executable from the task plus earlier outputs (the offline
provider's chain judges use it). The model-driven steps — edge proposal, chain verification — are in
`chains.py`.
"""

from __future__ import annotations

import functools
import random
import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import networkx as nx

from arenaforge.schemas.models import Server, Tool, Trajectory
from arenaforge.warehouse import graph_edges, lookups
from arenaforge.warehouse.db import Warehouse
from arenaforge.warehouse.graph_edges import EdgeRow

_ID_LIKE = re.compile(r"(^|_)(id|ids|uuid|token|handle|cursor|key|sha|hash|ref)$")
_STOP = {"the", "a", "an", "of", "for", "and", "or", "to", "in", "on", "by", "with", "its", "it", "is", "this", "that",
         "from", "get", "gets", "set", "returns", "return", "given", "specified", "information", "details", "data"}


# --------------------------------------------------------------------------- fields
class SchemaField(NamedTuple):
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


# Derived views of a tool, keyed by its content id (the same id is the same content, so never stale); chain
# sampling and the prompts of every vote ask for them thousands of times per server. The field caches hold plain
# tuples of atoms, which the garbage collector untracks (a NamedTuple it never does): as ~7 tracked objects per
# tool they made every full collection of a 10,000-tool run walk 70,000 more objects.
_DERIVED_MAX = 65536
_OUTPUT_FIELDS: dict[str, tuple[tuple[str, str | None, bool], ...]] = {}
_PARAM_FIELDS: dict[str, tuple[tuple[str, str | None, bool], ...]] = {}
_TOOL_LINES: dict[str, str] = {}


def _remember(cache: dict[str, Any], key: str, value: Any) -> Any:
    if len(cache) >= _DERIVED_MAX:
        cache.clear()
    cache[key] = value
    return value


def output_fields(tool: Tool) -> list[SchemaField]:
    """Leaf and object fields of the tool's response schema (nested objects and array items included)."""
    hit = _OUTPUT_FIELDS.get(tool.id)
    if hit is None:
        hit = _remember(_OUTPUT_FIELDS, tool.id, tuple(map(tuple, _output_fields(tool))))
    return [SchemaField._make(f) for f in hit]


def _output_fields(tool: Tool) -> list[SchemaField]:
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
    """The tool's parameters (name, type, required), in schema order."""
    hit = _PARAM_FIELDS.get(tool.id)
    if hit is None:
        hit = _remember(_PARAM_FIELDS, tool.id, tuple(map(tuple, _param_fields(tool))))
    return [SchemaField._make(f) for f in hit]


def _param_fields(tool: Tool) -> list[SchemaField]:
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


def embedding_similarity(a: list[str], b: list[str]) -> Any:
    from arenaforge.services.embeddings import similarity

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


def tool_lines(tools: Sequence[Tool]) -> str:
    """One line per tool for a prompt: name(parameters, * = required) -> output fields: description."""
    lines = []
    for t in tools:
        line = _TOOL_LINES.get(t.id)
        if line is None:
            params = ", ".join(f"{f.name}{'*' if f.required else ''}: {f.type or 'any'}" for f in param_fields(t))
            outs = ", ".join(f.name for f in output_fields(t)[:8])
            line = _remember(_TOOL_LINES, t.id,
                             f"- {t.function.name}({params}) -> {outs or 'see description'}: {t.function.description[:200]}")
        lines.append(line)
    return "\n".join(lines)


# --------------------------------------------------------------------------- storage
def save_edges(wh: Warehouse, edges_by_server: dict[str, list[Edge]]) -> int:
    """Replace the edges of these servers (keeping the `uses` of edges that survive); one transaction."""
    rows = [EdgeRow(s, e.src, e.dst, e.weight, e.origin, e.evidence) for s, edges in edges_by_server.items() for e in edges]
    return graph_edges.replace_edges(wh, list(edges_by_server), rows)


def walked_edges(trajectories: Sequence[Trajectory]) -> list[tuple[str, str, str]]:
    """(server, src, dst) for each pair of consecutive distinct tools the trajectories called."""
    walked = []
    for t in trajectories:
        called = list(dict.fromkeys(c.function.name for m in t.messages if m.tool_calls for c in m.tool_calls))
        walked += [(t.server, a, b) for a, b in zip(called, called[1:], strict=False)]
    return walked


def record_uses(wh: Warehouse, walked: Sequence[tuple[str, str, str]]) -> int:
    """Add one use per (server, src, dst) walked by a synthesized trajectory; one transaction."""
    return graph_edges.add_uses(wh, Counter(walked))


def load_servers(wh: Warehouse, names: Sequence[str] | None = None) -> tuple[list[Server], dict[str, list[Tool]]]:
    """Servers (latest record per name) and their tools."""
    return lookups.servers_with_tools(wh, names)


def load_graphs(wh: Warehouse, servers: Sequence[Server]) -> dict[str, nx.DiGraph]:
    """One DiGraph per server: every tool a node, stored edges with weight/uses/origin."""
    graphs = {}
    for s in servers:
        g = nx.DiGraph(server=s.name)
        g.add_nodes_from(s.tool_names)
        graphs[s.name] = g
    for e in graph_edges.all_edges(wh):
        g = graphs.get(e.server)
        if g is not None and e.src in g and e.dst in g:
            g.add_edge(e.src, e.dst, weight=e.weight, uses=e.uses, origin=e.origin, evidence=e.evidence)
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
    succ = g.succ  # {node: {successor: edge data}}: the plain dicts, not a view per lookup (3,000 walks per run)
    target = rng.randint(min_len, max(min_len, max_len))
    if target > 1:
        starts = [n for n in nodes if succ[n]]
        if starts:
            weights = [sum(_pick_weight(data) for data in succ[n].values()) for n in starts]
            current = rng.choices(starts, weights=weights)[0]
        else:
            current = rng.choice(nodes)
    else:
        current = rng.choice(nodes)
    path = [current]
    while len(path) < target:
        options = sorted(s for s in succ[current] if s not in path)
        if not options:
            break
        nxt = rng.choices(options, weights=[_pick_weight(succ[current][s]) for s in options])[0]
        succ[current][nxt]["uses"] = succ[current][nxt].get("uses", 0) + 1
        path.append(nxt)
        current = nxt
    return path


def _pick_weight(data: dict[str, Any]) -> float:
    """An edge's draw weight: its weight over 1 + the walks that already used it."""
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
