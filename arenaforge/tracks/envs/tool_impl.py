"""An environment under construction: its tools (document, code, mock data, gold calls) and their assembly.

`ToolImpl` is one synthesized tool; `EnvDraft` the tools of one QA instance; `assemble` turns a draft
(plus distractors) into the `Environment` record the sandbox runs: module-level functions over one
`DATA` dict bound to the initial state. The checks here are the ones made before any code runs:
an OpenAI function document with a valid JSON Schema, standard-library-only code, call arguments that
fit the schema.
"""

from __future__ import annotations

import ast
import functools
import json
import sys
from dataclasses import dataclass, field, replace
from typing import Any

from arenaforge.schemas.base import Provenance
from arenaforge.schemas.contracts import check_json_schema, validate_against
from arenaforge.schemas.ids import canonical_json
from arenaforge.schemas.models import Environment, FunctionDoc, GoldCall, QAInstance, Verification

DATA_VAR = "DATA"


@dataclass
class ToolImpl:
    """One synthesized tool: document, code, its data (from the knowledge source), the gold call and the probes
    (other records' arguments, with what the source says for them)."""

    doc: FunctionDoc
    source: str
    data: Any
    signature: str  # operation + argument/return types: equal signatures are merge candidates
    calls: list[GoldCall]
    probes: list[Any] = field(default_factory=list)  # tool_data.Probe: other records' arguments and answers
    origin: str = "offline"  # the provider that wrote it
    written_by: dict[str, str] | None = None  # which parts a model wrote and which the program (Provenance.written_by)

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


class BuildError(Exception):
    """A tool could not be built for a sub-QA (a per-record failure, becomes a rejection)."""

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


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
        provenance=_provenance(qa, tools, every),
    )


def _provenance(qa: QAInstance, tools: list[ToolImpl], every: list[ToolImpl]) -> Provenance:
    """The QA's model and prompt, the tools' writer as backend, the knowledge source, who wrote which part."""
    made = qa.provenance
    parts = dict(made.written_by or {}) if made else {}
    own = {id(t) for t in tools}
    for tool in every:  # a part any tool's model wrote counts as the model's, distractors' code included
        written = tool.written_by or ({"tool_code": "program"} if tool.origin in ("offline", "import") else
                                      {"tool_code": "model"})  # a tool of an earlier run: its writer's kind
        if id(tool) not in own:
            written = {"tool_code": written.get("tool_code", "model")}
        for part, who in written.items():
            parts[part] = "model" if "model" in (who, parts.get(part)) else who
    return Provenance(backend=tools[0].origin if tools else (made.backend if made else "offline"),
                      model=made.model if made else None, prompt_hash=made.prompt_hash if made else None,
                      source=qa.source, written_by=parts or None)


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
            probes = [p for p in prev.probes + t.probes if p.arguments not in gold_args]
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
