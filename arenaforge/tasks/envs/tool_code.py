"""Tool code assembled by the program from a sub-QA's typed evidence (lookup / count / sum) and its data layout.

The offline provider answers `envs.implement_tool` with it, and `envs synth --tool-code evidence` uses it in
place of a model's code: the model writes the tool's document, the program its body (the environment's
`Provenance.written_by` says so). The sandbox still verifies it against the source like any other code.
"""

from __future__ import annotations

from arenaforge.tasks.envs.answers import entity, human
from arenaforge.tasks.envs.tool_data import ToolData
from arenaforge.tasks.envs.tool_impl import DATA_VAR


def code_from_evidence(data: ToolData, name: str) -> str:
    """A standard-library function `name` over `DATA[name]` computing the evidence's operation."""
    ev = data.evidence
    table, key = ev.table or "", ev.key or ""
    if ev.kind == "lookup":
        column = ev.column or ""
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
    if ev.kind == "count":
        flt = data.filter_column
        filt_sig = f", {flt}=None" if flt else ""
        filt_line = f"        if {flt} is not None and str(row.get(\"{flt}\")) != str({flt}):\n            continue\n" if flt else ""
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
    column = ev.column or ""
    return f'''
def {name}({key}, decimals=2):
    """Total {human(column)} of the {human(table)} whose {human(key)} is the given value."""
    rows = [r for r in {DATA_VAR}["{name}"] if r["{key}"] == str({key}).strip()]
    if not rows:
        raise ValueError("no {human(table)} with {human(key)} " + repr({key}))
    return {{"total_{column}": round(sum(float(r["{column}"] or 0) for r in rows), int(decimals))}}
'''
