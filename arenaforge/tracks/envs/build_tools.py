"""Tool building (ASTRA §1b.3, "spec -> complexity -> code"): one tool per tool-needing sub-question.

The tool's data is the knowledge source's (`tool_data.py`): the rows behind the sub-QA's evidence and a
few others. Three requests to the run's model, each answer JSON-Schema-validated: a tool document
(tracks/envs/prompts/envs_tool_doc.txt, an OpenAI function), a raised-complexity version of it (extra optional
parameters; ignored when it renames the tool or drops a parameter), and the implementation (standard-library
Python reading `DATA[<tool name>]` in the data's layout) with the call that answers the sub-question. The
offline provider answers from templates (`tracks/envs/offline_tools.py`).

The gold call must pass the evidence's key value; the same call with the other keys of the data (the
`Probe`s) must return what the source says for them, so the sandbox check (`check_env.py`) holds the code
to the source, not to the writer's word. A tool's merge signature is the evidence's operation plus its
required argument types and return type (`lookup:customers.city:by:customer_id:string->object`): tools
with equal signatures compute the same function of the same data and are candidates for merging.
"""

from __future__ import annotations

import contextlib
import random
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from arenaforge.schemas.models import Evidence, FunctionDoc, GoldCall, QAInstance, SubQA
from arenaforge.services.models import ChatModel, NoAnswer, Step, complete_json, reads_prompts
from arenaforge.tracks.envs.answers import fmt_value, same_answer
from arenaforge.tracks.envs.evidence import kind_of, tool_data
from arenaforge.tracks.envs.knowledge import KnowledgeSource
from arenaforge.tracks.envs.prompts import load_prompt
from arenaforge.tracks.envs.tool_data import Probe, ToolData, typed
from arenaforge.tracks.envs.tool_impl import BuildError, ToolImpl, args_valid, check_doc, stdlib_only


def _offline_rules() -> ModuleType:
    from arenaforge.tracks.envs import offline_tools  # its rules read this module's types: loaded after it

    return offline_tools


DOC_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["name", "description", "parameters"],
    "properties": {"name": {"type": "string", "pattern": "^[A-Za-z0-9_]{1,64}$"}, "description": {"type": "string"},
                   "parameters": {"type": "object"}},
}
TOOL_DOC = Step("envs.tool_doc", prompt="envs_tool_doc", schema=DOC_SCHEMA, max_tokens=400,
                offline=lambda: _offline_rules().tool_doc)
AUGMENT_TOOL = Step("envs.augment_tool", prompt="envs_augment_tool", schema=DOC_SCHEMA, max_tokens=500,
                    offline=lambda: _offline_rules().augment_tool)
IMPL_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["code", "call"],
    "properties": {
        "code": {"type": "string", "minLength": 10},
        "call": {"type": "object", "required": ["arguments"], "properties": {"arguments": {"type": "object"}}},
    },
}
TOOL_CODE_MODES = ("model", "evidence")
IMPLEMENT_TOOL = Step("envs.implement_tool", prompt="envs_implement_tool", schema=IMPL_SCHEMA, max_tokens=1200,
                      offline=lambda: _offline_rules().implement_tool)


def evidence_doc_schema(key: str, key_type: str) -> dict[str, Any]:
    """A tool document whose one parameter is the evidence's key, as the program's code takes it: a model fills in
    the name and the descriptions and can get nothing else wrong (constrained decoding enforces the shape)."""
    text = {"type": "string", "minLength": 10, "maxLength": 200}
    param = {"type": "object", "additionalProperties": False, "required": ["type", "description"],
             "properties": {"type": {"const": key_type}, "description": text}}
    return {"type": "object", "additionalProperties": False, "required": ["name", "description", "parameters"],
            "properties": {
                "name": {"type": "string", "pattern": "^[a-z][a-z0-9_]{2,40}$"}, "description": text,
                "parameters": {"type": "object", "additionalProperties": False,
                               "required": ["type", "properties", "required"],
                               "properties": {"type": {"const": "object"},
                                              "properties": {"type": "object", "additionalProperties": False,
                                                             "required": [key], "properties": {key: param}},
                                              "required": {"type": "array", "minItems": 1, "maxItems": 1,
                                                           "items": {"const": key}}}}}}


@dataclass(frozen=True)
class ToolInputs:
    """What the three tool-building prompts of one sub-QA are rendered from."""

    qa: QAInstance
    sub: SubQA
    attempt: int
    feedback: str
    data: ToolData  # the rows the tool will hold, from the source


def signature(evidence: Evidence, doc: FunctionDoc) -> str:
    """Operation + required argument types + return type: equal signatures are merge candidates."""
    kind = kind_of(evidence)
    props = doc.parameters.get("properties", {})
    types = ",".join(str(props.get(name, {}).get("type", "any")) for name in doc.parameters.get("required", []))
    return f"{evidence.kind}:{kind.target(evidence)}:by:{evidence.key}:{types}->{kind.returns}"


class ToolBuilder:
    """Tool doc -> complexity augmentation -> implementation and call, from the run's model, over source data."""

    def __init__(self, model: ChatModel, source: KnowledgeSource | None = None, seed: int = 0,
                 tool_code: str = "model") -> None:
        self.model = model
        self.source = source
        self.seed = seed
        self.tool_code = tool_code  # "evidence": the model writes the document, the program the code
        self.p_doc = load_prompt(TOOL_DOC.prompt)
        self.p_aug = load_prompt(AUGMENT_TOOL.prompt)
        self.p_impl = load_prompt(IMPLEMENT_TOOL.prompt)

    async def _ask(self, step: Step, text: Callable[[], str], schema: dict[str, Any], seed: int, inputs: ToolInputs
                   ) -> Any:
        try:
            return await complete_json(self.model, step, text, schema, seed=seed, inputs=inputs)
        except NoAnswer as err:
            raise BuildError(err.reason, err.detail) from None

    async def build(self, qa: QAInstance, sub: SubQA, attempt: int, feedback: str) -> ToolImpl:
        if self.source is None:
            raise BuildError("source_unavailable", f"knowledge source {qa.source} is not loaded")
        # the records a tool holds depend on the sub-QA alone, never on the attempt that wrote its code
        data = tool_data(self.source, qa, sub, random.Random(f"{self.seed}:{qa.id}:{sub.index}"))
        ev = data.evidence
        inputs = ToolInputs(qa, sub, attempt, feedback, data)
        seed = attempt * 1000 + sub.index
        others = ", ".join(s.question for s in qa.sub_qas if s.index != sub.index and s.needs_tool) or "(none)"
        by_evidence = self.tool_code == "evidence"
        doc_schema = evidence_doc_schema(ev.key or "", data.key_type) if by_evidence and reads_prompts(self.model) \
            else DOC_SCHEMA
        raw = await self._ask(TOOL_DOC, lambda: self.p_doc.render(
            main_question=qa.main_question, question=sub.question, answer=sub.answer, other_tools=others,
            computes=kind_of(ev).computes(ev), key=ev.key, key_type=data.key_type), doc_schema, seed, inputs)
        base = check_doc(raw)
        if by_evidence:
            return self._from_evidence(qa, sub, base, data)
        raw = await self._ask(AUGMENT_TOOL, lambda: self.p_aug.render(tool=base.model_dump_json()), DOC_SCHEMA,
                              seed, inputs)
        doc = check_doc(raw)
        if doc.name != base.name or not set(base.parameters.get("required", [])) <= set(doc.parameters.get("required", [])) | set(
                doc.parameters.get("properties", {})):
            doc = base  # augmentation that renames the tool or drops parameters is ignored
        note = f"A previous implementation failed: {feedback}\nFix it." if feedback else ""
        impl = await self._ask(IMPLEMENT_TOOL, lambda: self.p_impl.render(
            tool=doc.model_dump_json(), question=sub.question, answer=sub.answer, feedback=note, name=doc.name,
            computes=kind_of(ev).computes(ev), layout=data.layout, sample=data.sample(), key=ev.key, value=ev.value),
            IMPL_SCHEMA, seed, inputs)
        bad = stdlib_only(impl["code"])
        if bad:
            raise BuildError("non_stdlib_code", f"code imports {bad}")
        args = impl["call"]["arguments"]
        why = args_valid(doc, args)
        if why:
            raise BuildError("invalid_call", f"call arguments break the tool schema: {why}")
        key_arg = next((k for k, v in args.items() if same_answer(str(fmt_value(v)), str(ev.value))), None)
        if key_arg is None:
            raise BuildError("invalid_call", f"the call does not pass the {ev.key} {ev.value!r} of the sub-question")
        key_type = doc.parameters.get("properties", {}).get(key_arg, {}).get("type", data.key_type)
        probes = []
        for value, answer in data.others:
            try:
                probe = Probe({**args, key_arg: typed(value, key_type)}, answer)
            except ValueError:
                continue  # a key the declared parameter type cannot hold
            if args_valid(doc, probe.arguments) is None:
                probes.append(probe)
        call = GoldCall(tool=doc.name, arguments=args, sub_qa=sub.index, answer=sub.answer)
        return ToolImpl(doc, impl["code"], data.data, signature(ev, doc), [call], probes, origin=self.model.kind,
                        written_by=dict.fromkeys(("tool_docs", "tool_code"), _writer(self.model)))

    def _from_evidence(self, qa: QAInstance, sub: SubQA, doc: FunctionDoc, data: ToolData) -> ToolImpl:
        """The model's document over the program's code (`EvidenceKind.code`); the gold call passes the
        evidence's key value, the probes the data's other keys, as for a model's code."""
        ev = data.evidence
        key = ev.key or ""
        if key not in doc.parameters.get("required", []):
            raise BuildError("invalid_tool_doc", f"the document does not take the {key} as a required parameter")
        args = {key: typed(ev.value, data.key_type)}
        probes = []
        for value, answer in data.others:
            with contextlib.suppress(ValueError):  # a key the parameter type cannot hold
                probes.append(Probe({key: typed(value, data.key_type)}, answer))
        call = GoldCall(tool=doc.name, arguments=args, sub_qa=sub.index, answer=sub.answer)
        code = textwrap.dedent(kind_of(ev).code(data, doc.name))
        return ToolImpl(doc, code, data.data, signature(ev, doc), [call], probes, origin=self.model.kind,
                        written_by={"tool_docs": _writer(self.model), "tool_code": "program"})


def _writer(model: ChatModel) -> str:
    """Who wrote what a step answered: a model, or the program's rules (the offline provider)."""
    return "model" if reads_prompts(model) else "program"
