"""Offline answers of `envs.tool_doc`, `envs.augment_tool` and `envs.implement_tool`: template tools.

A tool-needing sub-QA's canonical SQL evidence (lookup / count / sum, see tasks/envs/decompose_qa.py)
names the operation; the tool is generated from a template for it, with mock data queried from the
knowledge source: the gold record plus other records whose answers differ (none may answer this QA's
sub-questions). The template's document already carries its optional parameters, so the augmentation
answer is the same document. The whole tool is made at the first of the three requests and handed out
part by part.
"""

from __future__ import annotations

import random
import re
import textwrap
import weakref
from typing import Any

from arenaforge.environments.reward import answer_matches
from arenaforge.schemas.models import GoldCall, QAInstance, SubQA
from arenaforge.tasks.envs.build_tools import ToolInputs, signature
from arenaforge.tasks.envs.decompose_qa import Step, entity, fmt_value, human, parse_evidence
from arenaforge.tasks.envs.knowledge import KnowledgeSource
from arenaforge.tasks.envs.tool_impl import DATA_VAR, ToolImpl, check_doc
from arenaforge.tasks.models import ChatRequest, NoAnswer
from arenaforge.tasks.models.providers.offline import OfflineModel, generator

_MAX_NAME = 64


def _tool(request: ChatRequest, model: OfflineModel) -> ToolImpl:
    """The template tool of the request's sub-QA (made once per sub-QA and attempt)."""
    inputs: ToolInputs = request.inputs
    if inputs.source is None:
        raise NoAnswer("source_unavailable", "the offline provider builds tools from the knowledge source, "
                                             "and none is loaded for this QA")
    key = ("envs.tool", inputs.qa.id, inputs.sub.index, inputs.attempt)
    if key not in model.state:
        # templates hold the source's rows: one set per loaded source (keyed by the source object itself)
        by_source = model.state.setdefault("envs.templates", weakref.WeakKeyDictionary())
        templates = by_source.get(inputs.source)
        if templates is None or templates.seed != inputs.seed:
            templates = by_source[inputs.source] = _Templates(inputs.source, seed=inputs.seed)
        model.state[key] = templates.build(inputs.qa, inputs.sub, inputs.attempt)
    return model.state[key]


@generator("envs.tool_doc")
def tool_doc(request: ChatRequest, model: OfflineModel) -> dict[str, Any]:
    return _tool(request, model).doc.model_dump(mode="json")


@generator("envs.augment_tool")
def augment_tool(request: ChatRequest, model: OfflineModel) -> dict[str, Any]:
    return _tool(request, model).doc.model_dump(mode="json")


@generator("envs.implement_tool")
def implement_tool(request: ChatRequest, model: OfflineModel) -> dict[str, Any]:
    tool = _tool(request, model)
    inputs: ToolInputs = request.inputs
    del model.state[("envs.tool", inputs.qa.id, inputs.sub.index, inputs.attempt)]
    head, _, returns = tool.signature.rpartition("->")  # signature = operation:argument types->return type
    operation = head.rpartition(":")[0]
    return {"code": tool.source, "mock_data": tool.data, "call": {"arguments": tool.calls[0].arguments},
            "operation": operation, "returns": returns, "probes": tool.probes}


def _tool_name(*parts: str) -> str:
    name = re.sub(r"[^A-Za-z0-9_]+", "_", "_".join(parts)).strip("_").lower()
    return name[:_MAX_NAME]


def _json_value(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return round(value, 4)
    text = fmt_value(value)
    try:
        return float(text) if text is not None and "." in text else text
    except ValueError:
        return text


def _param_type(source: KnowledgeSource, table: str, column: str) -> str:
    col = source.tables[table].column(column)
    return "integer" if col.numeric and "INT" in col.dtype.upper() else ("number" if col.numeric else "string")


class _Templates:
    """Template tools over one source's tables (see module docstring)."""

    def __init__(self, source: KnowledgeSource, other_rows: int = 4, seed: int = 0) -> None:
        self.source = source
        self.other_rows = other_rows
        self.seed = seed
        self._tables: dict[str, _Rows] = {}

    def _table(self, name: str) -> "_Rows":
        """The table's rows, read from the source once (mock data is sampled from them in memory)."""
        if name not in self._tables:
            # ORDER BY ALL: DuckDB's scan order is not stable across processes, and seeded
            # sampling of mock rows must see the same sequence for a re-run to dedupe.
            cur = self.source.con.execute(f'SELECT * FROM "{name}" ORDER BY ALL')
            self._tables[name] = _Rows([d[0] for d in cur.description], cur.fetchall())
        return self._tables[name]

    def build(self, qa: QAInstance, sub: SubQA, attempt: int) -> ToolImpl:
        parsed = parse_evidence(sub.evidence)
        if parsed is None:
            raise NoAnswer("no_evidence", f"sub-QA {sub.index} has no canonical SQL evidence to build a tool from")
        step, value = parsed
        if step.table not in self.source.tables:
            raise NoAnswer("unknown_table", f"table {step.table} is not in source {self.source.name}")
        rng = random.Random(f"{self.seed}:{qa.id}:{sub.index}:{attempt}")
        build = {"lookup": self._lookup, "count": self._count, "sum": self._sum}[step.op]
        # other records must not answer this sub-QA, nor any other of the QA (parallel lookups share a tool)
        avoid = [s.answer for s in qa.sub_qas if s.needs_tool]
        return build(step, value, sub, rng, avoid)

    # ------------------------------------------------------------------ lookups
    def _lookup(self, step: Step, value: Any, sub: SubQA, rng: random.Random, avoid: list[str]) -> ToolImpl:
        t = self.source.tables[step.table]
        attr = step.attr or ""
        name = _tool_name("get", entity(step.table), attr)
        extras = [a for a in t.attributes if a != attr][:3]
        cols = [step.by, attr, *extras]
        table = self._table(step.table)
        idx = [table.columns.index(c) for c in cols]
        pick = lambda r: tuple(r[i] for i in idx)  # noqa: E731
        gold_rows = [pick(r) for r in table.by(step.by).get(str(value), [])]
        others = [pick(r) for r in table.shuffled(rng) if str(r[idx[0]]) != str(value) and r[idx[1]] is not None]
        rows = list(gold_rows)
        for row in others:
            if len(rows) > self.other_rows:
                break
            text = str(fmt_value(row[1]))
            if not any(answer_matches(a, text) for a in avoid):
                rows.append(row)
        data = {str(r[0]): {c: _json_value(v) for c, v in zip(cols[1:], r[1:], strict=True)} for r in rows}
        ktype = _param_type(self.source, step.table, step.by)
        key_arg: Any = value if ktype != "string" else str(value)
        doc = check_doc({
            "name": name,
            "description": f"Look up the {human(attr)} of {_article(entity(step.table))} by its {human(step.by)}. "
                           f"Optionally return more fields of the record.",
            "parameters": {
                "type": "object",
                "properties": {
                    step.by: {"type": ktype, "description": f"The {human(step.by)} of the {entity(step.table)}."},
                    "fields": {"type": "array", "items": {"type": "string", "enum": extras or [attr]},
                               "description": "Extra fields of the record to include (default none)."},
                },
                "required": [step.by],
            },
        })
        code = f'''
def {name}({step.by}, fields=None):
    """Return the {human(attr)} of the {entity(step.table)} with the given {human(step.by)}."""
    rows = {DATA_VAR}["{name}"]
    row = rows.get(str({step.by}).strip())
    if row is None:
        raise ValueError("no {entity(step.table)} with {human(step.by)} " + repr({step.by}))
    out = {{"{attr}": row["{attr}"]}}
    for extra in fields or []:
        if extra not in row or extra == "{attr}":
            raise ValueError("unknown field " + repr(extra))
        out[extra] = row[extra]
    return out
'''
        probes = [{step.by: _typed(k, ktype)} for k in data if k != str(value)]
        call = GoldCall(tool=name, arguments={step.by: key_arg}, sub_qa=sub.index, answer=sub.answer)
        sig = signature(f"lookup:{step.table}.{attr}:by:{step.by}", doc, "object")
        return ToolImpl(doc, textwrap.dedent(code), data, sig, [call], probes)

    # ------------------------------------------------------------------ aggregates
    def _group_rows(self, step: Step, value: Any, avoid: list[str], rng: random.Random, measure: str | None,
                    filter_col: str | None) -> tuple[list[dict[str, Any]], list[Any]]:
        cols = [step.by] + ([measure] if measure else []) + ([filter_col] if filter_col else [])
        table = self._table(step.table)
        groups = table.by(step.by)
        bi = table.columns.index(step.by)
        mi = table.columns.index(measure) if measure else None

        def aggregate(key: str) -> Any:
            rows = groups.get(key, [])
            if mi is None:
                return len(rows)
            values = [r[mi] for r in rows if r[mi] is not None]
            return round(sum(float(v) for v in values), 2) if values else None

        keep = [str(value)]
        order = sorted(k for k in groups if k != str(value))
        rng.shuffle(order)
        for key in order:
            if len(keep) > 3:
                break
            agg_value = aggregate(key)
            text = str(fmt_value(agg_value))
            if agg_value is not None and not any(answer_matches(a, text) for a in avoid):
                keep.append(key)
        idx = [table.columns.index(c) for c in cols]
        rows = []
        for key in keep:
            for r in sorted(groups.get(key, []), key=lambda r: str(r[0])):
                rows.append({c: _json_value(r[i]) if i != bi else str(r[i]) for c, i in zip(cols, idx, strict=True)})
        return rows, keep

    def _filter_column(self, step: Step) -> str | None:
        t = self.source.tables[step.table]
        for a in t.attributes:
            col = t.column(a)
            if a != step.by and not col.numeric and 2 <= col.distinct <= 8:
                return a
        return None

    def _count(self, step: Step, value: Any, sub: SubQA, rng: random.Random, avoid: list[str]) -> ToolImpl:
        name = _tool_name("count", step.table, "by", step.by)
        flt = self._filter_column(step)
        rows, keys = self._group_rows(step, value, avoid, rng, None, flt)
        ktype = _param_type(self.source, step.table, step.by)
        props: dict[str, Any] = {step.by: {"type": ktype, "description": f"Count {human(step.table)} with this {human(step.by)}."}}
        if flt:
            options = sorted({str(r[flt]) for r in rows if r.get(flt) is not None}) or ["any"]
            props[flt] = {"type": "string", "enum": options, "description": f"Only count rows with this {human(flt)}."}
        doc = check_doc({"name": name, "description": f"Count the {human(step.table)} that have a given {human(step.by)}"
                                                      + (f", optionally only those with a given {human(flt)}." if flt else "."),
                         "parameters": {"type": "object", "properties": props, "required": [step.by]}})
        filt_sig = f", {flt}=None" if flt else ""
        filt_line = f"        if {flt} is not None and str(row.get(\"{flt}\")) != str({flt}):\n            continue\n" if flt else ""
        code = f'''
def {name}({step.by}{filt_sig}):
    """Count the {human(step.table)} whose {human(step.by)} is the given value."""
    count = 0
    for row in {DATA_VAR}["{name}"]:
        if row["{step.by}"] != str({step.by}).strip():
            continue
{filt_line}        count += 1
    return {{"count": count}}
'''
        probes = [{step.by: _typed(k, ktype)} for k in keys[1:]]
        call = GoldCall(tool=name, arguments={step.by: _typed(value, ktype)}, sub_qa=sub.index, answer=sub.answer)
        sig = signature(f"count:{step.table}:by:{step.by}", doc, "integer")
        return ToolImpl(doc, textwrap.dedent(code), rows, sig, [call], probes)

    def _sum(self, step: Step, value: Any, sub: SubQA, rng: random.Random, avoid: list[str]) -> ToolImpl:
        attr = step.attr or ""
        name = _tool_name("total", attr, "of", step.table, "by", step.by)
        rows, keys = self._group_rows(step, value, avoid, rng, attr, None)
        ktype = _param_type(self.source, step.table, step.by)
        doc = check_doc({"name": name,
                         "description": f"Sum the {human(attr)} over the {human(step.table)} with a given {human(step.by)}.",
                         "parameters": {"type": "object", "properties": {
                             step.by: {"type": ktype, "description": f"The {human(step.by)} to total over."},
                             "decimals": {"type": "integer", "minimum": 0, "maximum": 4,
                                          "description": "Decimal places of the result (default 2)."}},
                             "required": [step.by]}})
        code = f'''
def {name}({step.by}, decimals=2):
    """Total {human(attr)} of the {human(step.table)} whose {human(step.by)} is the given value."""
    rows = [r for r in {DATA_VAR}["{name}"] if r["{step.by}"] == str({step.by}).strip()]
    if not rows:
        raise ValueError("no {human(step.table)} with {human(step.by)} " + repr({step.by}))
    return {{"total_{attr}": round(sum(float(r["{attr}"] or 0) for r in rows), int(decimals))}}
'''
        probes = [{step.by: _typed(k, ktype)} for k in keys[1:]]
        call = GoldCall(tool=name, arguments={step.by: _typed(value, ktype)}, sub_qa=sub.index, answer=sub.answer)
        sig = signature(f"sum:{step.table}.{attr}:by:{step.by}", doc, "number")
        return ToolImpl(doc, textwrap.dedent(code), rows, sig, [call], probes)


class _Rows:
    """A table's rows in memory, with per-column indexes built on demand."""

    def __init__(self, columns: list[str], rows: list[tuple[Any, ...]]) -> None:
        self.columns = columns
        self.rows = rows
        self._index: dict[str, dict[str, list[tuple[Any, ...]]]] = {}

    def by(self, column: str) -> dict[str, list[tuple[Any, ...]]]:
        if column not in self._index:
            i = self.columns.index(column)
            index: dict[str, list[tuple[Any, ...]]] = {}
            for r in self.rows:
                if r[i] is not None:
                    index.setdefault(str(r[i]), []).append(r)
            self._index[column] = index
        return self._index[column]

    def shuffled(self, rng: random.Random, limit: int = 64) -> list[tuple[Any, ...]]:
        if len(self.rows) <= limit:
            out = list(self.rows)
            rng.shuffle(out)
            return out
        return rng.sample(self.rows, limit)


def _article(noun: str) -> str:
    return ("an " if noun[:1].lower() in "aeiou" else "a ") + noun


def _typed(value: Any, ptype: str) -> Any:
    if ptype == "integer":
        return int(value)
    if ptype == "number":
        return float(value)
    return str(value)
