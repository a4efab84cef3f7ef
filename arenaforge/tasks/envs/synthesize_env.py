"""Environment synthesis (ASTRA §1b.3): one verified, executable tool per tool-needing sub-question.

For every tool-needing sub-QA a `ToolBuilder` writes a tool document (OpenAI function JSON,
validated), raises its complexity (extra optional parameters), implements it in standard-library
Python with its own mock data (`DATA[<tool name>]`), and gives the call statement that must
reproduce the gold sub-answer. Builders, picked by `TOOL_BUILDERS[cfg.model.backend]`:

* offline — reads the sub-QA's canonical SQL evidence (lookup / count / sum, see
  arenaforge/tasks/envs/decompose_qa.py) and generates the tool from templates, with mock data queried from
  the knowledge source: the gold record plus other records whose answers differ.
* openai — three prompts (envs_tool_doc, envs_augment_tool, envs_implement_tool), each
  answer JSON-Schema-validated; failures are fed back on regeneration.

The tools of one QA are assembled into an `Environment` (functions style, `DATA` bound to
`initial_state`) and verified in the sandbox runtime, many environments at once on one pool:
the module loads; every gold call returns its gold answer (`arenaforge.environments.reward.answer_matches`);
calls with other valid arguments do NOT return it (no tool that prints the answer whatever it is
asked); nothing times out. A failing tool is regenerated at most `max_attempts` times, then
the QA becomes a rejected row with the reasons.

`self_test` checks an accepted environment end to end with the shared F1 reward: replaying the
gold calls earns 1.0, no calls earn 0, random tools with random valid arguments earn < 1.
"""

from __future__ import annotations

import ast
import asyncio
import functools
import json
import random
import re
import sys
import textwrap
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from arenaforge.environments.reward import answer_matches, f1_reward
from arenaforge.schemas.contracts import check_json_schema, validate_against
from arenaforge.schemas.ids import canonical_json
from arenaforge.schemas.errors import ParseError, ProviderError, SandboxError
from arenaforge.schemas.models import Environment, FunctionDoc, GoldCall, QAInstance, Rejection, SubQA, Verification
from arenaforge.tasks.envs.decompose_qa import Step, entity, fmt_value, human, parse_evidence
from arenaforge.tasks.envs.knowledge import KnowledgeSource
from arenaforge.tasks.prompts import load_prompt

DATA_VAR = "DATA"
_MAX_NAME = 64


@dataclass
class ToolImpl:
    """One synthesized tool: document, code, mock data, the gold call and leak probes."""

    doc: FunctionDoc
    source: str
    data: Any
    signature: str  # operation + argument/return types: equal signatures are merge candidates
    calls: list[GoldCall]
    probes: list[dict[str, Any]] = field(default_factory=list)  # other valid arguments (must not answer)
    origin: str = "offline"

    @property
    def name(self) -> str:
        return self.doc.name


@dataclass
class EnvDraft:
    qa: QAInstance
    tools: list[ToolImpl]
    attempt: int = 0

    def environment(self, extra: list[ToolImpl] | None = None, distractors: list[str] | None = None,
                    verification: Verification | None = None, name: str | None = None) -> Environment:
        return assemble(self.qa, self.tools, extra or [], distractors or [], verification, name)


class ToolBuilder(Protocol):
    async def build(self, qa: QAInstance, sub: SubQA, attempt: int, feedback: str) -> ToolImpl: ...


class BuildError(Exception):
    """A tool could not be built for a sub-QA (a per-record failure, becomes a rejection)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


# --------------------------------------------------------------------------- assembly
def assemble(qa: QAInstance, tools: list[ToolImpl], extra: list[ToolImpl], distractors: list[str],
             verification: Verification | None, name: str | None = None) -> Environment:
    every = list(tools) + [t for t in extra if t.name not in {x.name for x in tools}]
    header = f'"""Tools of the environment for: {qa.main_question[:120]!s}"""\n\n{DATA_VAR} = {{}}\n'
    code = header + "\n\n" + "\n\n".join(t.source.strip() + "\n" for t in every)
    calls = sorted((c for t in tools for c in t.calls), key=lambda c: c.sub_qa or 0)
    return Environment(
        name=name or f"{qa.source}-{qa.id.split('-')[1][:12]}",
        qa_id=qa.id,
        tools=[t.doc for t in every],
        code=code,
        style="functions",
        data_var=DATA_VAR,
        initial_state={t.name: t.data for t in every},
        calls=calls,
        gold_answers=[c.answer or "" for c in calls],
        distractors=[d for d in distractors if d in {t.name for t in every}],
        question=qa.main_question,
        verification=verification,
        parents=[qa.id],
    )


def stdlib_only(code: str) -> list[str]:
    """Modules imported by `code` that are not in the standard library (or a syntax error)."""
    try:
        tree = ast.parse(code)
    except SyntaxError as err:
        return [f"syntax error: {err.msg} (line {err.lineno})"]
    bad = []
    for node in ast.walk(tree):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        bad += [n for n in names if n.split(".")[0] not in sys.stdlib_module_names]
    return bad


def check_doc(raw: Any) -> FunctionDoc:
    """A tool document validated as an OpenAI function with an object JSON Schema; raises BuildError."""
    try:
        doc = FunctionDoc.model_validate(raw)
    except Exception as err:  # noqa: BLE001 - pydantic's ValidationError, reported as a build failure
        raise BuildError("invalid_tool_doc", str(err).splitlines()[0]) from None
    params = doc.parameters
    if params.get("type") != "object" or not isinstance(params.get("properties", {}), dict):
        raise BuildError("invalid_tool_doc", "parameters must be a JSON Schema of type object")
    bad_schema = _schema_error(canonical_json(params))
    if bad_schema:
        raise BuildError("invalid_tool_doc", f"parameters are not valid JSON Schema: {bad_schema}")
    missing = [r for r in params.get("required", []) if r not in params.get("properties", {})]
    if missing:
        raise BuildError("invalid_tool_doc", f"required parameters {missing} are not defined")
    return doc


@functools.lru_cache(maxsize=4096)
def _schema_error(params_json: str) -> str | None:
    return check_json_schema(json.loads(params_json))


def args_valid(doc: FunctionDoc, args: dict[str, Any]) -> str | None:
    """Why `args` break the tool's parameter schema, or None."""
    return validate_against(doc.parameters, args)


# --------------------------------------------------------------------------- offline builder
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


class OfflineToolBuilder:
    """Template tools over the source's tables (see module docstring)."""

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

    async def build(self, qa: QAInstance, sub: SubQA, attempt: int, feedback: str) -> ToolImpl:
        parsed = parse_evidence(sub.evidence)
        if parsed is None:
            raise BuildError("no_evidence", f"sub-QA {sub.index} has no canonical SQL evidence to build a tool from")
        step, value = parsed
        if step.table not in self.source.tables:
            raise BuildError("unknown_table", f"table {step.table} is not in source {self.source.name}")
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
        sig = f"lookup:{step.table}.{attr}:by:{step.by}:{ktype}->object"
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
        sig = f"count:{step.table}:by:{step.by}:{ktype}->integer"
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
        sig = f"sum:{step.table}.{attr}:by:{step.by}:{ktype}->number"
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


# --------------------------------------------------------------------------- openai builder
DOC_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["name", "description", "parameters"],
    "properties": {"name": {"type": "string", "pattern": "^[A-Za-z0-9_]{1,64}$"}, "description": {"type": "string"},
                   "parameters": {"type": "object"}},
}
IMPL_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["code", "mock_data", "call"],
    "properties": {"code": {"type": "string", "minLength": 10}, "mock_data": {},
                   "call": {"type": "object", "required": ["arguments"], "properties": {"arguments": {"type": "object"}}}},
}


def probe_arguments(doc: FunctionDoc, gold: dict[str, Any], data: Any, limit: int = 3) -> list[dict[str, Any]]:
    """Other valid arguments for a model-written tool: gold arguments with one value swapped."""
    probes: list[dict[str, Any]] = []
    props = doc.parameters.get("properties", {})
    keys = [k for k in data if isinstance(k, str)] if isinstance(data, dict) else []
    for pname, pval in gold.items():
        spec = props.get(pname, {})
        options: list[Any] = []
        if "enum" in spec:
            options = [v for v in spec["enum"] if v != pval]
        elif isinstance(pval, bool):
            options = [not pval]
        elif isinstance(pval, int):
            options = [pval + 1, pval + 7]
        elif isinstance(pval, float):
            options = [pval * 2 + 1]
        elif isinstance(pval, str):
            options = [k for k in keys if k != pval] + [pval + "_other", "unknown"]
        for opt in options:
            probe = {**gold, pname: opt}
            if args_valid(doc, probe) is None and probe not in probes:
                probes.append(probe)
            if len(probes) >= limit:
                return probes
    return probes


class OpenAIToolBuilder:
    """Tool doc -> complexity augmentation -> implementation + mock data + call, all JSON-validated."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.p_doc = load_prompt("envs_tool_doc")
        self.p_aug = load_prompt("envs_augment_tool")
        self.p_impl = load_prompt("envs_implement_tool")

    async def _ask(self, step: str, text: str, schema: dict[str, Any], seed: int) -> Any:
        from arenaforge.tasks.models import complete_json

        return await complete_json(self.model, step, [{"role": "user", "content": text}], schema, seed=seed)

    async def build(self, qa: QAInstance, sub: SubQA, attempt: int, feedback: str) -> ToolImpl:
        seed = attempt * 1000 + sub.index
        others = ", ".join(s.question for s in qa.sub_qas if s.index != sub.index and s.needs_tool) or "(none)"
        raw = await self._ask("envs.tool_doc", self.p_doc.render(main_question=qa.main_question, question=sub.question,
                                                                answer=sub.answer, other_tools=others), DOC_SCHEMA, seed)
        base = check_doc(raw)
        raw = await self._ask("envs.augment_tool", self.p_aug.render(tool=base.model_dump_json()), DOC_SCHEMA, seed)
        doc = check_doc(raw)
        if doc.name != base.name or not set(base.parameters.get("required", [])) <= set(doc.parameters.get("required", [])) | set(
                doc.parameters.get("properties", {})):
            doc = base  # augmentation that renames the tool or drops parameters is ignored
        note = f"A previous implementation failed: {feedback}\nFix it." if feedback else ""
        impl = await self._ask("envs.implement_tool", self.p_impl.render(tool=doc.model_dump_json(), question=sub.question,
                                                                        answer=sub.answer, feedback=note, name=doc.name),
                               IMPL_SCHEMA, seed)
        bad = stdlib_only(impl["code"])
        if bad:
            raise BuildError("non_stdlib_code", f"code imports {bad}")
        args = impl["call"]["arguments"]
        why = args_valid(doc, args)
        if why:
            raise BuildError("invalid_call", f"call arguments break the tool schema: {why}")
        call = GoldCall(tool=doc.name, arguments=args, sub_qa=sub.index, answer=sub.answer)
        sig = "model:" + json.dumps({"params": {k: v.get("type") for k, v in doc.parameters.get("properties", {}).items()}},
                                    sort_keys=True)
        return ToolImpl(doc, impl["code"], impl["mock_data"], sig, [call], probe_arguments(doc, args, impl["mock_data"]),
                        origin="openai")


TOOL_BUILDERS = {
    "offline": lambda model, source, seed=0: OfflineToolBuilder(source, seed=seed),
    "openai": lambda model, source, seed=0: OpenAIToolBuilder(model),
}


# --------------------------------------------------------------------------- drafting + sandbox verification
def merge_same_name(tools: list[ToolImpl]) -> list[ToolImpl]:
    """Tools of one QA built from the same template (parallel lookups) become one tool with all rows and calls."""
    out: dict[str, ToolImpl] = {}
    for t in tools:
        if t.name in out:
            prev = out[t.name]
            if prev.signature != t.signature:
                raise BuildError("tool_name_clash", f"two different tools are named {t.name}")
            data = merge_data(prev.data, t.data)
            gold_args = [c.arguments for c in prev.calls + t.calls]
            probes = [p for p in prev.probes + t.probes if p not in gold_args]
            out[t.name] = replace(prev, data=data, calls=prev.calls + t.calls, probes=probes)
        else:
            out[t.name] = t
    return list(out.values())


def merge_data(a: Any, b: Any) -> Any:
    if isinstance(a, dict) and isinstance(b, dict):
        return {**a, **b}
    if isinstance(a, list) and isinstance(b, list):
        seen = {json.dumps(x, sort_keys=True) for x in a}
        return a + [x for x in b if json.dumps(x, sort_keys=True) not in seen]
    raise BuildError("unmergeable_data", "mock data of different shapes")


@dataclass
class CheckResult:
    ok: bool
    checks: dict[str, bool]
    details: list[str]
    failing_tools: set[str]


async def check_environment(pool: Any, env: Environment, probes: dict[str, list[dict[str, Any]]]) -> CheckResult:
    """Sandbox checks: imports, gold calls answer, other valid arguments do not, nothing times out."""
    from arenaforge.environments.runtime import EnvLoadError

    details: list[str] = []
    failing: set[str] = set()
    try:
        session = await pool.open(env)
    except EnvLoadError as err:
        return CheckResult(False, {"imports": False}, [f"import_error: {err.detail[-300:]}"], {t.name for t in env.tools})
    gold_ok = leak_free = no_timeout = True
    try:
        for call in env.calls:
            obs = await pool.call(session, call.tool, call.arguments)  # EnvironmentFailure: the sandbox's fault
            if obs.outcome == "timeout":
                no_timeout = False
                failing.add(call.tool)
                details.append(f"timeout: {call.tool} did not return within its limit")
            elif obs.outcome != "ok" or not answer_matches(call.answer or "", obs.output):
                gold_ok = False
                failing.add(call.tool)
                details.append(f"wrong_answer: {call.tool}({json.dumps(call.arguments)}) gave "
                               f"{obs.outcome} {(obs.output or obs.error or '')[:160]!r}, expected {call.answer!r}")
        gold_by_tool: dict[str, list[GoldCall]] = {}
        for call in env.calls:
            gold_by_tool.setdefault(call.tool, []).append(call)
        for tool, tool_probes in probes.items():
            for args in tool_probes:
                obs = await pool.call(session, tool, args)
                if obs.outcome == "timeout":
                    no_timeout = False
                    failing.add(tool)
                    details.append(f"timeout: {tool}({json.dumps(args)})")
                    break
                leaked = [c.answer for c in gold_by_tool.get(tool, []) if obs.outcome == "ok"
                          and c.arguments != args and answer_matches(c.answer or "", obs.output)]
                if leaked:
                    leak_free = False
                    failing.add(tool)
                    details.append(f"answer_leak: {tool}({json.dumps(args)}) also returns {leaked[0]!r}")
                    break
    finally:
        await pool.close(session)
    checks = {"imports": True, "gold_calls": gold_ok, "no_answer_leak": leak_free, "no_timeout": no_timeout}
    return CheckResult(all(checks.values()), checks, details, failing)


@dataclass
class SynthResult:
    drafts: list[EnvDraft]
    rejections: list[Rejection]


async def synthesize_environments(builder: ToolBuilder, pool: Any, instances: list[QAInstance], max_attempts: int = 2,
                                  run_id: str | None = None, concurrency: int = 256) -> SynthResult:
    """Build and sandbox-verify one environment per QA, regenerating failing tools at most `max_attempts` times."""
    sem = asyncio.Semaphore(concurrency)

    async def one(qa: QAInstance) -> EnvDraft | Rejection:
        async with sem:
            return await _synthesize_one(builder, pool, qa, max_attempts, run_id)

    results = await asyncio.gather(*(one(qa) for qa in instances))
    return SynthResult([r for r in results if isinstance(r, EnvDraft)], [r for r in results if isinstance(r, Rejection)])


async def _synthesize_one(builder: ToolBuilder, pool: Any, qa: QAInstance, max_attempts: int,
                          run_id: str | None) -> EnvDraft | Rejection:
    subs = [s for s in qa.sub_qas if s.needs_tool]
    built: dict[int, ToolImpl] = {}
    feedback: dict[int, str] = {}
    history: list[str] = []
    last_reason = "sandbox_verification_failed"

    def reject(reason: str, detail: str, env_failure: bool = False) -> Rejection:
        return Rejection(stage="synthesize_env", subject=qa.id, reason=reason, detail=detail[:2000], parents=[qa.id],
                         run_id=run_id, environment_failure=env_failure, payload={"attempts": history[-6:]})

    for attempt in range(max_attempts + 1):
        todo = [sub for sub in subs if sub.index not in built]
        outcomes = await asyncio.gather(*(builder.build(qa, sub, attempt, feedback.get(sub.index, "")) for sub in todo),
                                        return_exceptions=True)
        for sub, got in zip(todo, outcomes, strict=True):  # the sub-QAs' tools are built concurrently
            if isinstance(got, ToolImpl):
                built[sub.index] = got
            elif isinstance(got, BuildError):
                history.append(f"attempt {attempt} sub-QA {sub.index}: {got}")
                feedback[sub.index] = str(got)
                last_reason = got.reason
            elif isinstance(got, ParseError):
                history.append(f"attempt {attempt} sub-QA {sub.index}: invalid_model_output: {got}")
                feedback[sub.index] = f"the answer was not valid JSON for the schema: {got}"
                last_reason = "invalid_model_output"
            elif isinstance(got, ProviderError):
                return reject("provider_error", str(got), env_failure=True)
            else:
                raise got
        if len(built) < len(subs):
            continue
        try:
            tools = merge_same_name([built[s.index] for s in subs])
        except BuildError as err:
            history.append(f"attempt {attempt}: {err}")
            last_reason = err.reason
            built.clear()
            continue
        draft = EnvDraft(qa, tools, attempt)
        env = draft.environment()
        try:
            result = await check_environment(pool, env, {t.name: t.probes for t in tools})
        except SandboxError as err:
            return reject("sandbox_failure", str(err), env_failure=True)
        if result.ok:
            return draft
        history.append(f"attempt {attempt}: " + "; ".join(result.details)[:600])
        last_reason = result.details[0].split(":")[0] if result.details else "sandbox_verification_failed"
        for sub in subs:  # regenerate only the tools that failed
            if built[sub.index].name in result.failing_tools or not result.checks.get("imports", True):
                feedback[sub.index] = "; ".join(result.details)[:600]
                built.pop(sub.index)
    return reject(last_reason, " | ".join(history))


# --------------------------------------------------------------------------- self-test
def random_arguments(doc: FunctionDoc, data: Any, rng: random.Random) -> dict[str, Any]:
    """Arguments valid for the tool's schema, drawn from its enum values, data keys or random tokens."""
    keys = [k for k in data if isinstance(k, str)] if isinstance(data, dict) else []
    rows = data if isinstance(data, list) else []
    args: dict[str, Any] = {}
    props = doc.parameters.get("properties", {})
    for pname in doc.parameters.get("required", []):
        spec = props.get(pname, {})
        ptype = spec.get("type", "string")
        column = [r[pname] for r in rows if isinstance(r, dict) and pname in r]
        if "enum" in spec:
            args[pname] = rng.choice(spec["enum"])
        elif ptype == "integer":
            args[pname] = int(rng.choice(column)) if column else rng.randint(0, 1000)
        elif ptype == "number":
            args[pname] = float(rng.choice(column)) if column else rng.random() * 100
        elif ptype == "boolean":
            args[pname] = rng.random() < 0.5
        else:
            pool = keys or [str(v) for v in column] or [f"x{rng.randint(0, 999)}"]
            args[pname] = rng.choice(pool)
    return args


async def self_test(pool: Any, env: Environment, seed: int = 0) -> tuple[dict[str, bool], list[str]]:
    """F1 of gold replay (must be 1.0), no calls (0) and random valid calls (< 1), each in a fresh session."""
    from arenaforge.environments.runtime import EnvironmentFailure, run_calls

    try:
        gold_obs = await run_calls(pool, env, env.calls)
    except EnvironmentFailure as err:  # the sandbox failed, not the environment: the row is an environment failure
        return {"self_test_gold_f1": False}, [f"sandbox_failure: {str(err)[:300]}"]
    gold = f1_reward(env.gold_answers, [o.text() for o in gold_obs], len(env.calls))
    empty = f1_reward(env.gold_answers, [], 0)
    rng = random.Random(f"{seed}:{env.id}")
    docs = {t.name: t for t in env.tools}
    gold_pairs = [(c.tool, c.arguments) for c in env.calls]
    calls: list[tuple[str, dict[str, Any]]] = []
    for _ in range(max(1, len(env.calls))):
        for _try in range(10):
            name = rng.choice(sorted(docs))
            args = random_arguments(docs[name], (env.initial_state or {}).get(name), rng)
            if (name, args) not in gold_pairs:
                break
        calls.append((name, args))
    try:
        rand_obs = await run_calls(pool, env, calls)
    except EnvironmentFailure as err:
        return {"self_test_random_f1": False}, [f"sandbox_failure: {str(err)[:300]}"]
    rand = f1_reward(env.gold_answers, [o.text() for o in rand_obs], len(calls))
    checks = {"self_test_gold_f1": gold.f1 == 1.0, "self_test_no_calls_f1": empty.f1 == 0.0,
              "self_test_random_f1": rand.f1 < 1.0}
    details = [f"self-test f1: gold {gold.f1:.3f}, no calls {empty.f1:.3f}, random {rand.f1:.3f}"]
    return checks, details
