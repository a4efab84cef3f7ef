"""`bench grounding`'s call diagnostics: calls naming a gold tool, and of those the ones with exactly gold arguments."""

from __future__ import annotations

import json

from arenaforge.benchmarks.grounding import _call_diagnostics
from arenaforge.schemas.models import ChatMessage, FunctionCall, RewardBreakdown, Rollout, ToolCall
from tests.support.rl import tiny_env


def _rollout(env_id: str, *calls: tuple[str, dict]) -> Rollout:
    tool_calls = [ToolCall(id=f"c{i}", function=FunctionCall(name=name, arguments=json.dumps(args)))
                  for i, (name, args) in enumerate(calls)]
    return Rollout(env_id=env_id, engine="hf", policy="p", messages=[ChatMessage(role="assistant", tool_calls=tool_calls)],
                   reward=RewardBreakdown(recall=0, precision=0, f1=0, solved=0, subtasks=2, calls=len(calls)),
                   status="finished")


def test_call_diagnostics_count_gold_tools_and_exact_arguments():
    env = tiny_env(country="OR5031")  # gold: get_capital(country=OR5031), get_population(city=Quaxton)
    rollouts = [_rollout(env.id, ("get_capital", {"country": "OR5031"}), ("get_capital", {"country": "OR5000"}),
                         ("get_population", {"city": "Quaxton"}), ("no_such_tool", {}))]
    out = _call_diagnostics(rollouts, {env.id: env})
    assert out == {"calls": 4, "gold_tool_share": 0.75, "exact_args_share_of_gold_tool": round(2 / 3, 4)}
    assert _call_diagnostics([], {}) == {"calls": 0, "gold_tool_share": 0.0, "exact_args_share_of_gold_tool": 0.0}
