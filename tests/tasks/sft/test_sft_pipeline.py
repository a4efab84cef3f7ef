"""SFT stages end to end on the sample corpus: tasks, simulator, agent, judge, export (offline and openai)."""

from __future__ import annotations

import asyncio
import json
import random
from importlib import resources
from pathlib import Path

import pytest

from arenaforge.schemas.config import Config, ModelConfig, SftConfig
from arenaforge.schemas.models import JudgeScore, Rejection, Task, Trajectory
from arenaforge.tracks.sft import stages as sft_stages
from arenaforge.tracks.sft.agent import AGENT
from arenaforge.tracks.sft.ingest_tools import ingest_paths
from arenaforge.tracks.sft.judge_trajectories import JUDGE_TRAJECTORY
from arenaforge.tracks.sft.score_queries import SCORE_QUERY
from arenaforge.tracks.sft.synthesize_queries import WRITE_QUERY
from arenaforge.tracks.sft.tool_simulator import Simulator, output_problem, sample_value
from tests.support.models import offline_model, run_stage

SAMPLE = Path(str(resources.files("arenaforge.data").joinpath("sample_tools")))


def _offline_cfg(**sft) -> Config:
    return Config(sft=SftConfig(use_embeddings=False, **sft))


@pytest.fixture
def loaded(tmp_warehouse):
    cfg = _offline_cfg()
    run_stage(sft_stages.ingest, cfg, tmp_warehouse, "run-i", [str(SAMPLE)])
    run_stage(sft_stages.build_graphs, cfg, tmp_warehouse, "run-g")
    return tmp_warehouse


def _shop_tools():
    result = ingest_paths([SAMPLE], SftConfig())
    return {t.function.name: t for t in result.tools if t.server == "shop"}


def test_simulator_is_consistent_schema_true_and_injects_faults_at_its_rate():
    tools = _shop_tools()
    sim = Simulator(list(tools.values()), fault_rate=0.0, rng=random.Random(0), subject="t", model=offline_model())

    async def calls():
        first = await sim.call("get_product", {"product_id": "prod_1"})
        again = await sim.call("get_product", {"product_id": "prod_1"})
        cart = await sim.call("add_to_cart", {"product_id": "prod_1", "quantity": 2})
        missing = await sim.call("checkout", {})
        return first, again, cart, missing

    first, again, cart, missing = asyncio.run(calls())
    product = json.loads(first.observation.output)
    assert product["product_id"] == "prod_1" and output_problem(tools["get_product"], product) is None
    assert again.observation.output == first.observation.output  # same call, same answer
    assert output_problem(tools["add_to_cart"], json.loads(cart.observation.output)) is None
    assert missing.observation.outcome == "error" and "cart_id" in missing.observation.error

    faulty = Simulator(list(tools.values()), fault_rate=0.2, rng=random.Random(1), subject="t", model=offline_model())
    async def many():
        return [await faulty.call("track_order", {"order_id": f"o{i}"}) for i in range(2000)]

    results = asyncio.run(many())
    rate = sum(r.fault for r in results) / len(results)
    assert 0.17 < rate < 0.23 and faulty.log.faults == sum(r.fault for r in results)
    assert {r.observation.outcome for r in results if r.fault} <= {"error", "timeout"}


def test_simulator_answer_that_breaks_the_output_schema_is_an_error_and_a_rejection():
    tools = _shop_tools()

    class Broken(Simulator):
        async def answer(self, tool, arguments):
            return {"order_id": 7, "status": "shipped", "eta_days": 1}

    sim = Broken(list(tools.values()), fault_rate=0.0, rng=random.Random(0), subject="task-x", model=offline_model())
    result = asyncio.run(sim.call("track_order", {"order_id": "o1"}))
    assert result.observation.outcome == "error"
    assert [r.reason for r in sim.log.rejections] == ["schema_violation"]
    assert "order_id" in sim.log.rejections[0].detail


def test_sample_value_respects_schema_constraints():
    rng = random.Random(3)
    schema = {"type": "object", "properties": {
        "n": {"type": "integer", "minimum": 5, "maximum": 6}, "when": {"type": "string", "format": "date"},
        "kind": {"enum": ["a", "b"]}, "tags": {"type": "array", "items": {"type": "string"}, "minItems": 2},
        "lat": {"type": "number", "minimum": -90, "maximum": 90}}, "required": ["n", "when", "kind", "tags", "lat"]}
    from jsonschema import Draft202012Validator

    for _ in range(50):
        value = sample_value(schema, "x", rng)
        assert not list(Draft202012Validator(schema).iter_errors(value))


def test_offline_pipeline_writes_scored_trajectories_and_exports_for_datasets(loaded, tmp_path):
    wh = loaded
    cfg = _offline_cfg()
    chain_ids, c1 = run_stage(sft_stages.sample_chains, cfg, wh, "run-s", seed=1)
    task_ids, c2 = run_stage(sft_stages.synthesize_tasks, cfg, wh, "run-s", chain_ids, seed=1, server_only=True)
    assert c1["verified_chains"] == len(chain_ids) > 3
    assert c2["tasks"] == 4 * (len(chain_ids) + 4)  # base + 3 augmentations, per chain and per server (server-only)
    tasks = wh.load(Task, where="run_id = 'run-s'")
    assert {t.augmentation for t in tasks} == {"none", "diversity", "complexity", "persona"}
    assert {t.mode for t in tasks} == {"chain", "server"}
    assert all(set(t.scores) == {"clarity", "realism", "tool_necessity"} for t in tasks)
    persona = next(t for t in tasks if t.augmentation == "persona")
    assert persona.persona and persona.query.startswith("As a")

    traj_ids, c3 = run_stage(sft_stages.run_trajectories, cfg, wh, "run-s", task_ids, seed=1)
    assert c3["trajectories"] == len(task_ids) and c3["tool_calls"] >= len(task_ids)
    assert 0 < c3["faults_injected"] < c3["tool_calls"]
    trajectories = wh.load(Trajectory, where="run_id = 'run-s'")
    for t in trajectories:
        roles = [m.role for m in t.messages]
        assert roles[:2] == ["system", "user"] and roles[-1] == "assistant" and t.final_answer
        call_ids = [c.id for m in t.messages for c in (m.tool_calls or [])]
        assert call_ids == [m.tool_call_id for m in t.messages if m.role == "tool"]
        assert t.executor == "simulator" and t.fault_rate == 0.2
    with_fault = next(t for t in trajectories if t.faults_injected)
    assert any(m.role == "tool" and (m.content or "").startswith(("Error:", "Timeout:")) for m in with_fault.messages)
    _, uses = wh.query("SELECT sum(uses) FROM graph_edges")
    assert uses[0][0] == 0  # walks count as used only once the run's trajectories are judged

    kept, c4 = run_stage(sft_stages.judge, cfg, wh, "run-s", traj_ids)
    _, uses = wh.query("SELECT sum(uses) FROM graph_edges")
    assert uses[0][0] > 0  # walked edges were counted
    scores = wh.load(JudgeScore, where="run_id = 'run-s'")
    assert c4["scored"] == len(traj_ids) and {s.judge for s in scores} == {"rules"}
    for s in scores:
        dims = [getattr(s, d) for d in JudgeScore.DIMENSIONS]
        assert s.mean == pytest.approx(sum(dims) / 7, abs=1e-3) and s.keep == (s.mean >= 0.7)
    faulty = [s for s in scores if s.tool_conciseness < 1]
    assert faulty, "retries after injected faults cost conciseness"

    report = run_stage(sft_stages.export, cfg, wh, "run-s", tmp_path)
    assert report["samples"] == c4["kept"] > 0
    assert report["messages_per_sample"] > 3 and report["distinct_functions"] >= 5
    assert 0 < report["achieved_fault_rate"] < 0.5
    import datasets

    js = datasets.load_dataset("json", data_files=report["jsonl"], split="train")
    pq = datasets.load_dataset("parquet", data_files=report["parquet"], split="train")
    assert len(js) == len(pq) == report["samples"]
    row = pq[0]
    assert row["messages"][0]["role"] == "system" and json.loads(row["tools"])[0]["type"] == "function"
    call = next(m for m in row["messages"] if m["tool_calls"])["tool_calls"][0]
    assert isinstance(json.loads(call["function"]["arguments"]), dict)
    # the JSONL is OpenAI chat-with-tools: tools a list of tool objects, messages without null keys
    lines = Path(report["jsonl"]).read_text().splitlines()
    # each line is exactly json.dumps of its row (the tools are encoded once for both files), same tools text
    assert all(json.dumps(json.loads(line), ensure_ascii=False) == line for line in lines)
    assert [json.dumps(json.loads(line)["tools"], ensure_ascii=False) for line in lines] == pq["tools"]
    first = json.loads(lines[0])
    assert list(first)[:2] == ["messages", "tools"] and first["tools"][0]["type"] == "function"
    assert all(isinstance(t["function"]["parameters"], dict) for t in first["tools"])
    assert all(None not in m.values() and isinstance(m["content"], str) for m in first["messages"])
    tool_turn = next(m for m in first["messages"] if m["role"] == "tool")
    assert set(tool_turn) <= {"role", "content", "tool_call_id", "name"} and tool_turn["tool_call_id"]
    assert "tool_call_id" not in first["messages"][1] and "tool_calls" not in first["messages"][1]
    from transformers import AutoTokenizer

    from arenaforge.tracks.train.tiny_model import ensure_tiny_model

    text = AutoTokenizer.from_pretrained(ensure_tiny_model()).apply_chat_template(
        first["messages"], tools=first["tools"], tokenize=False)
    assert first["tools"][0]["function"]["name"] in text and tool_turn["content"] in text
    assert json.loads(Path(report["report"]).read_text())["samples"] == report["samples"]


def test_strict_thresholds_reject_tasks_with_reasons(loaded):
    cfg = _offline_cfg(min_clarity=1.0, min_realism=1.0, min_tool_necessity=1.0)
    chain_ids, _ = run_stage(sft_stages.sample_chains, cfg, loaded, "run-t", seed=2)
    accepted, counts = run_stage(sft_stages.synthesize_tasks, cfg, loaded, "run-t", chain_ids, seed=2)
    assert counts["rejected_tasks"] > 0
    rejected = [t for t in loaded.load(Task, where="run_id = 'run-t'") if not t.accepted]
    assert all(any("< 1.00" in r for r in t.reasons) for t in rejected)
    _, rows = loaded.query("SELECT count(*) FROM v_tasks WHERE NOT accepted AND run_id = 'run-t'")
    assert rows[0][0] == len(rejected)


def test_openai_backend_end_to_end_against_the_scripted_endpoint(scripted_openai, tmp_warehouse):
    from tests.tasks.sft_responder import SftResponder

    responder = SftResponder()
    scripted_openai.responder = responder
    cfg = Config(model=ModelConfig(backend="openai", base_url=scripted_openai.url, model="scripted"),
                 sft=SftConfig(use_embeddings=False, chains_per_server=2, verify_votes=1, augmentations=["persona"]))
    wh = tmp_warehouse
    run_stage(sft_stages.ingest, cfg, wh, "run-i", [str(SAMPLE / "weather.jsonl")])
    counts = run_stage(sft_stages.build_graphs, cfg, wh, "run-o")
    assert counts["edges"] >= 2
    chain_ids, _ = run_stage(sft_stages.sample_chains, cfg, wh, "run-o", seed=0)
    task_ids, c = run_stage(sft_stages.synthesize_tasks, cfg, wh, "run-o", chain_ids, seed=0)
    assert c["accepted_tasks"] == 2 * len(chain_ids) > 0
    traj_ids, c = run_stage(sft_stages.run_trajectories, cfg, wh, "run-o", task_ids, seed=0)
    assert c["trajectories"] == len(task_ids)
    kept, c = run_stage(sft_stages.judge, cfg, wh, "run-o", traj_ids)
    assert c["scored"] == len(traj_ids) and len(kept) == len(traj_ids)
    t = wh.load(Trajectory)[0]
    assert t.messages[2].tool_calls and t.messages[-1].content.startswith("Done.")
    assert t.provenance.backend == "openai" and t.provenance.model == "scripted"
    assert {s.judge for s in wh.load(JudgeScore)} == {"model"}
    _, steps = wh.query("SELECT step, count(*) FROM llm_calls GROUP BY step ORDER BY step")
    assert {s for s, _ in steps} >= {f"sft.{step}" for step in ("agent", "judge_trajectory", "propose_chains",
                                                                 "score_query", "simulate_tool", "write_query",
                                                                 "augment_query", "verify_chain")}

    responder.break_simulator = True  # answers that never fit the output schema: error observations + rejections
    cfg2 = cfg.model_copy(update={"model": cfg.model.model_copy(update={"cache": False, "max_reasks": 0})})
    _, c = run_stage(sft_stages.run_trajectories, cfg2, wh, "run-b", task_ids, seed=5)
    assert c["trajectory_rejections"] > 0
    reasons = {r.reason for r in wh.load(Rejection, where="run_id = 'run-b'")}
    assert "simulator_failed" in reasons


def test_tools_with_code_run_in_the_sandbox(tmp_warehouse, tmp_path, monkeypatch):
    server = {"name": "units", "title": "Unit converter", "description": "Convert lengths.", "domain": "science", "tools": [
        {"name": "km_to_miles", "description": "Convert a distance in kilometres to miles.",
         "parameters": {"type": "object", "properties": {"km": {"type": "number", "minimum": 0, "maximum": 100}}, "required": ["km"]},
         "returns": {"type": "object", "properties": {"miles": {"type": "number"}}, "required": ["miles"]},
         "code": "def km_to_miles(km):\n    return {'miles': round(km * 0.621371, 3)}"},
        {"name": "round_miles", "description": "Round a number of miles to whole miles.",
         "parameters": {"type": "object", "properties": {"miles": {"type": "number"}}, "required": ["miles"]},
         "returns": {"type": "object", "properties": {"rounded": {"type": "integer"}}, "required": ["rounded"]},
         "code": "def round_miles(miles):\n    return {'rounded': int(round(miles))}"}]}
    (tmp_path / "units.json").write_text(json.dumps(server))
    cfg = Config(sft=SftConfig(use_embeddings=False, augmentations=[]), sandbox={"backend": "process", "pool_size": 1})
    wh = tmp_warehouse
    run_stage(sft_stages.ingest, cfg, wh, "r", [str(tmp_path)])
    run_stage(sft_stages.build_graphs, cfg, wh, "r")
    chains, _ = run_stage(sft_stages.sample_chains, cfg, wh, "r", seed=0)
    task_ids, _ = run_stage(sft_stages.synthesize_tasks, cfg, wh, "r", chains, seed=0)
    _, counts = run_stage(sft_stages.run_trajectories, cfg, wh, "r", task_ids, seed=0)
    trajectories = wh.load(Trajectory)
    assert counts["trajectories"] == len(task_ids) > 0 and {t.executor for t in trajectories} == {"sandbox"}
    chained = next(t for t in trajectories if t.tool_calls == 2)
    results = [json.loads(m.content) for m in chained.messages if m.role == "tool"]
    call = json.loads(chained.messages[2].tool_calls[0].function.arguments)
    assert results[0] == {"miles": round(call["km"] * 0.621371, 3)}
    assert results[1] == {"rounded": int(round(results[0]["miles"]))}  # the agent passed the real output on


def test_live_mcp_server_answers_the_agent(tmp_warehouse):
    import sys

    time_server = str(Path(sys.executable).parent / "mcp-server-time")
    cfg = Config(sft=SftConfig(use_embeddings=False, augmentations=[], chains_per_server=2))
    wh = tmp_warehouse
    run_stage(sft_stages.ingest, cfg, wh, "r", mcp=[time_server])
    run_stage(sft_stages.build_graphs, cfg, wh, "r")
    chains, _ = run_stage(sft_stages.sample_chains, cfg, wh, "r", seed=0)
    task_ids, _ = run_stage(sft_stages.synthesize_tasks, cfg, wh, "r", chains, seed=0)
    _, counts = run_stage(sft_stages.run_trajectories, cfg, wh, "r", task_ids, seed=0)
    trajectories = wh.load(Trajectory)
    assert counts["trajectories"] == len(task_ids) > 0 and counts["faults_injected"] == 0
    assert {t.executor for t in trajectories} == {"mcp"} and {t.fault_rate for t in trajectories} == {0.0}
    texts = [m.content or "" for t in trajectories for m in t.messages if m.role == "tool"]
    answers = [json.loads(x) for x in texts if not x.startswith("Error:")]
    assert answers and all("datetime" in json.dumps(a) for a in answers)  # real answers from the live server
    assert all(x.startswith("Error:") for x in texts if x and x[0] != "{")  # its own errors reach the agent as such


def test_program_values_make_every_task_name_the_values_its_chain_needs(loaded):
    """`sft.query_values = program`: the program draws the values, the schema makes the query name each, in one
    sentence, with no `"` (what constrained decoding can hold); the drafts carry the values the program chose."""
    import re

    from arenaforge.tracks.sft.synthesize_queries import naming_schema, value_text

    cfg = _offline_cfg(query_values="program", augmentations=[])
    chain_ids, _ = run_stage(sft_stages.sample_chains, cfg, loaded, "run-p", seed=3)
    accepted, counts = run_stage(sft_stages.synthesize_tasks, cfg, loaded, "run-p", chain_ids, seed=3)
    assert counts["tasks"] > 0 and accepted
    refused = [r.detail for r in loaded.load(Rejection, where="run_id = 'run-p'") if r.stage == "write_query"]
    assert not refused, refused  # the offline writer's queries fit the naming schema
    _, rows = loaded.query("SELECT query FROM v_tasks WHERE run_id = 'run-p'")
    named = [q for (q,) in rows if "'" in q]
    assert named and all('"' not in q for (q,) in rows)
    pattern = re.compile(naming_schema(["note_1", 3])["properties"]["query"]["pattern"])
    assert pattern.match("Please share note_1 with 3 people.") and pattern.match("Can you share 'note_1', 3?")
    assert not pattern.match("Please share it with 3 people.")  # a value left out
    assert not pattern.match("Please share note_1 with 3 people. Then stop.")  # one sentence
    assert not pattern.match("Share note_1 with 3 people.")  # an opener a user would type
    assert not pattern.match("Please share id=note_1 with 3 people.")  # plain words, a value after a space
    assert not pattern.match("Please share note_1 with 3 " + "more " * 5 + "people.")  # words bounded
    assert value_text(3) == "3"


def test_rules_judge_scores_an_openai_runs_tasks_and_trajectories(scripted_openai, tmp_warehouse):
    """`sft.judge = rules`: the run's model writes and acts; the program's rules score and judge, and the rows say so."""
    from tests.tasks.sft_responder import SftResponder

    scripted_openai.responder = SftResponder()
    cfg = Config(model=ModelConfig(backend="openai", base_url=scripted_openai.url, model="scripted"),
                 sft=SftConfig(use_embeddings=False, chains_per_server=2, verify_votes=1, augmentations=[],
                               judge="rules", agent_first_turn="required", min_clarity=0, min_realism=0,
                               min_tool_necessity=0))
    wh = tmp_warehouse
    run_stage(sft_stages.ingest, cfg, wh, "run-i", [str(SAMPLE / "weather.jsonl")])
    run_stage(sft_stages.build_graphs, cfg, wh, "run-r")
    chain_ids, _ = run_stage(sft_stages.sample_chains, cfg, wh, "run-r", seed=0)
    task_ids, _ = run_stage(sft_stages.synthesize_tasks, cfg, wh, "run-r", chain_ids, seed=0)
    assert {t.provenance.backend for t in wh.load(Task)} == {"offline"}  # scored by the rules
    traj_ids, _ = run_stage(sft_stages.run_trajectories, cfg, wh, "run-r", task_ids, seed=0)
    _, c = run_stage(sft_stages.judge, cfg, wh, "run-r", traj_ids)
    assert c["scored"] == len(traj_ids) > 0
    scores = wh.load(JudgeScore)
    assert {s.judge for s in scores} == {"rules"} and {s.provenance.backend for s in scores} == {"offline"}
    _, steps = wh.query("SELECT DISTINCT step FROM llm_calls WHERE model = 'scripted'")
    asked = {s for (s,) in steps}
    assert {WRITE_QUERY.name, AGENT.name} <= asked and not asked & {JUDGE_TRAJECTORY.name, SCORE_QUERY.name}
    assert {t.provenance.model for t in wh.load(Trajectory)} == {"scripted"}
    # sft.agent_first_turn = required: an episode's first turn must call a tool, the turns after it may answer
    turns = [r for r in scripted_openai.chat_requests() if r.get("tools")]
    first = [r for r in turns if [m["role"] for m in r["messages"]] == ["system", "user"]]
    assert len(first) == len(traj_ids) and {r.get("tool_choice") for r in first} == {"required"}
    assert len(turns) > len(first) and "required" not in {r.get("tool_choice") for r in turns if r not in first}
