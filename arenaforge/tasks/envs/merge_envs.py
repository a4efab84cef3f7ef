"""Sub-environment merging (ASTRA §1b.4): functionally equivalent tools become one tool.

Equivalent = same operation, same argument and return types. The run's model clusters the tool
documents (tasks/prompts/envs_merge_cluster.txt; the offline provider groups equal signatures,
`ToolImpl.signature`, e.g. `lookup:customers.city:by:customer_id:string->object`), and a group is kept
only where parameter names and types agree.

Within a group, members are added greedily while their gold answers do not collide (a merged
tool must not answer one QA's call with another QA's answer). The merged tool keeps the first
member's document and code and the union of every member's mock data. Every QA the merged tool
serves is re-verified in the sandbox (its gold calls still answer; its probes and the other
members' gold calls do not return its answer); if any fails, the members keep their own tools
and the `EnvMerge` row says why.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, replace
from typing import Any

from arenaforge.environments.reward import answer_matches, gold_call_passes
from arenaforge.schemas.errors import ParseError, ProviderError
from arenaforge.schemas.kinds_envs import EnvMerge, MergeMember
from arenaforge.tasks.envs.tool_impl import BuildError, EnvDraft, ToolImpl, merge_data
from arenaforge.tasks.models import ChatModel, complete_json, graded_by
from arenaforge.tasks.prompts import load_prompt

MERGE_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["groups"],
    "properties": {"groups": {"type": "array", "items": {
        "type": "object", "required": ["tools"],
        "properties": {"tools": {"type": "array", "items": {"type": "string"}, "minItems": 2},
                       "operation": {"type": "string"}}}}},
}


def _param_types(tool: ToolImpl) -> dict[str, Any]:
    return {k: v.get("type") for k, v in tool.doc.parameters.get("properties", {}).items()}


class ToolGrouper:
    """Groups of equivalent tools, from the run's model; groups whose parameter names/types differ are dropped."""

    def __init__(self, model: ChatModel) -> None:
        self.model = model
        self.method = "signature" if graded_by(model) == "rules" else "model"
        self.prompt = load_prompt("envs_merge_cluster")

    async def groups(self, tools: list[tuple[int, ToolImpl]]) -> list[list[tuple[int, ToolImpl]]]:
        labelled = {f"{t.name}@{i}": (i, t) for i, t in tools}
        listing = "\n".join(json.dumps({"tool": key, "description": t.doc.description, "parameters": _param_types(t)})
                            for key, (_, t) in labelled.items())
        try:
            answer = await complete_json(self.model, "envs.merge_cluster", lambda: self.prompt.render(tools=listing),
                                         MERGE_SCHEMA, temperature=0.0, inputs=labelled)
        except (ParseError, ProviderError):
            return []  # no merge is always safe: every tool stays verified as it is
        out, used = [], set()
        for group in answer["groups"]:
            members = [labelled[k] for k in group["tools"] if k in labelled and k not in used]
            if len(members) >= 2 and len({json.dumps(_param_types(t), sort_keys=True) for _, t in members}) == 1:
                used.update(k for k in group["tools"])
                out.append(members)
        return out


@dataclass
class MergeResult:
    drafts: list[EnvDraft]
    merges: list[EnvMerge]


def _collides(a: ToolImpl, b: ToolImpl) -> bool:
    answers_a = [c.answer or "" for c in a.calls]
    answers_b = [c.answer or "" for c in b.calls]
    if any(answer_matches(x, y) or answer_matches(y, x) for x in answers_a for y in answers_b):
        return True
    if isinstance(a.data, dict) and isinstance(b.data, dict):  # same key, different record
        return any(a.data[k] != b.data[k] for k in set(a.data) & set(b.data))
    return False


def _partition(group: list[tuple[int, ToolImpl]]) -> list[list[tuple[int, ToolImpl]]]:
    """Greedy subsets of one draft each whose gold answers and records do not collide."""
    subsets: list[list[tuple[int, ToolImpl]]] = []
    for item in group:
        for subset in subsets:
            if all(i != item[0] and not _collides(t, item[1]) for i, t in subset):
                subset.append(item)
                break
        else:
            subsets.append([item])
    return [s for s in subsets if len(s) >= 2]


def _without_foreign_answers(data: Any, members: list[ToolImpl]) -> Any:
    """Keyed records other than the members' gold ones, minus those that would answer a member's question."""
    if not isinstance(data, dict):
        return data
    golds = [c.answer or "" for t in members for c in t.calls]
    gold_keys = {str(v) for t in members for c in t.calls for v in c.arguments.values()}
    return {k: v for k, v in data.items()
            if k in gold_keys or not any(answer_matches(g, json.dumps(v)) for g in golds)}


async def check_merged(pool: Any, tool: ToolImpl, members: list[tuple[str, ToolImpl]]) -> list[str]:
    """Re-verify every QA a merged tool serves, in one session of the tool alone.

    Each member's gold calls must still return its answer; every other valid argument (all
    members' probes and the other members' gold calls) must return none of a member's answers
    unless it is that member's own gold call. Tools are independent functions over their own
    DATA entry, so checking the tool alone is checking it in every environment that uses it.
    """
    from arenaforge.environments.runtime import EnvironmentFailure, EnvLoadError
    from arenaforge.schemas.models import Environment

    golds = [(qa_id, c) for qa_id, t in members for c in t.calls]
    args_seen: list[dict[str, Any]] = []
    for _, t in members:
        for a in [c.arguments for c in t.calls] + [p.arguments for p in t.probes]:
            if a not in args_seen:
                args_seen.append(a)
    env = Environment(name=f"merge-{tool.name}", tools=[tool.doc], code=f"DATA = {{}}\n\n{tool.source}",
                      data_var="DATA", initial_state={tool.name: tool.data})
    failures: list[str] = []
    try:
        session = await pool.open(env)
    except EnvLoadError as err:
        return [f"import_error: {err.detail[-200:]}"]
    try:
        for args in args_seen:
            try:
                obs = await pool.call(session, tool.name, args)
            except EnvironmentFailure as err:  # the sandbox failed: no merge on that evidence
                return [f"sandbox_failure: {str(err)[:200]}"]
            if obs.outcome == "timeout":
                return [f"timeout: {tool.name}({json.dumps(args)})"]
            for qa_id, call in golds:
                if call.arguments == args and not gold_call_passes(call.answer, obs.outcome, obs.output):
                    failures.append(f"{qa_id}: wrong_answer: {tool.name}({json.dumps(args)}) gave "
                                    f"{obs.outcome} {(obs.output or obs.error or '')[:120]!r}, expected {call.answer!r}")
                elif call.arguments != args and obs.outcome == "ok" and answer_matches(call.answer or "", obs.output):
                    failures.append(f"{qa_id}: answer_leak: {tool.name}({json.dumps(args)}) also returns {call.answer!r}")
    finally:
        await pool.close(session)
    return failures


async def merge_environments(grouper: ToolGrouper, pool: Any, drafts: list[EnvDraft], run_id: str | None = None,
                             concurrency: int = 64) -> MergeResult:
    tools = [(i, t) for i, d in enumerate(drafts) for t in d.tools]
    groups = [s for g in await grouper.groups(tools) for s in _partition(g)]
    current = list(drafts)
    merges: list[EnvMerge] = []
    sem = asyncio.Semaphore(concurrency)

    plans = []
    for subset in groups:
        first = subset[0][1]
        try:
            data = first.data
            for _, t in subset[1:]:
                data = merge_data(data, t.data)
        except BuildError as err:
            plans.append((subset, None, [], [str(err)]))
            continue
        merged_tool = replace(first, data=_without_foreign_answers(data, [t for _, t in subset]))
        candidates = []
        for i, t in subset:
            calls = [c.model_copy(update={"tool": first.name}) for c in t.calls]
            own = replace(merged_tool, calls=calls, probes=list(t.probes))
            new_tools = [own if x.name == t.name else x for x in current[i].tools]
            if len({x.name for x in new_tools}) != len(new_tools):
                candidates = []
                break
            candidates.append((i, EnvDraft(current[i].qa, new_tools, current[i].attempt), None, t.name, own))
        plans.append((subset, merged_tool, candidates, [] if candidates else ["merged tool name clashes in an environment"]))

    async def verify(plan: Any) -> list[str]:
        subset, merged_tool, candidates, reasons = plan
        if merged_tool is None or not candidates:
            return reasons
        async with sem:
            return await check_merged(pool, merged_tool, [(current[c[0]].qa.id, c[4]) for c in candidates])

    verdicts = await asyncio.gather(*(verify(p) for p in plans))
    for (subset, merged_tool, candidates, _), failures in zip(plans, verdicts, strict=True):
        ok = merged_tool is not None and bool(candidates) and not failures
        members = [MergeMember(env_id=drafts[i].environment().id, qa_id=drafts[i].qa.id, tool=t.name) for i, t in subset]
        rows = len(merged_tool.data) if merged_tool is not None and hasattr(merged_tool.data, "__len__") else 0
        merges.append(EnvMerge(signature=subset[0][1].signature, merged_tool=subset[0][1].name, members=members,
                               method=grouper.method, merged=ok, rows=rows,  # type: ignore[arg-type]
                               reasons=[] if ok else failures[:5], parents=[m.qa_id or m.env_id for m in members],
                               run_id=run_id))
        if ok:  # swap in the merged tool (other merges may already have changed other tools of the draft)
            for i, _, _, old_name, own in candidates:
                d = current[i]
                current[i] = EnvDraft(d.qa, [own if x.name == old_name else x for x in d.tools], d.attempt)
    return MergeResult(current, merges)
