"""Evidence kinds: each kind of `Evidence` (schemas/models.py, plain data whose ids never change) is one class here
with its own summary, grounding on the knowledge source, tool data, tool code and template document.

Callers ask `kind_of(evidence)` and call the method; none compares `evidence.kind`. Adding a kind: a module with
its `EvidenceKind` subclass plus its entry in `KINDS`, appended (the decomposition answer schema lists the kinds in
this order, `decompose_qa.py`), and its name in `Evidence.kind` (tests/tasks/envs/test_evidence_kinds.py checks both).
"""

from __future__ import annotations

import random

from arenaforge.schemas.models import Evidence, QAInstance, SubQA
from arenaforge.tracks.envs.evidence.base import PASSAGES, EvidenceKind, Ungrounded
from arenaforge.tracks.envs.evidence.compare import Compare
from arenaforge.tracks.envs.evidence.count import Count
from arenaforge.tracks.envs.evidence.lookup import Lookup
from arenaforge.tracks.envs.evidence.span import Span
from arenaforge.tracks.envs.evidence.sum import Sum
from arenaforge.tracks.envs.knowledge import KnowledgeSource
from arenaforge.tracks.envs.tool_data import ToolData
from arenaforge.tracks.envs.tool_impl import BuildError

__all__ = ["KINDS", "PASSAGES", "EvidenceKind", "Lookup", "Ungrounded", "kind_of", "tool_data"]

KINDS: dict[str, EvidenceKind] = {kind.name: kind for kind in (Lookup(), Count(), Sum(), Span(), Compare())}


def kind_of(evidence: Evidence) -> EvidenceKind:
    """The class that knows how `evidence` behaves."""
    return KINDS[evidence.kind]


def tool_data(source: KnowledgeSource, qa: QAInstance, sub: SubQA, rng: random.Random) -> ToolData:
    """The data of the tool that answers `sub`, from the source; BuildError when its evidence has no tool shape."""
    if sub.evidence is None:
        raise BuildError("no_evidence", f"sub-QA {sub.index} has no evidence a tool can be built from")
    return kind_of(sub.evidence).data(source, qa, sub, rng)
