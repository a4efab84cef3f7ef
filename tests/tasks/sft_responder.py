"""A scripted 'model' for the SFT track: answers each step's prompt sensibly, over real HTTP.

Structured steps are recognised by the response_format schema name the step sends; agent turns by
the presence of `tools`. Answers are derived from the prompt (tool names, schemas), not fixed text.
"""

from __future__ import annotations

import json
import random
import re
from typing import Any

from arenaforge.schemas.models import JudgeScore
from arenaforge.testing.scripted_openai import chat_completion
from arenaforge.tracks.sft.chains import CHAIN_TO_QUERY, PROPOSE_CHAINS, QUERY_TO_CHAIN, VERIFY_CHAIN
from arenaforge.tracks.sft.judge_trajectories import JUDGE_TRAJECTORY
from arenaforge.tracks.sft.score_queries import SCORE_QUERY
from arenaforge.tracks.sft.synthesize_queries import AUGMENT_QUERY, WRITE_QUERY
from arenaforge.tracks.sft.tool_simulator import SIMULATE_TOOL, sample_value

_TOOL_LINE = re.compile(r"^- ([A-Za-z0-9_.\-]+)\(", re.MULTILINE)


def _chain(prompt: str) -> list[str]:
    match = re.search(r"in exactly this order: (.+)", prompt)
    return [n.strip() for n in match.group(1).split("->")] if match else []


def _named_in_query(prompt: str, names: list[str]) -> list[str]:
    """The listed tools whose spaced names the quoted query mentions, in order of mention."""
    query = re.search(r'asks:\n"(.*)"', prompt, re.DOTALL)
    text = query.group(1) if query else ""
    found = [(text.find(n.replace("_", " ")), n) for n in names]
    return [n for pos, n in sorted(found) if pos >= 0]


class SftResponder:
    def __init__(self) -> None:
        self.reject_chains = False
        self.break_simulator = False
        self.rng = random.Random(0)

    def __call__(self, req: dict[str, Any]) -> dict[str, Any]:
        if req.get("tools"):
            return self._agent(req)
        fmt = req.get("response_format") or {}
        step = fmt.get("json_schema", {}).get("name", "").replace("_", ".", 1)  # the step's name, "." written "_"
        schema = fmt.get("json_schema", {}).get("schema", {})
        prompt = req["messages"][0]["content"]
        names = _TOOL_LINE.findall(prompt)
        answers = {
            PROPOSE_CHAINS.name: lambda: {
                "chains": [names[i:i + 2] for i in range(0, max(len(names) - 1, 1))] or [names]},
            VERIFY_CHAIN.name: lambda: {"valid": not self.reject_chains,
                                        "reason": "each input comes from the user or an earlier output"},
            CHAIN_TO_QUERY.name: lambda: {
                "query": "Please " + ", then ".join(n.replace("_", " ") for n in _chain(prompt)) + "."},
            QUERY_TO_CHAIN.name: lambda: {"tools": _named_in_query(prompt, names)},
            WRITE_QUERY.name: lambda: {
                "query": "I am in Oslo next week; what will the weather be and is the air clean?"},
            AUGMENT_QUERY.name: lambda: {
                "query": "As a cyclist in Oslo, tell me next week's forecast and the air quality.",
                "persona": "cyclist"},
            SCORE_QUERY.name: lambda: {"clarity": 0.9, "realism": 0.85, "tool_necessity": 0.95, "rationale": "clear"},
            SIMULATE_TOOL.name: lambda: ({"wrong": True} if self.break_simulator
                                         else sample_value(schema, "result", self.rng)),
            JUDGE_TRAJECTORY.name: lambda: {d: 0.9 for d in JudgeScore.DIMENSIONS} | {"rationale": "good"},
        }
        if step not in answers:
            return chat_completion(content="{}")
        return chat_completion(content=json.dumps(answers[step]()))

    def _agent(self, req: dict[str, Any]) -> dict[str, Any]:
        tools = [t["function"] for t in req["tools"]]
        done = [m for m in req["messages"] if m["role"] == "tool"]
        if len(done) < min(2, len(tools)):
            fn = tools[len(done)]
            args = sample_value(fn.get("parameters", {}), fn["name"], self.rng)
            return chat_completion(tool_calls=[{"name": fn["name"], "arguments": args}])
        return chat_completion(content="Done. " + " | ".join((m.get("content") or "")[:80] for m in done))
