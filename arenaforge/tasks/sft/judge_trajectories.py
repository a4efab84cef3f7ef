"""Seven-dimension trajectory scores and the SFT keep decision (ASTRA §1a.5).

Dimensions (each 0..1, `JudgeScore.DIMENSIONS`): query understanding, planning, tool-response
understanding, context-conditioned planning, tool-call status, tool conciseness, final-answer
quality; `mean` is their average and `keep = mean >= cfg.sft.keep_threshold`.

Offline (`RuleJudge`), computed from the conversation itself:
  query_understanding           share of values the user quoted that reach some call's arguments
  planning                      share of the planned chain called, in order (server-only: 1 if it called any tool)
  tool_response_understanding   share of successful results whose values reach later arguments or the answer
  context_conditioned_planning  share of later calls whose id-like arguments come from earlier results
  tool_call_status              share of planned steps that finally succeeded
  tool_conciseness              planned steps / calls made (retries and detours cost)
  final_answer_quality          an answer exists and reports every successful step
openai (`ModelJudge`): the `sft_judge_trajectory` prompt returns the seven numbers and a rationale.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from arenaforge.schemas.base import Provenance
from arenaforge.schemas.config import Config
from arenaforge.schemas.errors import ParseError, ProviderError
from arenaforge.schemas.models import JudgeScore, Rejection, Task, ToolChain, Trajectory
from arenaforge.tasks.models import ChatModel, complete_json
from arenaforge.tasks.prompts import load_prompt
from arenaforge.tasks.sft.tool_graph import id_like

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


class Judge(Protocol):
    async def judge(self, trajectory: Trajectory, task: Task | None, chain: ToolChain | None
                    ) -> tuple[dict[str, float], str]: ...


class RuleJudge:
    async def judge(self, trajectory: Trajectory, task: Task | None, chain: ToolChain | None
                    ) -> tuple[dict[str, float], str]:
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
        return {k: round(max(0.0, min(1.0, v)), 4) for k, v in scores.items()}, (
            f"{len(calls)} calls, {sum(1 for *_, s in calls if s == 'fail')} failed, {len(planned)} planned steps")


JUDGE_SCHEMA = {
    "type": "object",
    "properties": {**{d: {"type": "number", "minimum": 0, "maximum": 1} for d in JudgeScore.DIMENSIONS},
                   "rationale": {"type": "string"}},
    "required": list(JudgeScore.DIMENSIONS),
}


class ModelJudge:
    def __init__(self, model: ChatModel) -> None:
        self.model = model
        self.prompt = load_prompt("sft_judge_trajectory")

    async def judge(self, trajectory: Trajectory, task: Task | None, chain: ToolChain | None
                    ) -> tuple[dict[str, float], str]:
        convo = "\n".join(_render(m) for m in trajectory.messages[1:])
        text = self.prompt.render(conversation=convo[:12000], chain=" -> ".join(chain.tools) if chain else "(none)")
        out = await complete_json(self.model, "judge_trajectory", [{"role": "user", "content": text}], JUDGE_SCHEMA)
        return {d: round(float(out[d]), 4) for d in JudgeScore.DIMENSIONS}, str(out.get("rationale", ""))


def _render(m: Any) -> str:
    if m.tool_calls:
        calls = "; ".join(f"{c.function.name}({c.function.arguments})" for c in m.tool_calls)
        return f"[assistant] {m.content or ''} CALLS {calls}"
    return f"[{m.role}{' ' + m.name if m.name else ''}] {(m.content or '')[:800]}"


def judge_for(cfg: Config, model: ChatModel | None) -> tuple[Judge, str]:
    judges: dict[str, Callable[[], tuple[Judge, str]]] = {
        "offline": lambda: (RuleJudge(), "rules"),
        "openai": lambda: (ModelJudge(model), "model"),  # type: ignore[arg-type]
    }
    return judges[cfg.model.backend]()


async def judge_trajectories(trajectories: Sequence[Trajectory], tasks: dict[str, Task], chains: dict[str, ToolChain],
                             judge: Judge, judge_kind: str, keep_threshold: float, run_id: str | None,
                             provenance: Provenance) -> tuple[list[JudgeScore], list[Rejection]]:
    async def one(t: Trajectory) -> tuple[dict[str, float], str]:
        task = tasks.get(t.task_id)
        chain = chains.get(task.chain_id) if task and task.chain_id else None
        return await judge.judge(t, task, chain)

    results = await asyncio.gather(*[one(t) for t in trajectories], return_exceptions=True)
    scores, rejections = [], []
    for t, result in zip(trajectories, results, strict=True):
        if isinstance(result, (ParseError, ProviderError)):
            rejections.append(Rejection(stage="judge", subject=t.id, reason="model_failed", detail=str(result)[:1000],
                                        run_id=run_id))
            continue
        if isinstance(result, BaseException):
            raise result
        dims, rationale = result
        mean = round(sum(dims[d] for d in JudgeScore.DIMENSIONS) / len(JudgeScore.DIMENSIONS), 4)
        scores.append(JudgeScore(trajectory_id=t.id, judge=judge_kind, **dims, mean=mean,  # type: ignore[arg-type]
                                 keep=mean >= keep_threshold, rationale=rationale[:500] or None,
                                 parents=[t.id], run_id=run_id, provenance=provenance))
    return scores, rejections
