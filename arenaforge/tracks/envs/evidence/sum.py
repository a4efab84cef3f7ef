"""sum: the total of `column` over the rows of `table` with `value` in `key`, rounded to 2 places."""

from __future__ import annotations

import random
from typing import Any

from arenaforge.schemas.models import Evidence, QAInstance, SubQA
from arenaforge.schemas.reasons import RejectReason
from arenaforge.tracks.envs.answers import fmt_value, human
from arenaforge.tracks.envs.evidence.base import (
    EvidenceKind,
    Ungrounded,
    answers_to_avoid,
    column,
    keyed_where,
    known_table,
    names,
    tool_name,
)
from arenaforge.tracks.envs.knowledge import KnowledgeSource
from arenaforge.tracks.envs.tool_data import ToolData, grouped_data
from arenaforge.tracks.envs.tool_impl import DATA_VAR


class Sum(EvidenceKind):
    name = "sum"
    returns = "number"

    def answer(self, source: KnowledgeSource, ev: Evidence) -> str:
        where, key = keyed_where(source, ev)
        if not column(source, ev.table, ev.column).numeric:
            raise Ungrounded(RejectReason.EVIDENCE_ERROR, f"{ev.table}.{ev.column} is not numeric: it has no total")
        total = source.query(f'SELECT round(sum("{ev.column}"), 2) {where}', [key])[0][0]
        if total is None:
            raise Ungrounded(RejectReason.EVIDENCE_MISMATCH, f"no row of {ev.table} has {ev.key} = {ev.value!r}")
        return fmt_value(total) or ""

    def data(self, source: KnowledgeSource, qa: QAInstance, sub: SubQA, rng: random.Random) -> ToolData:
        ev = sub.evidence
        assert ev is not None
        known_table(source, ev)
        return grouped_data(source, ev, sub, rng, answers_to_avoid(qa), measure=ev.column, filter_by=None)

    def computes(self, ev: Evidence) -> str:
        return f"the total {ev.column} of the {ev.table} rows whose {ev.key} is given (2 decimals)"

    def code(self, data: ToolData, name: str) -> str:
        table, key, column = names(data.evidence)
        return f'''
def {name}({key}, decimals=2):
    """Total {human(column)} of the {human(table)} whose {human(key)} is the given value."""
    rows = [r for r in {DATA_VAR}["{name}"] if r["{key}"] == str({key}).strip()]
    if not rows:
        raise ValueError("no {human(table)} with {human(key)} " + repr({key}))
    return {{"total_{column}": round(sum(float(r["{column}"] or 0) for r in rows), int(decimals))}}
'''

    def template_doc(self, data: ToolData) -> dict[str, Any]:
        table, key, column = names(data.evidence)
        return {"name": tool_name("total", column, "of", table, "by", key),
                "description": f"Sum the {human(column)} over the {human(table)} with a given {human(key)}.",
                "parameters": {"type": "object", "properties": {
                    key: {"type": data.key_type, "description": f"The {human(key)} to total over."},
                    "decimals": {"type": "integer", "minimum": 0, "maximum": 4,
                                 "description": "Decimal places of the result (default 2)."}},
                    "required": [key]}}
