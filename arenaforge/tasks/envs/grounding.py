"""Grounding: what the knowledge source itself says an answer is. Evidence is checked, never trusted.

Every tool-needing sub-QA carries typed `Evidence`; `source_answer` runs it on the source as a
parameterised query over a table and columns the source actually has (no SQL from a model ever runs)
and returns the answer the source gives. `check_qa` holds a whole QA instance to that: each tool-needing
sub-answer is what its evidence returns, each reasoning step follows from the answers it combines, and
the main answer is derived from the final sub-answers. Tool data and tool checks use the same
function (`tasks/envs/tool_data.py`), so a tool is right when it agrees with the source.
"""

from __future__ import annotations

import re
from typing import Any

from arenaforge.environments.reward import answer_matches, normalise
from arenaforge.schemas.models import Evidence, QAInstance, SubQA
from arenaforge.schemas.reasons import RejectReason
from arenaforge.tasks.envs.answers import fmt_value, is_number, same_answer
from arenaforge.tasks.envs.knowledge import KnowledgeSource

PASSAGES = "passages"  # a text source's table of passages (tasks/envs/knowledge/astra.py)
_SPACES = re.compile(r"\s+")


class Ungrounded(Exception):
    """The source does not support the answer (a per-record outcome: a rejection with this reason)."""

    def __init__(self, reason: RejectReason, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def _column(source: KnowledgeSource, table: str | None, column: str | None) -> Any:
    """The profiled column, or Ungrounded when the source has no such table or column."""
    profile = source.tables.get(table or "")
    if profile is None:
        raise Ungrounded(RejectReason.EVIDENCE_ERROR, f"source {source.name} has no table {table!r}")
    match = next((c for c in profile.columns if c.name == column), None)
    if match is None:
        raise Ungrounded(RejectReason.EVIDENCE_ERROR, f"table {table} has no column {column!r}")
    return match


def _key_param(source: KnowledgeSource, ev: Evidence) -> Any:
    """The evidence's value as the key column's type (ids arrive as text from a model)."""
    col = _column(source, ev.table, ev.key)
    if ev.value is None:
        raise Ungrounded(RejectReason.EVIDENCE_ERROR, f"evidence names no value of {ev.table}.{ev.key}")
    if not col.numeric:
        return str(ev.value)
    text = str(ev.value).strip()
    if not is_number(text):
        raise Ungrounded(RejectReason.EVIDENCE_MISMATCH, f"{ev.table}.{ev.key} is numeric, {ev.value!r} is not")
    number = float(text)
    return int(number) if number.is_integer() and "INT" in col.dtype.upper() else number


def source_answer(source: KnowledgeSource, ev: Evidence) -> str:
    """The answer the source gives for lookup/count/sum evidence, or for span evidence the verified span."""
    if ev.kind == "span":
        return _span(source, ev)
    if ev.kind not in ("lookup", "count", "sum"):
        raise Ungrounded(RejectReason.EVIDENCE_ERROR, f"{ev.kind} evidence is not a query on the source")
    key = _key_param(source, ev)
    where = f'FROM "{ev.table}" WHERE "{ev.key}" = ?'
    if ev.kind == "count":
        return str(source.query(f"SELECT count(*) {where}", [key])[0][0])
    if ev.kind == "sum":
        col = _column(source, ev.table, ev.column)
        if not col.numeric:
            raise Ungrounded(RejectReason.EVIDENCE_ERROR, f"{ev.table}.{ev.column} is not numeric: it has no total")
        total = source.query(f'SELECT round(sum("{ev.column}"), 2) {where}', [key])[0][0]
        if total is None:
            raise Ungrounded(RejectReason.EVIDENCE_MISMATCH, f"no row of {ev.table} has {ev.key} = {ev.value!r}")
        return fmt_value(total) or ""
    _column(source, ev.table, ev.column)
    # distinct in Python, not SQL: DISTINCT made each lookup cost ~1.5x (a hash aggregate for a row or two)
    rows = list({_same(v): (v,) for (v,) in source.query(f'SELECT "{ev.column}" {where}', [key])}.values())
    if not rows:
        raise Ungrounded(RejectReason.EVIDENCE_MISMATCH, f"no row of {ev.table} has {ev.key} = {ev.value!r}")
    if len(rows) > 1:
        raise Ungrounded(RejectReason.EVIDENCE_MISMATCH,
                         f"{len(rows)} rows of {ev.table} with {ev.key} = {ev.value!r} disagree on {ev.column}")
    value = fmt_value(rows[0][0])
    if value is None or value == "":
        raise Ungrounded(RejectReason.EVIDENCE_MISMATCH, f"{ev.table}.{ev.column} is empty for {ev.key} = {ev.value!r}")
    return value


def _same(value: Any) -> Any:
    """The value as SQL DISTINCT groups it (NaN equals NaN there, not in Python)."""
    return _NAN if isinstance(value, float) and value != value else value


_NAN = object()


def _span(source: KnowledgeSource, ev: Evidence) -> str:
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


def check_sub(source: KnowledgeSource, sub: SubQA, earlier: dict[int, SubQA]) -> None:
    """Raise Ungrounded unless the sub-answer is what its evidence gives."""
    ev = sub.evidence
    if ev is None:
        if sub.needs_tool:
            raise Ungrounded(RejectReason.NO_EVIDENCE, f"sub-QA {sub.index} needs a tool but names no evidence")
        return
    if ev.kind == "compare":
        _check_compare(sub, ev, earlier)
        return
    if not sub.needs_tool:
        raise Ungrounded(RejectReason.EVIDENCE_ERROR, f"sub-QA {sub.index} queries the source but needs no tool")
    got = source_answer(source, ev)
    ok = answer_matches(sub.answer, got) if ev.kind == "span" else same_answer(got, sub.answer)
    if not ok:
        raise Ungrounded(RejectReason.EVIDENCE_MISMATCH,
                         f"sub-QA {sub.index}: the source gives {got!r}, the answer says {sub.answer!r}")


def _check_compare(sub: SubQA, ev: Evidence, earlier: dict[int, SubQA]) -> None:
    if sub.needs_tool or len(ev.of) < 2 or len(ev.labels) != len(ev.of) or ev.op not in ("max", "min"):
        raise Ungrounded(RejectReason.EVIDENCE_ERROR, f"sub-QA {sub.index}: a comparison needs no tool, two or more "
                                                      "earlier sub-QAs, one label each and op max or min")
    if any(i not in earlier for i in ev.of) or not set(ev.of) <= set(sub.depends_on):
        raise Ungrounded(RejectReason.EVIDENCE_ERROR, f"sub-QA {sub.index} compares sub-QAs it does not depend on")
    answers = [earlier[i].answer for i in ev.of]
    if not all(is_number(a) for a in answers):
        raise Ungrounded(RejectReason.EVIDENCE_MISMATCH, f"sub-QA {sub.index} compares answers that are not numbers")
    values = [float(a) for a in answers]
    best = max(values) if ev.op == "max" else min(values)
    if values.count(best) > 1:
        raise Ungrounded(RejectReason.EVIDENCE_MISMATCH, f"sub-QA {sub.index}: the comparison is a tie")
    winner = ev.labels[values.index(best)]
    if not same_answer(winner, sub.answer):
        raise Ungrounded(RejectReason.EVIDENCE_MISMATCH,
                         f"sub-QA {sub.index}: {ev.op} of {answers} is {winner!r}, the answer says {sub.answer!r}")


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
