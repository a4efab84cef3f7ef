"""A tool's data, taken from the knowledge source: the rows behind its sub-QA's evidence, plus other keys.

Whatever writes a tool's code (a model, or the offline templates), its data comes from here, never from
the writer: the gold record (or group of rows) and a few others whose answers differ from every answer of
the QA. Each other key comes with the answer the source gives for it, so a tool is checked against the
source on arguments it was not built for (`Probe`): a tool that returns a constant, or the gold answer
whatever it is asked, fails.

Layouts (what the code reads from `DATA[<tool name>]`):
  keyed  lookup: {"<key value>": {"<column>": ..., <up to 3 more columns>}}
  rows   count / sum: [{"<key>": "<key value>", <"<column>": number>, <filter column>}, ...]
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from arenaforge.environments.reward import answer_matches
from arenaforge.schemas.models import Evidence, SubQA
from arenaforge.tracks.envs.answers import fmt_value, same_answer
from arenaforge.tracks.envs.knowledge import KnowledgeSource
from arenaforge.tracks.envs.tool_impl import BuildError

OTHER_RECORDS = 4  # other keys a tool holds beside the gold one


@dataclass(frozen=True)
class Probe:
    """Arguments other than the gold call's, and the answer the source gives for them (None: any but gold)."""

    arguments: dict[str, Any]
    answer: str | None = None


@dataclass
class ToolData:
    evidence: Evidence
    layout: str  # keyed | rows
    data: Any
    key_type: str  # JSON Schema type of the key parameter
    others: list[tuple[Any, str]] = field(default_factory=list)  # (key value, the source's answer for it)
    extras: list[str] = field(default_factory=list)  # keyed: further columns of each record
    filter_column: str | None = None  # rows: a low-cardinality column a count may filter on

    def sample(self, n: int = 3) -> str:
        """A few entries of the data, for a prompt."""
        import json

        entries = list(self.data.items())[:n] if isinstance(self.data, dict) else self.data[:n]
        return json.dumps(dict(entries) if isinstance(self.data, dict) else entries, ensure_ascii=False, default=str)


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


def table_rows(source: KnowledgeSource, table: str) -> _Rows:
    """The table's rows, read once per source (the source owns the cache)."""
    cache: dict[str, _Rows] = source.derived.setdefault("tool_data.rows", {})
    if table not in cache:
        # ORDER BY ALL: DuckDB's scan order is not stable across processes, and seeded sampling of rows
        # must see the same sequence for a re-run to dedupe.
        cur = source.con.execute(f'SELECT * FROM "{table}" ORDER BY ALL')
        cache[table] = _Rows([d[0] for d in cur.description], cur.fetchall())
    return cache[table]


def json_value(value: Any) -> Any:
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return round(value, 4)
    text = fmt_value(value)
    try:
        return float(text) if text is not None and "." in text else text
    except ValueError:
        return text


def param_type(source: KnowledgeSource, table: str, column: str) -> str:
    col = source.tables[table].column(column)
    return "integer" if col.numeric and "INT" in col.dtype.upper() else ("number" if col.numeric else "string")


def typed(value: Any, ptype: str) -> Any:
    if ptype == "integer":
        return int(float(value))
    if ptype == "number":
        return float(value)
    return str(value)


def keyed_data(source: KnowledgeSource, ev: Evidence, sub: SubQA, rng: random.Random, avoid: list[str],
               exact: bool) -> ToolData:
    """The `keyed` layout: the gold record and others whose answers are not in `avoid`; `exact`: the sub-answer is
    the whole value (a lookup), else inside it (a span's passage)."""
    t = source.tables[ev.table or ""]
    column, key = ev.column or "", ev.key or ""
    extras = [a for a in t.attributes if a not in (column, key)][:3]
    cols = [key, column, *extras]
    table = table_rows(source, t.name)
    idx = [table.columns.index(c) for c in cols]
    by_key = table.by(key)
    gold_key = str(ev.value)
    if gold_key not in by_key:
        raise BuildError("evidence_mismatch", f"no row of {t.name} has {key} = {ev.value!r}")
    keys = sorted(k for k in by_key if k != gold_key)
    rng.shuffle(keys)
    chosen = [gold_key]
    others: list[tuple[Any, str]] = []
    ktype = param_type(source, t.name, key)
    for k in keys:
        if len(chosen) > OTHER_RECORDS:
            break
        values = {fmt_value(r[idx[1]]) for r in by_key[k]}
        answer = next(iter(values)) if len(values) == 1 else None
        if answer and not any(answer_matches(a, answer) for a in avoid):
            chosen.append(k)
            others.append((typed(k, ktype), answer))
    data = {k: {c: json_value(v) for c, v in zip(cols[1:], [by_key[k][0][i] for i in idx[1:]], strict=True)}
            for k in chosen}
    held = str(fmt_value(data[gold_key][column]))
    if not (same_answer(held, sub.answer) if exact else answer_matches(sub.answer, held)):
        raise BuildError("evidence_mismatch", f"the source's {t.name}.{column} for {gold_key} is not {sub.answer!r}")
    return ToolData(ev, "keyed", data, ktype, others, extras)


def filter_column(source: KnowledgeSource, ev: Evidence) -> str | None:
    """A low-cardinality text column of the evidence's table a count may filter on, if any."""
    t = source.tables[ev.table or ""]
    for a in t.attributes:
        col = t.column(a)
        if a != ev.key and not col.numeric and 2 <= col.distinct <= 8:
            return a
    return None


def grouped_data(source: KnowledgeSource, ev: Evidence, sub: SubQA, rng: random.Random, avoid: list[str],
                 measure: str | None, filter_by: str | None) -> ToolData:
    """The `rows` layout: the gold key's rows and other keys' whose aggregate (the total of `measure`, or the
    row count without one) is not in `avoid`; `filter_by`: a column the tool may filter on."""
    table_name, key = ev.table or "", ev.key or ""
    flt = filter_by
    table = table_rows(source, table_name)
    groups = table.by(key)
    mi = table.columns.index(measure) if measure else None

    def aggregate(k: str) -> str | None:
        rows = groups.get(k, [])
        if mi is None:
            return str(len(rows))
        values = [r[mi] for r in rows if r[mi] is not None]
        return fmt_value(round(sum(float(v) for v in values), 2)) if values else None

    gold_key = str(ev.value)
    if aggregate(gold_key) is None or not same_answer(str(aggregate(gold_key)), sub.answer):
        raise BuildError("evidence_mismatch", f"the {ev.kind} of {table_name} for {key} = {gold_key} "
                                              f"is not {sub.answer!r} in the source")
    ktype = param_type(source, table_name, key)
    keys = sorted(k for k in groups if k != gold_key)
    rng.shuffle(keys)
    chosen = [gold_key]
    others: list[tuple[Any, str]] = []
    for k in keys:
        if len(chosen) > 3:
            break
        answer = aggregate(k)
        if answer is not None and not any(answer_matches(a, answer) for a in avoid):
            chosen.append(k)
            others.append((typed(k, ktype), answer))
    cols = [key] + ([measure] if measure else []) + ([flt] if flt else [])
    idx = [table.columns.index(c) for c in cols]
    bi = table.columns.index(key)
    rows = []
    for k in chosen:
        for r in sorted(groups.get(k, []), key=lambda r: str(r[0])):
            rows.append({c: json_value(r[i]) if i != bi else str(r[i]) for c, i in zip(cols, idx, strict=True)})
    return ToolData(ev, "rows", rows, ktype, others, filter_column=flt)
