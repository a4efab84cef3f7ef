"""Tool building (ASTRA §1b.3, "spec -> complexity -> code"): one tool per tool-needing sub-question.

The tool's data is the knowledge source's (`tool_data.py`): the rows behind the sub-QA's evidence and a
few others. Three requests to the run's model, each answer JSON-Schema-validated: a tool document
(tasks/prompts/envs_tool_doc.txt, an OpenAI function), a raised-complexity version of it (extra optional
parameters; ignored when it renames the tool or drops a parameter), and the implementation (standard-library
Python reading `DATA[<tool name>]` in the data's layout) with the call that answers the sub-question. The
offline provider answers from templates (`tasks/offline/envs_tools.py`).

The gold call must pass the evidence's key value; the same call with the other keys of the data (the
`Probe`s) must return what the source says for them, so the sandbox check (`check_env.py`) holds the code
to the source, not to the writer's word. A tool's merge signature is the evidence's operation plus its
required argument types and return type (`lookup:customers.city:by:customer_id:string->object`): tools
with equal signatures compute the same function of the same data and are candidates for merging.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from arenaforge.schemas.models import Evidence, FunctionDoc, GoldCall, QAInstance, SubQA
from arenaforge.tasks.envs.answers import fmt_value, same_answer
from arenaforge.tasks.envs.knowledge import KnowledgeSource
from arenaforge.tasks.envs.tool_data import Probe, ToolData, tool_data, typed
from arenaforge.tasks.envs.tool_impl import BuildError, ToolImpl, args_valid, check_doc, stdlib_only
from arenaforge.tasks.models import ChatModel, NoAnswer, complete_json
from arenaforge.tasks.prompts import load_prompt

DOC_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["name", "description", "parameters"],
    "properties": {"name": {"type": "string", "pattern": "^[A-Za-z0-9_]{1,64}$"}, "description": {"type": "string"},
                   "parameters": {"type": "object"}},
}
IMPL_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["code", "call"],
    "properties": {
        "code": {"type": "string", "minLength": 10},
        "call": {"type": "object", "required": ["arguments"], "properties": {"arguments": {"type": "object"}}},
    },
}
_RETURNS = {"lookup": "object", "count": "integer", "sum": "number"}


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
    what = evidence.table if evidence.kind == "count" else f"{evidence.table}.{evidence.column}"
    props = doc.parameters.get("properties", {})
    types = ",".join(str(props.get(name, {}).get("type", "any")) for name in doc.parameters.get("required", []))
    return f"{evidence.kind}:{what}:by:{evidence.key}:{types}->{_RETURNS.get(evidence.kind, 'object')}"


def describe(evidence: Evidence) -> str:
    """The evidence as the tool-writing prompts state it."""
    if evidence.kind == "lookup":
        return f"the {evidence.column} of the {evidence.table} row whose {evidence.key} is given"
    if evidence.kind == "count":
        return f"the number of {evidence.table} rows whose {evidence.key} is given"
    return f"the total {evidence.column} of the {evidence.table} rows whose {evidence.key} is given (2 decimals)"


class ToolBuilder:
    """Tool doc -> complexity augmentation -> implementation and call, from the run's model, over source data."""

    def __init__(self, model: ChatModel, source: KnowledgeSource | None = None, seed: int = 0) -> None:
        self.model = model
        self.source = source
        self.seed = seed
        self.p_doc = load_prompt("envs_tool_doc")
        self.p_aug = load_prompt("envs_augment_tool")
        self.p_impl = load_prompt("envs_implement_tool")

    async def _ask(self, step: str, text: Callable[[], str], schema: dict[str, Any], seed: int, inputs: ToolInputs
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
        raw = await self._ask("envs.tool_doc", lambda: self.p_doc.render(
            main_question=qa.main_question, question=sub.question, answer=sub.answer, other_tools=others,
            computes=describe(ev), key=ev.key, key_type=data.key_type), DOC_SCHEMA, seed, inputs)
        base = check_doc(raw)
        raw = await self._ask("envs.augment_tool", lambda: self.p_aug.render(tool=base.model_dump_json()), DOC_SCHEMA,
                              seed, inputs)
        doc = check_doc(raw)
        if doc.name != base.name or not set(base.parameters.get("required", [])) <= set(doc.parameters.get("required", [])) | set(
                doc.parameters.get("properties", {})):
            doc = base  # augmentation that renames the tool or drops parameters is ignored
        note = f"A previous implementation failed: {feedback}\nFix it." if feedback else ""
        impl = await self._ask("envs.implement_tool", lambda: self.p_impl.render(
            tool=doc.model_dump_json(), question=sub.question, answer=sub.answer, feedback=note, name=doc.name,
            computes=describe(ev), layout=data.layout, sample=data.sample(), key=ev.key, value=ev.value),
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
        return ToolImpl(doc, impl["code"], data.data, signature(ev, doc), [call], probes, origin=self.model.kind)
