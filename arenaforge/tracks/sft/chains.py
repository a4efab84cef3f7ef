"""The model-driven steps of the tool-call graph: edge proposal and chain verification (ASTRA §1a.2).

`EdgeProposer`: a server's data-flow edges plus the consecutive pairs of the chains the run's model
proposes. `ChainVerifier`: a majority of `verify_votes` judges must accept a sampled chain, and a
back-translation (chain -> task -> chain) must return it unchanged. `sample_chains` draws the weighted,
bounded walks (`tool_graph.sample_walk`) and keeps every chain with its verdict.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

import networkx as nx

from arenaforge.schemas.base import Provenance
from arenaforge.schemas.config import SftConfig
from arenaforge.schemas.errors import ParseError, ProviderError
from arenaforge.schemas.models import Rejection, Server, Tool, ToolChain
from arenaforge.services.models import ChatModel, Step, complete_json, reads_prompts
from arenaforge.tracks.sft.prompts import load_prompt
from arenaforge.tracks.sft.tool_graph import (
    Edge,
    dataflow_edges,
    embedding_similarity,
    sample_walk,
    satisfiable,
    server_rng,
    tool_lines,
)


def _offline_rules() -> ModuleType:
    from arenaforge.tracks.sft import offline_graph  # its rules read this module's types: loaded after it

    return offline_graph


# --------------------------------------------------------------------------- edge proposal
CHAINS_SCHEMA = {
    "type": "object",
    "properties": {"chains": {"type": "array", "items": {"type": "array", "items": {"type": "string"}, "minItems": 2}}},
    "required": ["chains"],
}


PROPOSE_CHAINS = Step("sft.propose_chains", prompt="sft_propose_chains", schema=CHAINS_SCHEMA, max_tokens=300,
                      offline=lambda: _offline_rules().propose_chains)


def with_tool_names(schema: dict[str, Any], names: Sequence[str]) -> dict[str, Any]:
    """`schema` with every list of tool names an enum of `names`: a model that decodes under the schema (llama.cpp,
    vLLM's structured outputs) can only name tools the server has; bounded lists keep a small model from looping."""
    def names_list(lists: dict[str, Any]) -> dict[str, Any]:
        return {**lists, "items": {"enum": sorted(set(names))}, "maxItems": 16}

    props = dict(schema["properties"])
    if "chains" in props:
        props["chains"] = {**props["chains"], "items": names_list(props["chains"]["items"]), "maxItems": 4}
    if "tools" in props:
        props["tools"] = names_list(props["tools"])
    return {**schema, "properties": props}


@dataclass(frozen=True)
class ServerTools:
    """A server and its tools: what the graph prompts are rendered from."""

    server: Server
    tools: tuple[Tool, ...]


class EdgeProposer:
    """Data-flow edges plus the consecutive pairs of the chains the run's model proposes."""

    def __init__(self, cfg: SftConfig, model: ChatModel) -> None:
        self.cfg = cfg
        self.model = model
        self.similarity = embedding_similarity if cfg.use_embeddings else None
        self.prompt = load_prompt(PROPOSE_CHAINS.prompt)

    async def propose(self, server: Server, tools: Sequence[Tool]) -> tuple[list[Edge], list[Rejection]]:
        edges = dataflow_edges(tools, self.cfg.embedding_threshold, self.similarity)
        names = {t.function.name for t in tools}
        try:
            answer = await complete_json(self.model, PROPOSE_CHAINS, lambda: self.prompt.render(
                server=server.name, description=server.description or server.title, tools=tool_lines(tools)),
                with_tool_names(CHAINS_SCHEMA, sorted(names)), inputs=ServerTools(server, tuple(tools)))
        except (ParseError, ProviderError) as err:
            return edges, [Rejection.of_error("graph", server.name, err)]
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



VOTE_SCHEMA = {"type": "object",
               "properties": {"valid": {"type": "boolean"}, "reason": {"type": "string", "maxLength": 300},
                              "reasons": {"type": "array", "items": {"type": "string", "maxLength": 500}}},
               "required": ["valid"]}
VERIFY_CHAIN = Step("sft.verify_chain", prompt="sft_verify_chain", schema=VOTE_SCHEMA, max_tokens=120,
                    offline=lambda: _offline_rules().verify_chain)
QUERY_SCHEMA = {"type": "object", "properties": {"query": {"type": "string", "minLength": 1, "maxLength": 500}},
                "required": ["query"]}
CHAIN_TO_QUERY = Step("sft.chain_to_query", prompt="sft_chain_to_query", schema=QUERY_SCHEMA, max_tokens=200,
                      offline=lambda: _offline_rules().chain_to_query)
PLAN_SCHEMA = {"type": "object", "properties": {"tools": {"type": "array", "items": {"type": "string"}}},
               "required": ["tools"]}
QUERY_TO_CHAIN = Step("sft.query_to_chain", prompt="sft_query_to_chain", schema=PLAN_SCHEMA, max_tokens=150,
                      offline=lambda: _offline_rules().query_to_chain)


@dataclass(frozen=True)
class ChainInputs:
    """What the chain-verification prompts are rendered from."""

    server: Server
    chain: tuple[Tool, ...]
    graph: nx.DiGraph
    tools: tuple[Tool, ...]  # every tool of the server (the back-translation planner chooses among them)


@dataclass(frozen=True)
class PlanInputs:
    """A query to plan back into a chain, and the tools to choose from."""

    server: Server
    query: str
    tools: tuple[Tool, ...]


class ChainVerifier:
    """A majority of `votes` judges, then back-translation chain -> query -> chain must round-trip."""

    def __init__(self, cfg: SftConfig, model: ChatModel) -> None:
        self.votes = cfg.verify_votes
        self.by_rules = cfg.verify_chains == "rules"
        self.model = model
        self.vote_prompt = load_prompt(VERIFY_CHAIN.prompt)
        self.query_prompt = load_prompt(CHAIN_TO_QUERY.prompt)
        self.plan_prompt = load_prompt(QUERY_TO_CHAIN.prompt)

    async def verify(self, server: Server, chain: Sequence[Tool], g: nx.DiGraph,
                     tools: Sequence[Tool] = ()) -> tuple[bool, list[str]]:
        names = [t.function.name for t in chain]
        if self.by_rules:
            reasons = satisfiable(chain, g)
            return not reasons, reasons
        tools_text = functools.cache(lambda: tool_lines(chain))
        inputs = ChainInputs(server, tuple(chain), g, tuple(tools or chain))
        # rules give every judge the same verdict, so one ballot stands for them all (and costs no task per vote)
        votes = self.votes if reads_prompts(self.model) else 1

        def ballot(judge: int) -> Awaitable[Any]:
            return complete_json(self.model, VERIFY_CHAIN, lambda: self.vote_prompt.render(
                server=server.name, tools=tools_text(), chain=" -> ".join(names), judge=judge), inputs=inputs)

        try:
            ballots = [await ballot(1)] if votes == 1 else await asyncio.gather(*[ballot(i + 1) for i in range(votes)])
            yes = sum(1 for b in ballots if b["valid"])
            if yes * 2 <= votes:
                reasons: list[str] = []
                for b in ballots:
                    if not b["valid"]:
                        for why in b.get("reasons") or [b.get("reason") or "rejected by a judge"]:
                            if why not in reasons:
                                reasons.append(why)
                return False, reasons
            query = await complete_json(self.model, CHAIN_TO_QUERY, lambda: self.query_prompt.render(
                server=server.name, tools=tools_text(), chain=" -> ".join(names)), inputs=inputs)
            plan = await complete_json(self.model, QUERY_TO_CHAIN, lambda: self.plan_prompt.render(
                server=server.name, tools=tool_lines(tools or chain), query=query["query"]),  # among every tool
                with_tool_names(PLAN_SCHEMA, [t.function.name for t in tools or chain]),
                inputs=PlanInputs(server, query["query"], tuple(tools or chain)))
        except (ParseError, ProviderError) as err:
            return False, [f"model failed: {err}"]
        if plan["tools"] != names:
            return False, [f"back-translation returned {plan['tools']} instead of {names}"]
        return True, []



# --------------------------------------------------------------------------- the stage functions
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
