"""Offline answers of the tool-graph steps: `sft.propose_chains`, `sft.verify_chain`, and the
back-translation pair `sft.chain_to_query` / `sft.query_to_chain`.

The offline provider proposes no chains of its own (a server's edges are its data-flow edges). Its chain
judges accept a chain when every required parameter is satisfiable from the task, a user-known value or an
earlier call's output (`tool_graph.satisfiable`). Back-translation writes the chain's query from the tools'
purposes, as the offline query writer does, and plans it back by finding those purposes in the query.
"""

from __future__ import annotations

import random
from typing import Any

from arenaforge.services.models import ChatRequest
from arenaforge.services.models.providers.offline import OfflineModel
from arenaforge.tracks.sft.chains import ChainInputs, PlanInputs
from arenaforge.tracks.sft.offline_agent import plan_from_query
from arenaforge.tracks.sft.offline_queries import compose
from arenaforge.tracks.sft.synthesize_queries import user_values
from arenaforge.tracks.sft.tool_graph import satisfiable


def propose_chains(request: ChatRequest, model: OfflineModel) -> dict[str, Any]:
    return {"chains": []}


def verify_chain(request: ChatRequest, model: OfflineModel) -> dict[str, Any]:
    inputs: ChainInputs = request.inputs
    reasons = satisfiable(inputs.chain, inputs.graph)
    return {"valid": not reasons, "reasons": reasons}


def chain_to_query(request: ChatRequest, model: OfflineModel) -> dict[str, Any]:
    inputs: ChainInputs = request.inputs
    rng = random.Random("/".join(t.function.name for t in inputs.chain))  # its own stream: verification draws nothing
    return {"query": compose(inputs.chain, user_values(inputs.chain, rng), rng, style=None)}


def query_to_chain(request: ChatRequest, model: OfflineModel) -> dict[str, Any]:
    inputs: PlanInputs = request.inputs
    return {"tools": [t.function.name for t in plan_from_query(inputs.query, inputs.tools)]}
