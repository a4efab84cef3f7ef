"""Offline answer of `sft.judge_trajectory`: the seven dimensions computed from the conversation itself.

  query_understanding           share of values the user quoted that reach some call's arguments
  planning                      share of the planned chain called, in order (server-only: 1 if it called any tool)
  tool_response_understanding   share of successful results whose values reach later arguments or the answer
  context_conditioned_planning  share of later calls whose id-like arguments come from earlier results
  tool_call_status              share of planned steps that finally succeeded
  tool_conciseness              planned steps / calls made (retries and detours cost)
  final_answer_quality          an answer exists and reports every successful step
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from arenaforge.services.models import ChatRequest
from arenaforge.services.models.providers.offline import OfflineModel
from arenaforge.tracks.sft.judge_trajectories import JudgeInputs
from arenaforge.tracks.sft.tool_graph import id_like

_QUOTED = re.compile(r'"([^"]{1,200})"')


def _flat_values(value: Any, out: set[str], depth: int = 0) -> set[str]:
    if isinstance(value, dict) and depth < 5:
        for v in value.values():
            _flat_values(v, out, depth + 1)
    elif isinstance(value, list) and depth < 5:
        for v in value[:5]:
            _flat_values(v, out, depth + 1)
    elif isinstance(value, (str, int, float)) and not isinstance(value, bool):
        text = str(value)
        if len(text) >= 2:
            out.add(text)
    return out


def _lcs(a: Sequence[str], b: Sequence[str]) -> int:
    table = [[0] * (len(b) + 1) for _ in range(len(a) + 1)]
    for i, x in enumerate(a):
        for j, y in enumerate(b):
            table[i + 1][j + 1] = table[i][j] + 1 if x == y else max(table[i][j + 1], table[i + 1][j])
    return table[-1][-1]


def judge_trajectory(request: ChatRequest, model: OfflineModel) -> dict[str, Any]:
    inputs: JudgeInputs = request.inputs
    trajectory, chain = inputs.trajectory, inputs.chain
    msgs = trajectory.messages
    user = next((m.content or "" for m in msgs if m.role == "user"), "")
    calls: list[tuple[str, dict[str, Any], str, str]] = []  # (name, args, outcome text, ok)
    results = {m.tool_call_id: m.content or "" for m in msgs if m.role == "tool"}
    for m in msgs:
        for c in m.tool_calls or []:
            try:
                args = json.loads(c.function.arguments)
            except json.JSONDecodeError:
                args = {}
            text = results.get(c.id, "")
            ok = not (text.startswith("Error:") or text.startswith("Timeout:"))
            calls.append((c.function.name, args if isinstance(args, dict) else {}, text, "ok" if ok else "fail"))
    arg_values = set()
    for _, args, _, _ in calls:
        _flat_values(args, arg_values)
    answer = trajectory.final_answer or ""

    quoted = [q for q in _QUOTED.findall(user)]
    qu = sum(1 for q in quoted if q in arg_values or any(q in v for v in arg_values)) / len(quoted) if quoted else 1.0

    called = [n for n, *_ in calls]
    distinct = list(dict.fromkeys(called))
    if chain is not None:
        planning = _lcs(chain.tools, distinct) / len(chain.tools)
        planned = chain.tools
    else:
        planning = 1.0 if calls else 0.0
        planned = distinct
    succeeded = {n for n, _, _, s in calls if s == "ok"}
    status = sum(1 for n in planned if n in succeeded) / len(planned) if planned else 0.0
    conciseness = min(1.0, len(planned) / len(calls)) if calls else 0.0

    understood, used = 0, 0
    ok_results = [(i, text) for i, (_, _, text, s) in enumerate(calls) if s == "ok"]
    for i, text in ok_results:
        try:
            values = _flat_values(json.loads(text), set())
        except json.JSONDecodeError:
            values = {text[:80]}
        later_args: set[str] = set()
        for _, args, _, _ in calls[i + 1:]:
            _flat_values(args, later_args)
        used += 1
        if values & later_args or any(v in answer for v in values):
            understood += 1
    tru = understood / used if used else 0.0

    earlier: set[str] = set()
    chained, needing = 0, 0
    for i, (_, args, text, s) in enumerate(calls):
        if i > 0:
            ids = [str(v) for k, v in args.items() if id_like(k) and isinstance(v, (str, int))]
            if ids:
                needing += 1
                if all(v in earlier or v in user for v in ids):
                    chained += 1
        if s == "ok":
            try:
                _flat_values(json.loads(text), earlier)
            except json.JSONDecodeError:
                pass
    ccp = chained / needing if needing else 1.0

    if not answer:
        faq = 0.0
    else:
        reported = 0
        for _, text in ok_results:
            try:
                values = _flat_values(json.loads(text), set())
            except json.JSONDecodeError:
                values = {text[:80]}
            reported += 1 if any(v in answer for v in values) else 0
        faq = (reported / len(ok_results)) if ok_results else 0.2
    scores = {"query_understanding": qu, "planning": planning, "tool_response_understanding": tru,
              "context_conditioned_planning": ccp, "tool_call_status": status, "tool_conciseness": conciseness,
              "final_answer_quality": faq}
    return {**{k: round(max(0.0, min(1.0, v)), 4) for k, v in scores.items()},
            "rationale": f"{len(calls)} calls, {sum(1 for *_, s in calls if s == 'fail')} failed, "
                         f"{len(planned)} planned steps"}
