"""QA verification (ASTRA §1b.2): four 0/1 checks, QS = their mean, a keep rule, structural checks.

The four checks, asked of the run's model with tracks/envs/prompts/envs_verify_qa.txt (the offline
provider answers with the programmatic rules of `rule_checks`):

  dependency_consistency  every dependency is used: the dependency's answer appears in the
                          dependent sub-question (so it is logically necessary), no sub-QA
                          depends on itself
  sub_question_atomicity  one question mark per sub-question and, where SQL evidence exists,
                          one single-table SELECT (no JOIN, no second statement)
  sequential_rationality  dependencies point to earlier sub-QAs, so index order is a valid
                          execution order
  task_completeness       every sub-QA feeds the answer, and the main answer is derivable from
                          the final sub-answers (equals one, or lists them all)

Structural checks are always programmatic and must all pass whatever QS is: the graph is
acyclic, the hop level is within the budget, every sub-QA that another depends on needs a
tool (only final reasoning steps may be tool-free), and no tool-needing sub-answer is
already in the main question (tool necessity, recorded per sub-question).

Keep rule: `threshold` (QS >= value) or `percentile` (QS >= the p-th percentile of the
batch's QS). Every instance gets a `QAVerification` row; the refused ones also a `Rejection`.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from arenaforge.environments.reward import answer_matches, normalise
from arenaforge.schemas.errors import ProviderError
from arenaforge.schemas.kinds_envs import QAVerification
from arenaforge.schemas.models import QAInstance, Rejection
from arenaforge.services.models import ChatModel, Step, complete_json, graded_by
from arenaforge.tracks.envs.decompose_qa import hop_level, qa_payload
from arenaforge.tracks.envs.prompts import load_prompt


def _offline_rules() -> ModuleType:
    from arenaforge.tracks.envs import offline_verify  # its rules read this module's types: loaded after it

    return offline_verify


CHECKS = ("dependency_consistency", "sub_question_atomicity", "sequential_rationality", "task_completeness")


@dataclass(frozen=True)
class KeepRule:
    mode: str = "threshold"  # or "percentile"
    threshold: float = 0.75
    percentile: float = 85.0

    def cutoff(self, scores: list[float]) -> float:
        if self.mode == "threshold" or not scores:
            return self.threshold
        ordered = sorted(scores)
        rank = (len(ordered) - 1) * self.percentile / 100.0
        lo, hi = math.floor(rank), math.ceil(rank)
        return ordered[lo] + (ordered[hi] - ordered[lo]) * (rank - lo)

    def describe(self, cutoff: float) -> str:
        return f"qs>={cutoff:g}" if self.mode == "threshold" else f"qs>=p{self.percentile:g} ({cutoff:.3f})"


@dataclass(frozen=True)
class Judgement:
    checks: dict[str, bool]
    tool_necessity: dict[str, bool] | None = None  # None: use the programmatic one
    notes: tuple[str, ...] = ()


def mentions(answer: str, text: str) -> bool:
    """Whether `answer` occurs in `text` as a whole token run (numbers as whole numeric tokens)."""
    try:
        value = float(answer.replace(",", ""))
    except ValueError:
        return answer_matches(answer, text)
    for token in normalise(text).split():
        try:
            if math.isclose(float(token.replace(",", "")), value, rel_tol=1e-9, abs_tol=1e-9):
                return True
        except ValueError:
            continue
    return False


def tool_necessity(qa: QAInstance) -> dict[str, bool]:
    """Sub-QA index (as text) -> whether answering it needs a tool: it is marked so and its answer is not
    already in the main question."""
    return {str(s.index): bool(s.needs_tool and not mentions(s.answer, qa.main_question)) for s in qa.sub_qas}


def structural_checks(qa: QAInstance, min_hops: int, max_hops: int) -> tuple[dict[str, bool], dict[str, bool], list[str]]:
    """(structural checks, tool necessity per sub-QA, reasons)."""
    reasons: list[str] = []
    try:
        hops = hop_level(qa.sub_qas)
        acyclic = True
    except (ValueError, KeyError, RecursionError):
        hops, acyclic = 0, False
        reasons.append("dependency graph has a cycle")
    within = acyclic and min_hops <= hops <= max_hops and hops == qa.hop_level
    if acyclic and not within:
        reasons.append(f"hop level {hops} outside budget {min_hops}..{max_hops} (claimed {qa.hop_level})")
    depended = {d for s in qa.sub_qas for d in s.depends_on}
    intermediate = all(s.needs_tool for s in qa.sub_qas if s.index in depended)
    if not intermediate:
        reasons.append("a sub-QA other sub-QAs depend on needs no tool")
    necessity = tool_necessity(qa)
    hidden = all(necessity[str(s.index)] for s in qa.sub_qas if s.needs_tool)
    if not hidden:
        leaked = [s.index for s in qa.sub_qas if s.needs_tool and not necessity[str(s.index)]]
        reasons.append(f"sub-answers {leaked} are already in the main question (no tool needed)")
    some_tool = any(s.needs_tool for s in qa.sub_qas)
    if not some_tool:
        reasons.append("no sub-QA needs a tool")
    return ({"acyclic": acyclic, "hops_within_budget": within, "intermediate_needs_tool": intermediate,
             "answers_hidden": hidden, "needs_some_tool": some_tool}, necessity, reasons)


@dataclass
class VerifyResult:
    verifications: list[QAVerification]
    kept: list[QAInstance]
    rejections: list[Rejection]


async def judge_one(judge: QAJudge, qa: QAInstance, run_id: str | None = None) -> Judgement | Rejection:
    """One instance's judgement, or the rejection a failed model answer becomes."""
    try:
        return await judge.judge(qa)
    except ProviderError as err:  # invalid output or a failed endpoint: the error's kind says which
        return Rejection.of_error("verify_qa", qa.id, err, parents=[qa.id], run_id=run_id)


async def verify_batch(judge: QAJudge, instances: list[QAInstance], rule: KeepRule, min_hops: int, max_hops: int,
                       run_id: str | None = None,
                       started: dict[str, Awaitable[Judgement | Rejection]] | None = None) -> VerifyResult:
    """Judge every instance, apply the keep rule over the batch, and explain every refusal.

    `started` holds judgements already under way (begun as each instance was synthesized, so
    the model endpoint never idles between the two stages); the rest are judged here.
    """
    started = started or {}

    async def one(qa: QAInstance) -> Judgement | Rejection:
        pending = started.get(qa.id)
        return await pending if pending is not None else await judge_one(judge, qa, run_id)

    judged = await asyncio.gather(*(one(qa) for qa in instances))
    rejections = [j for j in judged if isinstance(j, Rejection)]
    scored = [(qa, j) for qa, j in zip(instances, judged, strict=True) if isinstance(j, Judgement)]
    qs_all = [sum(j.checks.values()) / len(CHECKS) for _, j in scored]
    cutoff = rule.cutoff(qs_all)
    out = VerifyResult([], [], rejections)
    for (qa, j), qs in zip(scored, qs_all, strict=True):
        structural, necessity, reasons = structural_checks(qa, min_hops, max_hops)
        if j.tool_necessity:  # the model's verdict can only remove tool necessity, never invent it
            necessity = {k: v and j.tool_necessity.get(k, v) for k, v in necessity.items()}
        failed = [c for c in CHECKS if not j.checks.get(c, False)]
        kept = all(structural.values()) and qs >= cutoff - 1e-12
        why = [f"failed {c}" for c in failed] + reasons + list(j.notes)
        if qs < cutoff - 1e-12:
            why.insert(0, f"qs {qs:.2f} below {rule.describe(cutoff)}")
        ver = QAVerification(qa_id=qa.id, verifier=judge.verifier, checks={c: bool(j.checks.get(c)) for c in CHECKS},  # type: ignore[arg-type]
                             qs=qs, structural=structural, tool_necessity=necessity, keep_rule=rule.describe(cutoff),
                             kept=kept, reasons=[] if kept else why, parents=[qa.id], run_id=run_id)
        out.verifications.append(ver)
        if kept:
            out.kept.append(qa)
        else:
            out.rejections.append(Rejection(stage="verify_qa", subject=qa.id, reason=_reason_code(structural, failed, qs, cutoff),
                                            detail="; ".join(why)[:1000], parents=[qa.id, ver.id], run_id=run_id))
    return out


def _reason_code(structural: dict[str, bool], failed: list[str], qs: float, cutoff: float) -> str:
    broken = [k for k, v in structural.items() if not v]
    if broken:
        return f"structure:{broken[0]}"
    if qs < cutoff:
        return "low_quality_score"
    return f"check:{failed[0]}" if failed else "rejected"


# --------------------------------------------------------------------------- openai
VERIFY_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": [*CHECKS, "tool_necessity"],
    "properties": {
        **{c: {"type": "integer", "enum": [0, 1]} for c in CHECKS},
        "tool_necessity": {"type": "array", "items": {
            "type": "object", "required": ["index", "needs_tool"],
            "properties": {"index": {"type": "integer"}, "needs_tool": {"type": "boolean"}}}},
        "reasons": {"type": "array", "items": {"type": "string"}},
    },
}


VERIFY = Step("envs.verify_qa", prompt="envs_verify_qa", schema=VERIFY_SCHEMA, max_tokens=300,
              offline=lambda: _offline_rules().verify_qa)


class QAJudge:
    """Asks the run's model the four checks and which sub-QAs need a tool."""

    def __init__(self, model: ChatModel) -> None:
        self.model = model
        self.verifier = graded_by(model)
        self.prompt = load_prompt(VERIFY.prompt)

    async def judge(self, qa: QAInstance) -> Judgement:
        answer = await complete_json(self.model, VERIFY, lambda: self.prompt.render(qa=qa_payload(qa)),
                                     temperature=0.0, inputs=qa)
        necessity = {str(t["index"]): bool(t["needs_tool"]) for t in answer["tool_necessity"]}
        return Judgement(checks={c: bool(answer[c]) for c in CHECKS}, tool_necessity=necessity,
                         notes=tuple(answer.get("reasons", [])))
