"""Tool building (ASTRA §1b.3, "spec -> complexity -> code"): one tool per tool-needing sub-question.

Three requests to the run's model, each answer JSON-Schema-validated: a tool document
(tasks/prompts/envs_tool_doc.txt, an OpenAI function), a raised-complexity version of it (extra
optional parameters; ignored when it renames the tool or drops a parameter), and the implementation
(standard-library Python reading its mock data from `DATA[<tool name>]`, the mock data, the call that
answers the sub-question, the operation it performs and the type it returns). The offline provider
answers from templates over the knowledge source (`tasks/offline/envs_tools.py`).

A tool's merge signature is its operation plus its required argument types and return type
(`lookup:customers.city:by:customer_id:string->object`): tools with equal signatures are candidates
for merging (tasks/envs/merge_envs.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from arenaforge.schemas.models import FunctionDoc, GoldCall, QAInstance, SubQA
from arenaforge.tasks.envs.knowledge import KnowledgeSource
from arenaforge.tasks.envs.tool_impl import BuildError, ToolImpl, args_valid, check_doc, stdlib_only
from arenaforge.tasks.models import ChatModel, NoAnswer, complete_json
from arenaforge.tasks.prompts import load_prompt

DOC_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["name", "description", "parameters"],
    "properties": {"name": {"type": "string", "pattern": "^[A-Za-z0-9_]{1,64}$"}, "description": {"type": "string"},
                   "parameters": {"type": "object"}},
}
IMPL_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["code", "mock_data", "call", "operation", "returns"],
    "properties": {
        "code": {"type": "string", "minLength": 10},
        "mock_data": {},
        "call": {"type": "object", "required": ["arguments"], "properties": {"arguments": {"type": "object"}}},
        "operation": {"type": "string", "minLength": 1,
                      "description": "What the tool does, as op:entity.field:by:key (e.g. lookup:orders.status:by:order_id)."},
        "returns": {"type": "string", "enum": ["object", "array", "string", "integer", "number", "boolean"]},
        "probes": {"type": "array", "items": {"type": "object"},
                   "description": "Other valid arguments, naming other records, that must not return the answer."},
    },
}


@dataclass(frozen=True)
class ToolInputs:
    """What the three tool-building prompts of one sub-QA are rendered from."""

    qa: QAInstance
    sub: SubQA
    attempt: int
    feedback: str
    source: KnowledgeSource | None
    seed: int = 0  # the run's generator seed


def signature(operation: str, doc: FunctionDoc, returns: str) -> str:
    """Operation + required argument types + return type: equal signatures are merge candidates."""
    props = doc.parameters.get("properties", {})
    types = ",".join(str(props.get(name, {}).get("type", "any")) for name in doc.parameters.get("required", []))
    return f"{operation}:{types}->{returns}"


class ToolBuilder:
    """Tool doc -> complexity augmentation -> implementation + mock data + call, from the run's model."""

    def __init__(self, model: ChatModel, source: KnowledgeSource | None = None, seed: int = 0) -> None:
        self.model = model
        self.source = source
        self.seed = seed
        self.p_doc = load_prompt("envs_tool_doc")
        self.p_aug = load_prompt("envs_augment_tool")
        self.p_impl = load_prompt("envs_implement_tool")

    async def _ask(self, step: str, text: str, schema: dict[str, Any], seed: int, inputs: ToolInputs) -> Any:
        try:
            return await complete_json(self.model, step, [{"role": "user", "content": text}], schema, seed=seed,
                                       inputs=inputs)
        except NoAnswer as err:
            raise BuildError(err.reason, err.detail) from None

    async def build(self, qa: QAInstance, sub: SubQA, attempt: int, feedback: str) -> ToolImpl:
        inputs = ToolInputs(qa, sub, attempt, feedback, self.source, self.seed)
        seed = attempt * 1000 + sub.index
        others = ", ".join(s.question for s in qa.sub_qas if s.index != sub.index and s.needs_tool) or "(none)"
        raw = await self._ask("envs.tool_doc", self.p_doc.render(main_question=qa.main_question, question=sub.question,
                                                                answer=sub.answer, other_tools=others),
                              DOC_SCHEMA, seed, inputs)
        base = check_doc(raw)
        raw = await self._ask("envs.augment_tool", self.p_aug.render(tool=base.model_dump_json()), DOC_SCHEMA, seed,
                              inputs)
        doc = check_doc(raw)
        if doc.name != base.name or not set(base.parameters.get("required", [])) <= set(doc.parameters.get("required", [])) | set(
                doc.parameters.get("properties", {})):
            doc = base  # augmentation that renames the tool or drops parameters is ignored
        note = f"A previous implementation failed: {feedback}\nFix it." if feedback else ""
        impl = await self._ask("envs.implement_tool", self.p_impl.render(tool=doc.model_dump_json(), question=sub.question,
                                                                        answer=sub.answer, feedback=note, name=doc.name),
                               IMPL_SCHEMA, seed, inputs)
        bad = stdlib_only(impl["code"])
        if bad:
            raise BuildError("non_stdlib_code", f"code imports {bad}")
        args = impl["call"]["arguments"]
        why = args_valid(doc, args)
        if why:
            raise BuildError("invalid_call", f"call arguments break the tool schema: {why}")
        call = GoldCall(tool=doc.name, arguments=args, sub_qa=sub.index, answer=sub.answer)
        probes = [p for p in impl.get("probes") or [] if args_valid(doc, p) is None and p != args]
        probes = probes or probe_arguments(doc, args, impl["mock_data"])
        return ToolImpl(doc, impl["code"], impl["mock_data"], signature(impl["operation"], doc, impl["returns"]),
                        [call], probes, origin=self.model.kind)


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
