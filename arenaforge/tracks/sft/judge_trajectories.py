"""Seven-dimension trajectory scores and the SFT keep decision (ASTRA §1a.5).

Dimensions (each 0..1, `JudgeScore.DIMENSIONS`): query understanding, planning, tool-response
understanding, context-conditioned planning, tool-call status, tool conciseness, final-answer
quality; `mean` is their average and `keep = mean >= cfg.sft.keep_threshold`.

The run's model scores with the `sft_judge_trajectory` prompt (seven numbers and a rationale); the
offline provider computes them from the conversation itself (`tracks/sft/offline_judge.py`).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from arenaforge.environments.reward import normalise
from arenaforge.schemas.base import Provenance
from arenaforge.schemas.errors import ParseError, ProviderError
from arenaforge.schemas.models import JudgeScore, Rejection, Task, ToolChain, Trajectory
from arenaforge.services.models import ChatModel, Step, complete_json, graded_by
from arenaforge.tracks.sft.grounded_arguments import invented_argument, json_leaves
from arenaforge.tracks.sft.prompts import load_prompt


def _offline_rules() -> ModuleType:
    from arenaforge.tracks.sft import offline_judge  # its rules read this module's types: loaded after it

    return offline_judge


JUDGE_SCHEMA = {
    "type": "object",
    "properties": {**{d: {"type": "number", "minimum": 0, "maximum": 1} for d in JudgeScore.DIMENSIONS},
                   "rationale": {"type": "string", "maxLength": 400}},
    "required": list(JudgeScore.DIMENSIONS),
}


JUDGE_TRAJECTORY = Step("sft.judge_trajectory", prompt="sft_judge_trajectory", schema=JUDGE_SCHEMA, max_tokens=300,
                        offline=lambda: _offline_rules().judge_trajectory)


@dataclass(frozen=True)
class JudgeInputs:
    trajectory: Trajectory
    task: Task | None
    chain: ToolChain | None


class TrajectoryJudge:
    """The seven dimensions of a trajectory, from the run's model."""

    def __init__(self, model: ChatModel) -> None:
        self.model = model
        self.kind = graded_by(model)
        self.prompt = load_prompt(JUDGE_TRAJECTORY.prompt)

    async def judge(self, trajectory: Trajectory, task: Task | None, chain: ToolChain | None
                    ) -> tuple[dict[str, float], str]:
        def text() -> str:
            convo = "\n".join(_render(m) for m in trajectory.messages[1:])
            return self.prompt.render(conversation=convo[:12000], chain=" -> ".join(chain.tools) if chain else "(none)")

        out = await complete_json(self.model, JUDGE_TRAJECTORY, text, inputs=JudgeInputs(trajectory, task, chain))
        return {d: round(float(out[d]), 4) for d in JudgeScore.DIMENSIONS}, str(out.get("rationale", ""))


def _render(m: Any) -> str:
    if m.tool_calls:
        calls = "; ".join(f"{c.function.name}({c.function.arguments})" for c in m.tool_calls)
        return f"[assistant] {m.content or ''} CALLS {calls}"
    return f"[{m.role}{' ' + m.name if m.name else ''}] {(m.content or '')[:800]}"


def ungrounded(trajectory: Trajectory) -> str | None:
    """Why the conversation does not show a grounded answer (None when it does): no tool returned a result, no
    final answer, or a final answer that repeats nothing a tool returned."""
    results = [m.content or "" for m in trajectory.messages if m.role == "tool"
               and not (m.content or "").lstrip().lower().startswith("error")]
    final = next((m.content for m in reversed(trajectory.messages) if m.role == "assistant" and not m.tool_calls), None)
    if not results:
        return "no tool call returned a result"
    if not final or not final.strip():
        return "no final answer"
    said = normalise(final)
    values = {normalise(v) for text in results for v in _scalars(text)}
    if not any(len(v) >= 2 and v in said for v in values):
        return "the final answer repeats no value the tools returned"
    return None


def _scalars(text: str) -> list[str]:
    """The scalar values of a tool result (its JSON's leaves, or the text itself)."""
    try:
        data = json.loads(text)
    except ValueError:
        return [text.strip()]
    return [str(leaf) for leaf in json_leaves(data)]


async def judge_trajectories(trajectories: Sequence[Trajectory], tasks: dict[str, Task], chains: dict[str, ToolChain],
                             judge: TrajectoryJudge, keep_threshold: float, run_id: str | None,
                             provenance: Provenance, grounded_arguments: bool = False
                             ) -> tuple[list[JudgeScore], list[Rejection]]:
    async def one(t: Trajectory) -> tuple[dict[str, float], str]:
        task = tasks.get(t.task_id)
        chain = chains.get(task.chain_id) if task and task.chain_id else None
        return await judge.judge(t, task, chain)

    results = await asyncio.gather(*[one(t) for t in trajectories], return_exceptions=True)
    scores, rejections = [], []
    for t, result in zip(trajectories, results, strict=True):
        if isinstance(result, (ParseError, ProviderError)):
            rejections.append(Rejection.of_error("judge", t.id, result, run_id=run_id))
            continue
        if isinstance(result, BaseException):
            raise result
        dims, rationale = result
        mean = round(sum(dims[d] for d in JudgeScore.DIMENSIONS) / len(JudgeScore.DIMENSIONS), 4)
        # a model judge's word alone keeps nothing: the conversation itself must show a grounded answer (rules
        # compute their dimensions from the conversation already); with grounded arguments, no judge keeps a call
        # on an identifier or number that no message gave
        unsupported = ((ungrounded(t) if judge.model.decides_by == "model" else None)
                       or (invented_argument(t.messages) if grounded_arguments else None))
        if unsupported:
            rationale = f"not kept whatever the judge says: {unsupported}. Judge: {rationale}"
        scores.append(JudgeScore(trajectory_id=t.id, judge=judge.kind, **dims, mean=mean,  # type: ignore[arg-type]
                                 keep=mean >= keep_threshold and not unsupported, rationale=rationale[:500] or None,
                                 parents=[t.id], run_id=run_id, provenance=provenance))
    return scores, rejections
