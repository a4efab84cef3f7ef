"""lookup: the `column` of the `table` row whose `key` column holds `value`; its tool looks a record up by key."""

from __future__ import annotations

import random
from typing import Any

from arenaforge.schemas.models import Evidence, QAInstance, SubQA
from arenaforge.schemas.reasons import RejectReason
from arenaforge.tracks.envs.answers import entity, fmt_value, human
from arenaforge.tracks.envs.evidence.base import (
    EvidenceKind,
    Ungrounded,
    answers_to_avoid,
    article,
    column,
    keyed_where,
    known_table,
    names,
    tool_name,
)
from arenaforge.tracks.envs.knowledge import KnowledgeSource
from arenaforge.tracks.envs.tool_data import ToolData, keyed_data
from arenaforge.tracks.envs.tool_impl import DATA_VAR

_NAN = object()


class Lookup(EvidenceKind):
    name = "lookup"

    def answer(self, source: KnowledgeSource, ev: Evidence) -> str:
        where, key = keyed_where(source, ev)
        column(source, ev.table, ev.column)
        # distinct in Python, not SQL: DISTINCT made each lookup cost ~1.5x (a hash aggregate for a row or two)
        rows = list({_same(v): (v,) for (v,) in source.query(f'SELECT "{ev.column}" {where}', [key])}.values())
        if not rows:
            raise Ungrounded(RejectReason.EVIDENCE_MISMATCH, f"no row of {ev.table} has {ev.key} = {ev.value!r}")
        if len(rows) > 1:
            raise Ungrounded(RejectReason.EVIDENCE_MISMATCH,
                             f"{len(rows)} rows of {ev.table} with {ev.key} = {ev.value!r} disagree on {ev.column}")
        value = fmt_value(rows[0][0])
        if value is None or value == "":
            raise Ungrounded(RejectReason.EVIDENCE_MISMATCH,
                             f"{ev.table}.{ev.column} is empty for {ev.key} = {ev.value!r}")
        return value

    def data(self, source: KnowledgeSource, qa: QAInstance, sub: SubQA, rng: random.Random) -> ToolData:
        assert sub.evidence is not None
        known_table(source, sub.evidence)
        return keyed_data(source, sub.evidence, sub, rng, answers_to_avoid(qa), exact=True)

    def computes(self, ev: Evidence) -> str:
        return f"the {ev.column} of the {ev.table} row whose {ev.key} is given"

    def code(self, data: ToolData, name: str) -> str:
        table, key, column = names(data.evidence)
        return f'''
def {name}({key}, fields=None):
    """Return the {human(column)} of the {entity(table)} with the given {human(key)}."""
    rows = {DATA_VAR}["{name}"]
    row = rows.get(str({key}).strip())
    if row is None:
        raise ValueError("no {entity(table)} with {human(key)} " + repr({key}))
    out = {{"{column}": row["{column}"]}}
    for extra in fields or []:
        if extra not in row or extra == "{column}":
            raise ValueError("unknown field " + repr(extra))
        out[extra] = row[extra]
    return out
'''

    def template_doc(self, data: ToolData) -> dict[str, Any]:
        table, key, column = names(data.evidence)
        return {"name": tool_name("get", entity(table), column),
                "description": f"Look up the {human(column)} of {article(entity(table))} by its {human(key)}. "
                               f"Optionally return more fields of the record.",
                "parameters": {"type": "object", "properties": {
                    key: {"type": data.key_type, "description": f"The {human(key)} of the {entity(table)}."},
                    "fields": {"type": "array", "items": {"type": "string", "enum": data.extras or [column]},
                               "description": "Extra fields of the record to include (default none)."}},
                    "required": [key]}}


def _same(value: Any) -> Any:
    """The value as SQL DISTINCT groups it (NaN equals NaN there, not in Python)."""
    return _NAN if isinstance(value, float) and value != value else value
