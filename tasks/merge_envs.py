"""Sub-environment merging (ASTRA §1b.4): functionally equivalent tools become one tool.

Equivalent = same operation, same argument and return types. Two groupers, picked by
`GROUPERS[cfg.model.backend]`:

* offline — tools whose generator template and signature are equal (`ToolImpl.signature`,
  e.g. `lookup:customers.city:by:customer_id:string->object`);
* openai — a clustering prompt (tasks/prompts/envs_merge_cluster.txt) over the tool docs, whose
  groups are then kept only where parameter names and types agree.

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
from typing import Any, Protocol

from environments.reward import answer_matches
from schemas.errors import ParseError, ProviderError
from schemas.kinds_envs import EnvMerge, MergeMember
from tasks.prompts import load_prompt
from tasks.synthesize_env import BuildError, EnvDraft, ToolImpl, check_environment, merge_data


class Grouper(Protocol):
    method: str

    async def groups(self, tools: list[tuple[int, ToolImpl]]) -> list[list[tuple[int, ToolImpl]]]: ...


class SignatureGrouper:
    """Offline: equal generator template + signature."""

    method = "signature"

    async def groups(self, tools: list[tuple[int, ToolImpl]]) -> list[list[tuple[int, ToolImpl]]]:
        by_sig: dict[str, list[tuple[int, ToolImpl]]] = {}
        for item in tools:
            by_sig.setdefault(item[1].signature, []).append(item)
        return [g for g in by_sig.values() if len({i for i, _ in g}) >= 2]


MERGE_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["groups"],
    "properties": {"groups": {"type": "array", "items": {
        "type": "object", "required": ["tools"],
        "properties": {"tools": {"type": "array", "items": {"type": "string"}, "minItems": 2},
                       "operation": {"type": "string"}}}}},
}


def _param_types(tool: ToolImpl) -> dict[str, Any]:
    return {k: v.get("type") for k, v in tool.doc.parameters.get("properties", {}).items()}


class ModelGrouper:
    """openai: a clustering prompt; groups whose parameter names/types differ are dropped."""

    method = "model"

    def __init__(self, model: Any) -> None:
        self.model = model
        self.prompt = load_prompt("envs_merge_cluster")

    async def groups(self, tools: list[tuple[int, ToolImpl]]) -> list[list[tuple[int, ToolImpl]]]:
        from tasks.models import complete_json

        labelled = {f"{t.name}@{i}": (i, t) for i, t in tools}
        listing = "\n".join(json.dumps({"tool": key, "description": t.doc.description, "parameters": _param_types(t)})
                            for key, (_, t) in labelled.items())
        try:
            answer = await complete_json(self.model, "envs.merge_cluster",
                                         [{"role": "user", "content": self.prompt.render(tools=listing)}], MERGE_SCHEMA,
                                         temperature=0.0)
        except (ParseError, ProviderError):
            return []  # no merge is always safe: every tool stays verified as it is
        out, used = [], set()
        for group in answer["groups"]:
            members = [labelled[k] for k in group["tools"] if k in labelled and k not in used]
            if len(members) >= 2 and len({json.dumps(_param_types(t), sort_keys=True) for _, t in members}) == 1:
                used.update(k for k in group["tools"])
                out.append(members)
        return out


GROUPERS = {"offline": lambda model: SignatureGrouper(), "openai": ModelGrouper}


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


async def merge_environments(grouper: Grouper, pool: Any, drafts: list[EnvDraft], run_id: str | None = None,
                             concurrency: int = 64) -> MergeResult:
    tools = [(i, t) for i, d in enumerate(drafts) for t in d.tools]
    groups = [s for g in await grouper.groups(tools) for s in _partition(g)]
    current = list(drafts)
    merges: list[EnvMerge] = []
    sem = asyncio.Semaphore(concurrency)

    async def check(draft: EnvDraft, probes: dict[str, list[dict[str, Any]]]) -> Any:
        async with sem:
            return await check_environment(pool, draft.environment(), probes)

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
        merged_tool = replace(first, data=data)
        candidates = []
        for i, t in subset:
            calls = [c.model_copy(update={"tool": first.name}) for c in t.calls]
            own = replace(merged_tool, calls=calls, probes=list(t.probes))
            # every valid argument of the merged tool: all members' probes and the other members' gold calls
            own_args = [c.arguments for c in t.calls]
            others = [a for j, u in subset if j != i for a in [c.arguments for c in u.calls] + u.probes]
            others = [a for k, a in enumerate(others) if a not in own_args and a not in others[:k]]
            new_tools = [own if x.name == t.name else x for x in current[i].tools]
            if len({x.name for x in new_tools}) != len(new_tools):
                candidates = []
                break
            candidates.append((i, EnvDraft(current[i].qa, new_tools, current[i].attempt), own.probes + others, t.name, own))
        plans.append((subset, merged_tool, candidates, [] if candidates else ["merged tool name clashes in an environment"]))

    async def verify(plan: Any) -> list[str]:
        subset, merged_tool, candidates, reasons = plan
        if merged_tool is None or not candidates:
            return reasons
        results = await asyncio.gather(*(check(c[1], {merged_tool.name: c[2]}) for c in candidates))
        return [f"{current[c[0]].qa.id}: {'; '.join(r.details)[:300]}" for c, r in zip(candidates, results, strict=True)
                if not r.ok]

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
