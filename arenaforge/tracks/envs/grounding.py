"""Grounding: what the knowledge source itself says an answer is. Evidence is checked, never trusted.

Every tool-needing sub-QA carries typed `Evidence`; `source_answer` runs it on the source as a
parameterised query over a table and columns the source actually has (no SQL from a model ever runs)
and returns the answer the source gives. `check_qa` holds a whole QA instance to that: each tool-needing
sub-answer is what its evidence returns, each reasoning step follows from the answers it combines, and
the main answer is derived from the final sub-answers. Each evidence kind grounds itself
(`tracks/envs/evidence/`); tool data and tool checks use the same queries, so a tool is right when it
agrees with the source.
"""

from __future__ import annotations

from arenaforge.environments.reward import answer_matches, normalise
from arenaforge.schemas.models import Evidence, QAInstance, SubQA
from arenaforge.schemas.reasons import RejectReason
from arenaforge.tracks.envs.answers import same_answer
from arenaforge.tracks.envs.evidence import PASSAGES, Ungrounded, kind_of
from arenaforge.tracks.envs.knowledge import KnowledgeSource

__all__ = ["PASSAGES", "Ungrounded", "check_qa", "check_sub", "source_answer"]


def source_answer(source: KnowledgeSource, ev: Evidence) -> str:
    """The answer the source gives for lookup/count/sum evidence, or for span evidence the verified span."""
    return kind_of(ev).answer(source, ev)


def check_sub(source: KnowledgeSource, sub: SubQA, earlier: dict[int, SubQA]) -> None:
    """Raise Ungrounded unless the sub-answer is what its evidence gives."""
    if sub.evidence is None:
        if sub.needs_tool:
            raise Ungrounded(RejectReason.NO_EVIDENCE, f"sub-QA {sub.index} needs a tool but names no evidence")
        return
    kind_of(sub.evidence).ground(source, sub, earlier)


def check_qa(source: KnowledgeSource, qa: QAInstance) -> None:
    """Raise Ungrounded unless every sub-answer is grounded and the main answer follows from the final ones."""
    earlier: dict[int, SubQA] = {}
    for sub in sorted(qa.sub_qas, key=lambda s: s.index):
        check_sub(source, sub, earlier)
        earlier[sub.index] = sub
    needed = {d for s in qa.sub_qas for d in s.depends_on}
    finals = [s.answer for s in qa.sub_qas if s.index not in needed]
    derived = (len(finals) == 1 and same_answer(finals[0], qa.main_answer)) or (
        len(finals) > 1 and all(_mentions(a, qa.main_answer) for a in finals))
    if not derived:
        raise Ungrounded(RejectReason.UNGROUNDED_MAIN_ANSWER,
                         f"the main answer {qa.main_answer!r} does not follow from the final sub-answers {finals}")


def _mentions(answer: str, text: str) -> bool:
    return answer_matches(answer, text) or normalise(answer) in normalise(text)
