"""Offline answers of `envs.verify_qa`: ASTRA's four checks decided by rules over the QA instance.

  dependency_consistency  every dependency is used: the dependency's answer appears in the
                          dependent sub-question (so it is logically necessary), no sub-QA
                          depends on itself
  sub_question_atomicity  one question mark per sub-question (typed evidence is one table or
                          passage by construction)
  sequential_rationality  dependencies point to earlier sub-QAs, so index order is a valid
                          execution order
  task_completeness       every sub-QA feeds the answer, and the main answer is derivable from
                          the final sub-answers (equals one, or lists them all)
"""

from __future__ import annotations

import math
from typing import Any

from arenaforge.environments.reward import normalise
from arenaforge.schemas.models import QAInstance
from arenaforge.services.models import ChatRequest
from arenaforge.services.models.providers.offline import OfflineModel
from arenaforge.tracks.envs.verify_qa import CHECKS, mentions, tool_necessity


def verify_qa(request: ChatRequest, model: OfflineModel) -> dict[str, Any]:
    qa: QAInstance = request.inputs
    checks, notes = rule_checks(qa)
    return {**{c: int(checks[c]) for c in CHECKS},
            "tool_necessity": [{"index": int(k), "needs_tool": v} for k, v in tool_necessity(qa).items()],
            "reasons": notes}


def rule_checks(qa: QAInstance) -> tuple[dict[str, bool], list[str]]:
    """The four checks by rule, with a note per failure."""
    subs = {s.index: s for s in qa.sub_qas}
    notes: list[str] = []
    dep_ok = True
    for s in qa.sub_qas:
        for d in s.depends_on:
            if d == s.index or d not in subs:
                dep_ok = False
                notes.append(f"sub-QA {s.index} depends on {d}, which it cannot")
            elif not mentions(subs[d].answer, s.question):
                dep_ok = False
                notes.append(f"sub-QA {s.index} never uses the answer of sub-QA {d}")
    atomic = True  # typed evidence is one table (or one passage) by construction: a question asks one thing
    for s in qa.sub_qas:
        if s.question.count("?") != 1:
            atomic = False
            notes.append(f"sub-QA {s.index} asks {s.question.count('?')} questions")
    sequential = all(d < s.index for s in qa.sub_qas for d in s.depends_on) and sorted(subs) == list(
        range(1, len(subs) + 1))
    if not sequential:
        notes.append("dependencies do not follow the sub-QA order")
    needed = {d for s in qa.sub_qas for d in s.depends_on}
    sinks = [s for s in qa.sub_qas if s.index not in needed]
    derivable = any(_same_answer(s.answer, qa.main_answer) for s in sinks) or (
        len(sinks) > 1 and all(mentions(s.answer, qa.main_answer) for s in sinks))
    complete = derivable
    if not complete:
        notes.append("the main answer does not follow from the final sub-answers")
    checks = {"dependency_consistency": dep_ok, "sub_question_atomicity": atomic,
              "sequential_rationality": sequential, "task_completeness": complete}
    return checks, notes


def _same_answer(a: str, b: str) -> bool:
    try:
        return math.isclose(float(a), float(b), rel_tol=1e-9)
    except ValueError:
        return normalise(a) == normalise(b)
