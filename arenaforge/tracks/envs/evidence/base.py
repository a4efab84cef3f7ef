"""What every evidence kind answers (`EvidenceKind`), and the checked queries on a knowledge source they share.

A kind's defaults here are those of a kind that is no query on the source and no tool (a reasoning step); the
table-query kinds (lookup, count, sum) override them. Rejections are values: `Ungrounded` (the source does not
support an answer) and `BuildError` (no tool can be built from the evidence).
"""

from __future__ import annotations

import random
import re
from typing import Any, ClassVar

from arenaforge.schemas.models import Evidence, QAInstance, SubQA
from arenaforge.schemas.reasons import RejectReason
from arenaforge.tracks.envs.answers import is_number, same_answer
from arenaforge.tracks.envs.knowledge import KnowledgeSource
from arenaforge.tracks.envs.tool_data import ToolData
from arenaforge.tracks.envs.tool_impl import BuildError

PASSAGES = "passages"  # a text source's table of passages (tracks/envs/knowledge/astra.py)
_MAX_NAME = 64  # longest template tool name


class Ungrounded(Exception):
    """The source does not support the answer (a per-record outcome: a rejection with this reason)."""

    def __init__(self, reason: RejectReason, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


class EvidenceKind:
    """One kind of `Evidence`: how it reads to people, how the source grounds it, what tool it makes."""

    name: ClassVar[str]
    returns: ClassVar[str] = "object"  # JSON type its tool returns (the tail of a merge signature)

    def summary(self, ev: Evidence) -> str:
        """One line for people: `lookup customers.city by customer_id = CU107`."""
        return f"{ev.kind} {self.target(ev)} by {ev.key} = {ev.value}"

    def target(self, ev: Evidence) -> str:
        """What the query reads: `table.column` (a count reads whole rows: `table`)."""
        return f"{ev.table}.{ev.column}"

    def answer(self, source: KnowledgeSource, ev: Evidence) -> str:
        """The answer the source gives for this evidence."""
        raise Ungrounded(RejectReason.EVIDENCE_ERROR, f"{ev.kind} evidence is not a query on the source")

    def ground(self, source: KnowledgeSource, sub: SubQA, earlier: dict[int, SubQA]) -> None:
        """Raise Ungrounded unless the sub-answer is what its evidence gives (`earlier`: the sub-QAs before it)."""
        assert sub.evidence is not None
        if not sub.needs_tool:
            raise Ungrounded(RejectReason.EVIDENCE_ERROR, f"sub-QA {sub.index} queries the source but needs no tool")
        got = self.answer(source, sub.evidence)
        if not self.matches(sub.answer, got):
            raise Ungrounded(RejectReason.EVIDENCE_MISMATCH,
                             f"sub-QA {sub.index}: the source gives {got!r}, the answer says {sub.answer!r}")

    def matches(self, answer: str, got: str) -> bool:
        """Whether the stated answer is the one the source gave."""
        return same_answer(got, answer)

    def data(self, source: KnowledgeSource, qa: QAInstance, sub: SubQA, rng: random.Random) -> ToolData:
        """The data of the tool that answers `sub`, from the source; BuildError when this kind makes no tool."""
        raise BuildError("no_evidence", f"sub-QA {sub.index} has no evidence a tool can be built from")

    def computes(self, ev: Evidence) -> str:
        """The evidence as the tool-writing prompts state it."""
        raise NotImplementedError(f"{ev.kind} evidence makes no tool")

    def code(self, data: ToolData, name: str) -> str:
        """A standard-library function `name` over `DATA[name]` computing the evidence's operation."""
        raise NotImplementedError(f"{data.evidence.kind} evidence makes no tool")

    def template_doc(self, data: ToolData) -> dict[str, Any]:
        """The template tool document over `data` (the offline provider's, with its optional parameters)."""
        raise NotImplementedError(f"{data.evidence.kind} evidence makes no tool")


def column(source: KnowledgeSource, table: str | None, name: str | None) -> Any:
    """The profiled column, or Ungrounded when the source has no such table or column."""
    profile = source.tables.get(table or "")
    if profile is None:
        raise Ungrounded(RejectReason.EVIDENCE_ERROR, f"source {source.name} has no table {table!r}")
    match = next((c for c in profile.columns if c.name == name), None)
    if match is None:
        raise Ungrounded(RejectReason.EVIDENCE_ERROR, f"table {table} has no column {name!r}")
    return match


def keyed_where(source: KnowledgeSource, ev: Evidence) -> tuple[str, Any]:
    """(`FROM ... WHERE key = ?`, the evidence's value as the key column's type: ids arrive as text from a model)."""
    col = column(source, ev.table, ev.key)
    if ev.value is None:
        raise Ungrounded(RejectReason.EVIDENCE_ERROR, f"evidence names no value of {ev.table}.{ev.key}")
    where = f'FROM "{ev.table}" WHERE "{ev.key}" = ?'
    if not col.numeric:
        return where, str(ev.value)
    text = str(ev.value).strip()
    if not is_number(text):
        raise Ungrounded(RejectReason.EVIDENCE_MISMATCH, f"{ev.table}.{ev.key} is numeric, {ev.value!r} is not")
    number = float(text)
    return where, int(number) if number.is_integer() and "INT" in col.dtype.upper() else number


def known_table(source: KnowledgeSource, ev: Evidence) -> None:
    """BuildError unless the evidence's table is in the source."""
    if ev.table not in source.tables:
        raise BuildError("unknown_table", f"table {ev.table} is not in source {source.name}")


def answers_to_avoid(qa: QAInstance) -> list[str]:
    """Answers the other records a tool holds must not give: this sub-QA's, nor any other of the QA's (parallel
    lookups share a tool)."""
    return [s.answer for s in qa.sub_qas if s.needs_tool]


def names(ev: Evidence) -> tuple[str, str, str]:
    """(table, key, column) of a table query, "" for any it leaves out: what a template writes into a tool."""
    return ev.table or "", ev.key or "", ev.column or ""


def tool_name(*parts: str) -> str:
    return re.sub(r"[^A-Za-z0-9_]+", "_", "_".join(parts)).strip("_").lower()[:_MAX_NAME]


def article(noun: str) -> str:
    return ("an " if noun[:1].lower() in "aeiou" else "a ") + noun
