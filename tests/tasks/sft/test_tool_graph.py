"""Tool-call graphs: data-flow edges, weighted bounded acyclic walks, edge-use feedback, verification, drawing."""

from __future__ import annotations

import asyncio
import gc
import random
from collections import Counter
from importlib import resources
from pathlib import Path

import networkx as nx
import pytest

from arenaforge.schemas.config import Config, ModelConfig, SftConfig
from arenaforge.schemas.models import FunctionDoc, Tool
from arenaforge.tracks.sft import chains, tool_graph
from arenaforge.tracks.sft import stages as sft_stages
from arenaforge.tracks.sft.ingest_tools import ingest_paths
from tests.support.models import run_stage

SAMPLE = Path(str(resources.files("arenaforge.data").joinpath("sample_tools")))


@pytest.fixture(scope="module")
def corpus():
    result = ingest_paths([SAMPLE], SftConfig())
    tools: dict[str, list[Tool]] = {}
    for t in result.tools:
        tools.setdefault(t.server, []).append(t)
    return {s.name: s for s in result.servers}, tools


def _pairs(edges):
    return {(e.src, e.dst) for e in edges}


def test_dataflow_edges_match_outputs_to_parameters_by_name_and_description(corpus):
    _, tools = corpus
    shop = _pairs(tool_graph.dataflow_edges(tools["shop"]))
    assert {("search_products", "get_product"), ("get_product", "add_to_cart"), ("add_to_cart", "checkout"),
            ("checkout", "track_order")} <= shop
    assert ("track_order", "search_products") not in shop
    notes = tool_graph.dataflow_edges(tools["notes"])  # no response schemas: the description says "note id"
    assert _pairs(notes) == {("create_note", "share_note")} and "description" in notes[0].evidence


def test_field_caches_hold_only_values_the_garbage_collector_skips(corpus):
    # a 10,000-tool run keeps ~70,000 cached fields: tracked, every full collection walked them all again
    _, tools = corpus
    tool = next(t for t in tools["shop"] if t.function.name == "get_product")
    fields = tool_graph.param_fields(tool)
    assert fields == tool_graph.param_fields(tool) and fields[0].name and fields[0].words
    assert [f.name for f in tool_graph.output_fields(tool)] == [f.name for f in tool_graph._output_fields(tool)]
    gc.collect()  # a collection untracks tuples of untracked values: the fields first, their tuple on the next
    gc.collect()
    cached = [tool_graph._PARAM_FIELDS[tool.id], tool_graph._OUTPUT_FIELDS[tool.id]]
    assert cached[1] and not any(gc.is_tracked(x) for c in cached for x in (c, *c))


def test_embedding_similarity_links_related_names_but_never_different_ids():
    def tool(name, params, returns):
        return Tool(server="s", source="openai", function=FunctionDoc(
            name=name, description=f"{name} tool", parameters={"type": "object", "properties": params,
                                                               "required": list(params)}), returns=returns)

    a = tool("locate", {"q": {"type": "string"}}, {"type": "object", "properties": {
        "town": {"type": "string"}, "cart_id": {"type": "string"}}})
    b = tool("forecast", {"city": {"type": "string"}}, None)
    c = tool("pay", {"order_id": {"type": "string"}}, None)
    edges = tool_graph.dataflow_edges([a, b, c], threshold=0.6, similarity=tool_graph.embedding_similarity)
    assert _pairs(edges) == {("locate", "forecast")}
    assert "embedding" in edges[0].evidence


def test_walks_are_seeded_bounded_acyclic_and_prefer_unused_edges():
    g = nx.DiGraph()
    g.add_edge("a", "b", weight=1.0, uses=0)
    g.add_edge("a", "c", weight=1.0, uses=50)
    g.add_edge("b", "c", weight=1.0, uses=0)
    g.add_edge("c", "a", weight=1.0, uses=0)
    walks = [tool_graph.sample_walk(g.copy(), random.Random(7), 2, 3) for _ in range(3)]
    assert walks[0] == walks[1] == walks[2]
    rng = random.Random(1)
    firsts = Counter()
    for _ in range(300):
        h = g.copy()
        walk = tool_graph.sample_walk(h, rng, 1, 3)
        assert 1 <= len(walk) <= 3 and len(set(walk)) == len(walk)
        assert all(g.has_edge(x, y) for x, y in zip(walk, walk[1:]))
        if walk[0] == "a" and len(walk) > 1:
            firsts[walk[1]] += 1
    assert firsts["b"] > 10 * max(firsts["c"], 1) / 2  # the heavily used edge a->c is rarely taken


def test_offline_verification_needs_every_required_id_from_an_earlier_output(corpus):
    _, tools = corpus
    by = {t.function.name: t for t in tools["shop"]}
    g = tool_graph.build_graph(tools["shop"], tool_graph.dataflow_edges(tools["shop"]))
    assert tool_graph.satisfiable([by["search_products"], by["add_to_cart"], by["checkout"]], g) == []
    reasons = tool_graph.satisfiable([by["get_product"], by["checkout"]], g)
    assert any("checkout.cart_id" in r for r in reasons)


def test_edges_and_uses_persist_and_feed_back(tmp_warehouse, corpus):
    servers, tools = corpus
    tmp_warehouse.upsert([*servers.values(), *[t for ts in tools.values() for t in ts]])
    cfg = Config(sft=SftConfig(use_embeddings=False, chains_per_server=6))
    counts = run_stage(sft_stages.build_graphs, cfg, tmp_warehouse, "run-g")
    assert counts["servers"] == 4 and counts["edges"] >= 6
    _, rows = tmp_warehouse.query("SELECT src, dst, uses, origin FROM graph_edges WHERE server = 'shop' ORDER BY 1, 2")
    assert ("checkout", "track_order", 0, "dataflow") in rows
    tool_graph.record_uses(tmp_warehouse, [("shop", "checkout", "track_order")] * 3)
    run_stage(sft_stages.build_graphs, cfg, tmp_warehouse, "run-g2")  # rebuilding keeps what was walked
    _, rows = tmp_warehouse.query("SELECT uses FROM graph_edges WHERE server='shop' AND src='checkout' AND dst='track_order'")
    assert rows == [(3,)]
    ids, c = run_stage(sft_stages.sample_chains, cfg, tmp_warehouse, "run-g3", seed=3)
    again, _ = run_stage(sft_stages.sample_chains, cfg, tmp_warehouse, "run-g4", seed=3)
    assert ids == again and c["verified_chains"] == len(ids) > 0 and c["chains"] >= c["verified_chains"]
    _, rows = tmp_warehouse.query("SELECT count(*) FROM v_tool_chains WHERE NOT verified")
    _, rej = tmp_warehouse.query("SELECT count(*) FROM rejections WHERE record->>'reason' = 'chain_unverified'")
    assert rows == rej


def test_graph_png_is_drawn(tmp_path, corpus):
    _, tools = corpus
    g = tool_graph.build_graph(tools["calendar"], tool_graph.dataflow_edges(tools["calendar"]))
    path = tool_graph.draw_graph(g, tmp_path / "g.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 5000


def test_openai_graph_proposes_and_verifies_with_votes_and_back_translation(scripted_openai, corpus):
    from tests.tasks.sft_responder import SftResponder

    servers, tools = corpus
    responder = SftResponder()
    scripted_openai.responder = responder
    cfg = Config(model=ModelConfig(backend="openai", base_url=scripted_openai.url, model="scripted", cache=False),
                 sft=SftConfig(use_embeddings=False, verify_votes=3))
    from tests.support.models import http_model as chat_model

    with chat_model(cfg.model) as model:
        proposer, verifier = chains.EdgeProposer(cfg.sft, model), chains.ChainVerifier(cfg.sft, model)
        edges, rejections = asyncio.run(proposer.propose(servers["weather"], tools["weather"]))
        assert rejections == []
        pairs = {(e.src, e.dst): e.origin for e in edges}
        assert pairs[("geocode_city", "get_air_quality")] == "both"
        assert pairs[("get_air_quality", "get_forecast")] == "model"
        g = tool_graph.build_graph(tools["weather"], edges)
        by = {t.function.name: t for t in tools["weather"]}
        ok, reasons = asyncio.run(verifier.verify(servers["weather"], [by["geocode_city"], by["get_forecast"]], g, tools["weather"]))
        assert ok and reasons == []
        responder.reject_chains = True
        ok, reasons = asyncio.run(verifier.verify(servers["weather"], [by["geocode_city"], by["get_forecast"]], g, tools["weather"]))
        assert not ok and reasons == ["each input comes from the user or an earlier output"]  # the judges' reason
    steps = Counter(r["response_format"]["json_schema"]["name"] for r in scripted_openai.chat_requests())
    assert steps == {"sft_propose_chains": 1, "sft_verify_chain": 6, "sft_chain_to_query": 1, "sft_query_to_chain": 1}


class _Observed:
    """The offline provider, with the steps it was asked for written down."""

    def __init__(self) -> None:
        from tests.support.models import offline_model

        self.inner = offline_model()
        self.name, self.kind, self.decides_by = self.inner.name, self.inner.kind, self.inner.decides_by
        self.steps: list[str] = []
        self.prompts: list[list[dict]] = []

    async def complete(self, request):
        self.steps.append(request.step)
        self.prompts.append(request.messages)
        return await self.inner.complete(request)


def test_rules_verify_a_chain_with_one_ballot_and_no_rendered_prompt(corpus):
    servers, tools = corpus
    by = {t.function.name: t for t in tools["shop"]}
    g = tool_graph.build_graph(tools["shop"], tool_graph.dataflow_edges(tools["shop"]))
    model = _Observed()
    verifier = chains.ChainVerifier(SftConfig(verify_votes=3), model)
    good = [by["search_products"], by["add_to_cart"], by["checkout"]]
    assert asyncio.run(verifier.verify(servers["shop"], good, g, tools["shop"])) == (True, [])
    ok, reasons = asyncio.run(verifier.verify(servers["shop"], [by["get_product"], by["checkout"]], g, tools["shop"]))
    assert not ok and any("checkout.cart_id" in r for r in reasons)
    # every judge applies the same rules: one ballot stands for the three; rules read inputs, never prompt text
    assert Counter(model.steps) == {chains.VERIFY_CHAIN.name: 2, chains.CHAIN_TO_QUERY.name: 1,
                                   chains.QUERY_TO_CHAIN.name: 1}
    assert model.prompts == [[]] * 4
