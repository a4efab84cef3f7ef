"""count: how many rows of `table` have `value` in `key`; its tool counts rows, optionally by a filter column."""

from __future__ import annotations

import random
from typing import Any

from arenaforge.schemas.models import Evidence, QAInstance, SubQA
from arenaforge.tracks.envs.answers import human
from arenaforge.tracks.envs.evidence.base import (
    EvidenceKind,
    answers_to_avoid,
    keyed_where,
    known_table,
    names,
    tool_name,
)
from arenaforge.tracks.envs.knowledge import KnowledgeSource
from arenaforge.tracks.envs.tool_data import ToolData, filter_column, grouped_data
from arenaforge.tracks.envs.tool_impl import DATA_VAR


class Count(EvidenceKind):
    name = "count"
    returns = "integer"

    def target(self, ev: Evidence) -> str:
        return str(ev.table)

    def answer(self, source: KnowledgeSource, ev: Evidence) -> str:
        where, key = keyed_where(source, ev)
        return str(source.query(f"SELECT count(*) {where}", [key])[0][0])

    def data(self, source: KnowledgeSource, qa: QAInstance, sub: SubQA, rng: random.Random) -> ToolData:
        ev = sub.evidence
        assert ev is not None
        known_table(source, ev)
        return grouped_data(source, ev, sub, rng, answers_to_avoid(qa), measure=None,
                            filter_by=filter_column(source, ev))

    def computes(self, ev: Evidence) -> str:
        return f"the number of {ev.table} rows whose {ev.key} is given"

    def code(self, data: ToolData, name: str) -> str:
        table, key, _ = names(data.evidence)
        flt = data.filter_column
        filt_sig = f", {flt}=None" if flt else ""
        filt_line = (f"        if {flt} is not None and str(row.get(\"{flt}\")) != str({flt}):\n            continue\n"
                     if flt else "")
        return f'''
def {name}({key}{filt_sig}):
    """Count the {human(table)} whose {human(key)} is the given value."""
    count = 0
    for row in {DATA_VAR}["{name}"]:
        if row["{key}"] != str({key}).strip():
            continue
{filt_line}        count += 1
    return {{"count": count}}
'''

    def template_doc(self, data: ToolData) -> dict[str, Any]:
        table, key, _ = names(data.evidence)
        flt = data.filter_column
        props: dict[str, Any] = {key: {"type": data.key_type,
                                       "description": f"Count {human(table)} with this {human(key)}."}}
        if flt:
            options = sorted({str(r[flt]) for r in data.data if r.get(flt) is not None}) or ["any"]
            props[flt] = {"type": "string", "enum": options, "description": f"Only count rows with this {human(flt)}."}
        return {"name": tool_name("count", table, "by", key),
                "description": f"Count the {human(table)} that have a given {human(key)}"
                               + (f", optionally only those with a given {human(flt)}." if flt else "."),
                "parameters": {"type": "object", "properties": props, "required": [key]}}
