"""The client against the servers people run, replayed from their recorded wire behaviour (tests/tasks/wire/).

Each recording says what a server refuses (status and body, as that server sends them), how its answers
look in each structured-output mode, and whether it calls tools natively or ignores them. The replay
server answers over real HTTP like that server would; the client must negotiate a mode the server
accepts, remember it, and still get the step's answer and tool calls.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from arenaforge.schemas.config import ModelConfig
from arenaforge.services.models import ChatRequest, complete_json
from arenaforge.testing.scripted_openai import Reply, chat_completion
from arenaforge.tracks.sft.agent import AGENT
from tests.support.models import http_model, http_step

WIRE = Path(__file__).parent / "wire"
RECORDINGS = sorted(p.stem for p in WIRE.glob("*.json"))
GEO = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
GEO_STEP = http_step("wire.geo", GEO)
PROBE = {"role": "user", "content": "What is the weather in Paris? Answer in JSON with the key city."}
WEATHER = [{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city.", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
# an agent's conversation after one tool call: the assistant message has tool calls and no content
HISTORY = [{"role": "user", "content": "Weather in Paris, then Oslo?"},
           {"role": "assistant", "content": None, "tool_calls": [
               {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
           {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": '{"temp": 21}'}]


class Replay:
    """A responder that answers as the recorded server; `answer` is what the model means to say next."""

    def __init__(self, recording: dict[str, Any]) -> None:
        self.rec = recording
        self.answer: dict[str, Any] = {}

    def __call__(self, req: dict[str, Any]) -> Reply:
        for rule in self.rec["refuses"]:
            if _holds(rule["when"], req):
                return Reply(status=rule["status"], body=rule["body"])
        if "recorded" in self.rec and req["messages"][-1] == PROBE:
            return Reply(body=self.rec["recorded"]["json_schema"]["response"])  # the server's own answer
        if req.get("tools") and self.rec["tools"] == "native":
            if "tool_calls" in self.answer:
                return Reply(body=chat_completion(tool_calls=[
                    {"name": c["name"], "arguments": c["arguments"]} for c in self.answer["tool_calls"]]))
            return Reply(body=chat_completion(content=self.answer["answer"]))
        mode = (req.get("response_format") or {}).get("type", "text")
        style = self.rec["structured"][mode]
        text = json.dumps(self.answer)
        content = {"exact": text, "fenced": f"```json\n{text}\n```",
                   "prose": f"Sure! Here is the answer:\n{text}\nLet me know if you need anything else."}[style]
        return Reply(body=chat_completion(content=content))


def _holds(condition: str, req: dict[str, Any]) -> bool:
    mode = (req.get("response_format") or {}).get("type")
    said = " ".join(m.get("content") or "" for m in req["messages"]).lower()
    return {
        "response_format_json_schema": mode == "json_schema",
        "json_object_without_word_json": mode == "json_object" and "json" not in said,
        "tools": bool(req.get("tools")),
        "tools_auto": bool(req.get("tools")) and req.get("tool_choice", "auto") == "auto",
        "tool_choice_required": req.get("tool_choice") == "required",
        "max_tokens": "max_tokens" in req,
        "temperature_not_1": req.get("temperature", 1) != 1,
    }[condition]


def _load(name: str) -> dict[str, Any]:
    return json.loads((WIRE / f"{name}.json").read_text())


def _model(server, rec: dict[str, Any]):
    return http_model(ModelConfig(backend="openai", base_url=server.url, model="m", max_retries=1,
                                  backoff_base_s=0.01, backoff_max_s=0.05,
                                  tool_calling=rec.get("tool_calling_config", "auto")))


def _modes(requests: list[dict[str, Any]]) -> list[str]:
    """The structured-output modes sent, in order, repeats folded."""
    seen: list[str] = []
    for r in requests:
        mode = (r.get("response_format") or {}).get("type", "text")
        if not seen or seen[-1] != mode:
            seen.append(mode)
    return seen


def test_every_recording_is_complete():
    conditions = {"response_format_json_schema", "json_object_without_word_json", "tools", "tools_auto",
                  "tool_choice_required", "max_tokens", "temperature_not_1"}
    assert len(RECORDINGS) >= 5
    for name in RECORDINGS:
        rec = _load(name)
        assert rec["server"] and rec["how"], name
        assert {r["when"] for r in rec["refuses"]} <= conditions, name
        assert rec["tools"] in ("native", "ignored") and rec["expect"]["tool_calling"] in ("native", "prompt"), name


@pytest.mark.parametrize("name", RECORDINGS)
def test_structured_answers_negotiate_a_mode_once(scripted_openai, name):
    rec = _load(name)
    replay = scripted_openai.responder = Replay(rec)
    replay.answer = {"city": "Paris"}
    with _model(scripted_openai, rec) as model:
        first = asyncio.run(complete_json(model, GEO_STEP, [PROBE]))
        sent_first = len(scripted_openai.chat_requests())
        second = asyncio.run(complete_json(model, GEO_STEP, [PROBE, {"role": "user", "content": "Again."}]))
    assert first["city"] == second["city"] == "Paris"
    requests = scripted_openai.chat_requests()
    assert _modes(requests[:sent_first]) == rec["expect"]["structured_modes"]
    assert len(requests) == sent_first + 1, "the negotiated mode and parameters are remembered: one request"
    last = requests[-1]
    assert not any(_holds(rule["when"], last) for rule in rec["refuses"]), "the remembered request is accepted"
    assert all(isinstance(m.get("content"), str) for m in last["messages"])
    assert sum(m["role"] == "system" for m in last["messages"]) <= 1 and (
        last["messages"][0]["role"] == "system" or all(m["role"] != "system" for m in last["messages"]))


@pytest.mark.parametrize("name", RECORDINGS)
def test_tool_turns_work_natively_or_in_the_prompt(scripted_openai, name):
    rec = _load(name)
    replay = scripted_openai.responder = Replay(rec)
    with _model(scripted_openai, rec) as model:
        replay.answer = {"tool_calls": [{"name": "get_weather", "arguments": {"city": "Oslo"}}]}
        turn = asyncio.run(model.complete(ChatRequest(step=AGENT.name, messages=HISTORY, tools=WEATHER)))
        history = [*HISTORY, turn.message.model_dump(mode="json", exclude_none=True),
                   {"role": "tool", "tool_call_id": turn.message.tool_calls[0].id, "name": "get_weather",
                    "content": '{"temp": 3}'}]
        replay.answer = {"answer": "21 degrees in Paris, 3 in Oslo."}
        final = asyncio.run(model.complete(ChatRequest(step=AGENT.name, messages=history, tools=WEATHER,
                                                       tool_choice="none")))
        tool_mode = model.tool_mode
    call = turn.message.tool_calls[0].function
    assert (call.name, json.loads(call.arguments)) == ("get_weather", {"city": "Oslo"})
    assert final.message.content == "21 degrees in Paris, 3 in Oslo." and not final.message.tool_calls
    assert tool_mode == rec["expect"]["tool_calling"]
    requests = scripted_openai.chat_requests()
    for r in requests:
        assert all(isinstance(m.get("content"), str) for m in r["messages"]), "content is always present"
        assert r.get("tool_choice") in (None, "none"), "tool_choice only where the step needs it"
    last = requests[-1]
    if tool_mode == "prompt":  # the tools are described in the prompt and the calls are the assistant's JSON
        assert "tools" not in last and "get_weather" in last["messages"][0]["content"]
        assert {"role": "user", "content": 'Result of get_weather: {"temp": 21}'} in last["messages"]
    else:
        assert last["tools"] == WEATHER and last["tool_choice"] == "none"
    assert not any(_holds(rule["when"], last) for rule in rec["refuses"])

