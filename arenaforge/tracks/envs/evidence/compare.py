"""compare: a reasoning step, no query: of the sub-QAs `of`, the `labels` entry of the one whose answer is largest
(op max) or smallest (op min). It needs no tool."""

from __future__ import annotations

from arenaforge.schemas.models import Evidence, SubQA
from arenaforge.schemas.reasons import RejectReason
from arenaforge.tracks.envs.answers import is_number, same_answer
from arenaforge.tracks.envs.evidence.base import EvidenceKind, Ungrounded
from arenaforge.tracks.envs.knowledge import KnowledgeSource


class Compare(EvidenceKind):
    name = "compare"

    def summary(self, ev: Evidence) -> str:
        return f"{ev.op} of sub-QAs {ev.of} ({', '.join(ev.labels)})"

    def ground(self, source: KnowledgeSource, sub: SubQA, earlier: dict[int, SubQA]) -> None:
        ev = sub.evidence
        assert ev is not None
        if sub.needs_tool or len(ev.of) < 2 or len(ev.labels) != len(ev.of) or ev.op not in ("max", "min"):
            raise Ungrounded(RejectReason.EVIDENCE_ERROR, f"sub-QA {sub.index}: a comparison needs no tool, two or "
                                                          "more earlier sub-QAs, one label each and op max or min")
        if any(i not in earlier for i in ev.of) or not set(ev.of) <= set(sub.depends_on):
            raise Ungrounded(RejectReason.EVIDENCE_ERROR, f"sub-QA {sub.index} compares sub-QAs it does not depend on")
        answers = [earlier[i].answer for i in ev.of]
        if not all(is_number(a) for a in answers):
            raise Ungrounded(RejectReason.EVIDENCE_MISMATCH,
                             f"sub-QA {sub.index} compares answers that are not numbers")
        values = [float(a) for a in answers]
        best = max(values) if ev.op == "max" else min(values)
        if values.count(best) > 1:
            raise Ungrounded(RejectReason.EVIDENCE_MISMATCH, f"sub-QA {sub.index}: the comparison is a tie")
        winner = ev.labels[values.index(best)]
        if not same_answer(winner, sub.answer):
            raise Ungrounded(RejectReason.EVIDENCE_MISMATCH,
                             f"sub-QA {sub.index}: {ev.op} of {answers} is {winner!r}, the answer says {sub.answer!r}")
