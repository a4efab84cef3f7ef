"""Offline answers of `envs.tool_doc`, `envs.augment_tool` and `envs.implement_tool`: template tools.

The sub-QA's evidence names the operation (lookup / count / sum) and the step hands over the data the
tool will hold (from the source, `tasks/envs/tool_data.py`); the tool's document and code come from a
template for that operation and layout. The template document already carries its optional parameters,
so the augmentation answer is the same document.
"""

from __future__ import annotations

import textwrap
from typing import Any

from arenaforge.tasks.envs.answers import entity, human
from arenaforge.tasks.envs.build_tools import ToolInputs
from arenaforge.tasks.envs.tool_code import code_from_evidence
from arenaforge.tasks.envs.tool_data import typed
from arenaforge.tasks.envs.tool_impl import DATA_VAR
from arenaforge.tasks.models import ChatRequest
from arenaforge.tasks.models.providers.offline import OfflineModel

_MAX_NAME = 64


def _tool_name(*parts: str) -> str:
    import re

    return re.sub(r"[^A-Za-z0-9_]+", "_", "_".join(parts)).strip("_").lower()[:_MAX_NAME]


def _article(noun: str) -> str:
    return ("an " if noun[:1].lower() in "aeiou" else "a ") + noun


def _doc(inputs: ToolInputs) -> dict[str, Any]:
    data = inputs.data
    ev = data.evidence
    table, key, ktype = ev.table or "", ev.key or "", data.key_type
    if ev.kind == "lookup":
        column = ev.column or ""
        return {"name": _tool_name("get", entity(table), column),
                "description": f"Look up the {human(column)} of {_article(entity(table))} by its {human(key)}. "
                               f"Optionally return more fields of the record.",
                "parameters": {"type": "object", "properties": {
                    key: {"type": ktype, "description": f"The {human(key)} of the {entity(table)}."},
                    "fields": {"type": "array", "items": {"type": "string", "enum": data.extras or [column]},
                               "description": "Extra fields of the record to include (default none)."}},
                    "required": [key]}}
    if ev.kind == "count":
        flt = data.filter_column
        props: dict[str, Any] = {key: {"type": ktype, "description": f"Count {human(table)} with this {human(key)}."}}
        if flt:
            options = sorted({str(r[flt]) for r in data.data if r.get(flt) is not None}) or ["any"]
            props[flt] = {"type": "string", "enum": options, "description": f"Only count rows with this {human(flt)}."}
        return {"name": _tool_name("count", table, "by", key),
                "description": f"Count the {human(table)} that have a given {human(key)}"
                               + (f", optionally only those with a given {human(flt)}." if flt else "."),
                "parameters": {"type": "object", "properties": props, "required": [key]}}
    column = ev.column or ""
    return {"name": _tool_name("total", column, "of", table, "by", key),
            "description": f"Sum the {human(column)} over the {human(table)} with a given {human(key)}.",
            "parameters": {"type": "object", "properties": {
                key: {"type": ktype, "description": f"The {human(key)} to total over."},
                "decimals": {"type": "integer", "minimum": 0, "maximum": 4,
                             "description": "Decimal places of the result (default 2)."}},
                "required": [key]}}


def tool_doc(request: ChatRequest, model: OfflineModel) -> dict[str, Any]:
    return _doc(request.inputs)


def augment_tool(request: ChatRequest, model: OfflineModel) -> dict[str, Any]:
    return _doc(request.inputs)  # the template's optional parameters are its added complexity


def implement_tool(request: ChatRequest, model: OfflineModel) -> dict[str, Any]:
    inputs: ToolInputs = request.inputs
    doc = _doc(inputs)
    ev = inputs.data.evidence
    return {"code": textwrap.dedent(code_from_evidence(inputs.data, doc["name"])),
            "call": {"arguments": {ev.key: typed(ev.value, inputs.data.key_type)}}}
