"""`sft.grounded_arguments`: the agent's identifier and number arguments are offered as the conversation's values,
and a trajectory that calls with one no message gave is not kept. The cases are the ones SmolLM2-135M produced in
`bench models --real` (docs/MODELS.md)."""

from __future__ import annotations

import json
import re
from importlib import resources

from arenaforge.schemas.config import Config, ModelConfig, SftConfig
from arenaforge.schemas.models import ChatMessage, JudgeScore, Trajectory
from arenaforge.tracks.sft import stages as sft_stages
from arenaforge.tracks.sft.grounded_arguments import grounded_tools, invented_argument
from arenaforge.tracks.sft.ingest_tools import ingest_paths
from tests.support.models import run_stage

SAMPLE = resources.files("arenaforge.data").joinpath("sample_tools")


def _shop_tools():
    return {t.function.name: t for t in ingest_paths([SAMPLE], SftConfig()).tools if t.server == "shop"}


def _call(name: str, **args) -> ChatMessage:
    return ChatMessage.model_validate({"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_0", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}]})


def _result(payload: dict) -> ChatMessage:
    return ChatMessage(role="tool", tool_call_id="call_0", name="x", content=json.dumps(payload))


def test_a_made_up_identifier_or_number_is_named_and_a_copied_one_passes():
    user = ChatMessage(role="user", content="Can you track the order status of order_5igvhs?")
    made_up = invented_argument([user, _call("track_order", order_id="order_id_to_track_order")])
    assert made_up and "order_id='order_id_to_track_order'" in made_up
    assert invented_argument([user, _call("track_order", order_id="order_5igvhs")]) is None
    # a value an earlier tool result holds is the conversation's; a number nobody said is not
    geocoded = _result({"city": "Tallinn", "latitude": 59.437, "longitude": 24.7536})
    assert invented_argument([user, _call("geocode_city", city="Tallinn"), geocoded,
                              _call("get_air_quality", latitude=59.437, longitude=24.7536)]) is None
    assert "latitude=45.44" in invented_argument([user, _call("get_air_quality", latitude=45.44, longitude=1)])
    assert invented_argument([user, _call("create_note", title="My groceries", body="eggs")]) is None  # free text
    # a number must be said as a number, not found inside another one
    assert invented_argument([ChatMessage(role="user", content="Add 17 of product_x1."),
                              _call("add_to_cart", product_id="product_x1", quantity=1)]) is not None


def test_identifier_and_number_parameters_are_offered_the_conversations_values():
    tools = _shop_tools()
    messages = [ChatMessage(role="user", content="I need to add 7 of product_e41jrq to my cart, 'cart_77'."),
                _result({"product_id": "product_e41jrq", "price": 12.5, "in_stock": True})]
    specs = {s["function"]["name"]: s["function"]["parameters"]["properties"]
             for s in grounded_tools(list(tools.values()), messages)}
    assert specs["add_to_cart"]["product_id"]["enum"][:1] == ["product_e41jrq"]
    assert "cart_77" in specs["add_to_cart"]["product_id"]["enum"]
    assert specs["add_to_cart"]["quantity"]["enum"] == [7]  # an integer parameter: the integers said
    assert specs["track_order"]["order_id"]["enum"]  # every identifier parameter, whichever tool
    original = {s.function.name: s.function.parameters["properties"] for s in tools.values()}
    assert "enum" not in original["add_to_cart"]["product_id"]  # the tools themselves are untouched
    free = [(t, p) for t, props in specs.items() for p, schema in props.items()
            if schema.get("type") == "string" and "id" not in p and schema != original[t][p]]
    assert free == []  # free text stays the agent's (a tool's own enum, `payment_method`, stays its own)


def test_a_grounded_run_sends_enums_from_each_conversation_and_keeps_no_invented_call(scripted_openai,
                                                                                        tmp_warehouse):
    """Over real HTTP: every agent request narrows identifier and number parameters to values its own messages
    hold, and no kept trajectory calls with a value no message gave."""
    from tests.tasks.sft_responder import SftResponder

    scripted_openai.responder = SftResponder()
    cfg = Config(model=ModelConfig(backend="openai", base_url=scripted_openai.url, model="scripted"),
                 sft=SftConfig(use_embeddings=False, chains_per_server=2, verify_votes=1, augmentations=[],
                               judge="rules", grounded_arguments=True, min_clarity=0, min_realism=0,
                               min_tool_necessity=0))
    wh = tmp_warehouse
    run_stage(sft_stages.ingest, cfg, wh, "run-i", [str(SAMPLE.joinpath("shop.json"))])
    run_stage(sft_stages.build_graphs, cfg, wh, "run-g")
    chain_ids, _ = run_stage(sft_stages.sample_chains, cfg, wh, "run-g", seed=0)
    task_ids, _ = run_stage(sft_stages.synthesize_tasks, cfg, wh, "run-g", chain_ids, seed=0)
    traj_ids, _ = run_stage(sft_stages.run_trajectories, cfg, wh, "run-g", task_ids, seed=0)
    _, counts = run_stage(sft_stages.judge, cfg, wh, "run-g", traj_ids)
    assert counts["scored"] == len(traj_ids) > 0
    narrowed = 0
    tools = _shop_tools()
    for request in scripted_openai.chat_requests():
        said = " ".join(m.get("content") or "" for m in request["messages"] if m["role"] in ("user", "tool"))
        for spec in request.get("tools") or []:
            for name, schema in spec["function"]["parameters"].get("properties", {}).items():
                own = tools[spec["function"]["name"]].function.parameters["properties"][name]
                for value in (schema.get("enum", []) if schema != own else []):  # the enums the agent was offered
                    narrowed += 1
                    assert re.search(re.escape(str(value)).replace(r"\.0", r"(?:\.0)?"), said), (name, value)
    assert narrowed > 0
    trajectories = {t.id: t for t in wh.load(Trajectory)}
    scores = wh.load(JudgeScore)
    assert all(invented_argument(trajectories[s.trajectory_id].messages) is None for s in scores if s.keep)
    refused = [s for s in scores if invented_argument(trajectories[s.trajectory_id].messages)]
    assert all(not s.keep and "which no message gave" in (s.rationale or "") for s in refused)
