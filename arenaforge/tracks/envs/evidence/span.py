"""span: `text`, found verbatim in passage `passage` of a text source (its `passages` table); its tool looks
passages up by id, so it is built as a lookup of the passage's text."""

from __future__ import annotations

import random
import re

from arenaforge.environments.reward import answer_matches
from arenaforge.schemas.models import Evidence, QAInstance, SubQA
from arenaforge.schemas.reasons import RejectReason
from arenaforge.tracks.envs.evidence.base import PASSAGES, EvidenceKind, Ungrounded, answers_to_avoid, known_table
from arenaforge.tracks.envs.knowledge import KnowledgeSource
from arenaforge.tracks.envs.tool_data import ToolData, keyed_data

_SPACES = re.compile(r"\s+")


class Span(EvidenceKind):
    name = "span"

    def summary(self, ev: Evidence) -> str:
        return f"span of passage {ev.passage}: {ev.text!r}"

    def answer(self, source: KnowledgeSource, ev: Evidence) -> str:
        """The verified span."""
        passages = source.tables.get(PASSAGES)
        if passages is None or passages.key is None:
            raise Ungrounded(RejectReason.EVIDENCE_ERROR, f"source {source.name} has no passages to quote")
        rows = source.query(f'SELECT "text" FROM "{PASSAGES}" WHERE "{passages.key}" = ?', [str(ev.passage)])
        if not rows:
            raise Ungrounded(RejectReason.EVIDENCE_MISMATCH, f"no passage {ev.passage!r}")
        quote = _SPACES.sub(" ", (ev.text or "").strip())
        if not quote or quote not in _SPACES.sub(" ", str(rows[0][0])):
            raise Ungrounded(RejectReason.EVIDENCE_MISMATCH, f"passage {ev.passage} does not contain {ev.text!r}")
        return quote

    def matches(self, answer: str, got: str) -> bool:
        return answer_matches(answer, got)

    def data(self, source: KnowledgeSource, qa: QAInstance, sub: SubQA, rng: random.Random) -> ToolData:
        assert sub.evidence is not None
        ev = Evidence(kind="lookup", table=PASSAGES, key=source.tables[PASSAGES].key, value=sub.evidence.passage,
                      column="text")
        known_table(source, ev)
        # the answer is inside the passage, not the whole of it
        return keyed_data(source, ev, sub, rng, answers_to_avoid(qa), exact=False)
