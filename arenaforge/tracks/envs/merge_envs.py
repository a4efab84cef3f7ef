"""Sub-environment merging (ASTRA §1b.4): functionally equivalent tools become one tool.

Equivalent = same operation, same argument and return types. The run's model clusters the tool
documents (tracks/envs/prompts/envs_merge_cluster.txt; the offline provider groups equal signatures,
`ToolImpl.signature`, e.g. `lookup:customers.city:by:customer_id:string->object`), and a group is kept
only where parameter names and types agree.

Within a group, members are added greedily while their gold answers do not collide (a merged
tool must not answer one QA's call with another QA's answer). The merged tool keeps the first
member's document and code and the union of every member's mock data. Every QA the merged tool
serves is re-verified in the sandbox (its gold calls still answer; its probes and the other
members' gold calls do not return its answer); if any fails, the members keep their own tools
and the `EnvMerge` row says why.

Merging is incremental: a `MergeIndex` holds every group and subset seen so far (a run's earlier batches or
windows, and earlier runs' `MergeCandidate` rows looked up by signature), and each batch goes on with the greedy
placement where the last one stopped; see docs/ENVS.md, "Merging across batches, windows and runs".
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from types import ModuleType
from typing import Any

from arenaforge.environments.reward import answer_matches, gold_call_passes
from arenaforge.schemas.errors import ParseError, ProviderError
from arenaforge.schemas.kinds_envs import EnvMerge, MergeCandidate, MergeMember, MergeProbe
from arenaforge.services.models import ChatModel, Step, complete_json, graded_by
from arenaforge.tracks.envs.prompts import load_prompt
from arenaforge.tracks.envs.tool_data import Probe
from arenaforge.tracks.envs.tool_impl import BuildError, EnvDraft, ToolImpl, merge_data


def _offline_rules() -> ModuleType:
    from arenaforge.tracks.envs import offline_merge  # its rules read this module's types: loaded after it

    return offline_merge


MERGE_SCHEMA: dict[str, Any] = {
    "type": "object", "required": ["groups"],
    "properties": {"groups": {"type": "array", "items": {
        "type": "object", "required": ["tools"],
        "properties": {"tools": {"type": "array", "items": {"type": "string"}, "minItems": 2},
                       "operation": {"type": "string"}}}}},
}


MERGE_CLUSTER = Step("envs.merge_cluster", prompt="envs_merge_cluster", schema=MERGE_SCHEMA, max_tokens=800,
                     offline=lambda: _offline_rules().merge_cluster)


def _param_types(tool: ToolImpl) -> dict[str, Any]:
    return {k: v.get("type") for k, v in tool.doc.parameters.get("properties", {}).items()}


class ToolGrouper:
    """Groups of equivalent tools, from the run's model; groups whose parameter names/types differ are dropped."""

    def __init__(self, model: ChatModel) -> None:
        self.model = model
        self.method = "signature" if graded_by(model) == "rules" else "model"
        self.prompt = load_prompt(MERGE_CLUSTER.prompt)

    async def groups(self, tools: list[tuple[int, ToolImpl]]) -> list[list[tuple[int, ToolImpl]]]:
        labelled = {f"{t.name}@{i}": (i, t) for i, t in tools}
        listing = "\n".join(json.dumps({"tool": key, "description": t.doc.description, "parameters": _param_types(t)})
                            for key, (_, t) in labelled.items())
        try:
            answer = await complete_json(self.model, MERGE_CLUSTER, lambda: self.prompt.render(tools=listing),
                                         temperature=0.0, inputs=labelled)
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
    candidates: list[MergeCandidate] = field(default_factory=list)  # the window's tools, for later windows and runs
    new_groups: int = 0  # merged subsets that reached two members in this window (the others grew)


def _collides(a: ToolImpl, b: ToolImpl) -> bool:
    answers_a = [c.answer or "" for c in a.calls]
    answers_b = [c.answer or "" for c in b.calls]
    if any(answer_matches(x, y) or answer_matches(y, x) for x in answers_a for y in answers_b):
        return True
    if isinstance(a.data, dict) and isinstance(b.data, dict):  # same key, different record
        return any(a.data[k] != b.data[k] for k in set(a.data) & set(b.data))
    return False


@dataclass
class _Member:
    key: str  # "<qa_id>/<tool>"
    qa_id: str
    tool: ToolImpl
    owner: MergeMember
    position: int


@dataclass
class _Group:
    """Equivalent tools in arrival order, cut greedily into subsets whose gold answers and records do not collide."""

    key: str
    signature: str
    subsets: list[list[_Member]] = field(default_factory=list)
    size: int = 0

    def place(self, member: _Member) -> list[_Member]:
        for subset in self.subsets:
            if all(m.qa_id != member.qa_id and not _collides(m.tool, member.tool) for m in subset):
                subset.append(member)
                return subset
        self.subsets.append([member])
        return self.subsets[-1]


class MergeIndex:
    """The merge groups of every tool merging has seen: a run's earlier windows, and (through `load`, by
    signature) earlier runs' tools from the warehouse. Windows merged in order against it get the groups a
    batch merge of all their tools in that order gets: the greedy placement only ever appends."""

    def __init__(self, load: Callable[[list[str]], Awaitable[list[MergeCandidate]]] | None = None) -> None:
        self.groups: dict[str, _Group] = {}
        self.served: dict[str, int] = {}  # member key -> members of its subset its merged tool was built from
        self.where: dict[str, tuple[_Group, list[_Member]]] = {}
        self.load = load
        self.looked_up: set[str] = set()

    def add(self, rows: list[MergeCandidate]) -> None:
        """Candidates read back from the warehouse (a member already known is skipped)."""
        for row in sorted(rows, key=lambda r: (r.group, r.position)):
            key = f"{row.qa_id}/{row.doc.name}"
            if key in self.where:
                continue
            group = self.groups.setdefault(row.group, _Group(row.group, row.signature))
            tool = ToolImpl(row.doc, row.source, row.data, row.signature, list(row.calls),
                            [Probe(p.arguments, p.answer) for p in row.probes], row.origin, row.written_by)
            member = _Member(key, row.qa_id, tool, MergeMember(env_id=row.env_id, qa_id=row.qa_id, tool=row.doc.name),
                             row.position)
            subset = next((s for s in group.subsets if s[0].key == row.subset), None)
            if subset is None:
                group.subsets.append(subset := [])
            subset.append(member)
            group.size = max(group.size, row.position + 1)
            self.where[key] = (group, subset)
            self.served[key] = row.served_by
        for group in self.groups.values():
            group.subsets.sort(key=lambda s: s[0].position)

    async def lookup(self, signatures: set[str]) -> None:
        wanted = sorted(signatures - self.looked_up)
        if self.load is not None and wanted:
            self.add(await self.load(wanted))
        self.looked_up |= set(wanted)


def _merged_tool(members: list[_Member]) -> ToolImpl:
    """The first member's document and code over the union of every member's data (raises BuildError)."""
    first = members[0].tool
    data = first.data
    for m in members[1:]:
        data = merge_data(data, m.tool.data)
    return replace(first, data=_without_foreign_answers(data, [m.tool for m in members]))


def _served(merged: ToolImpl, tool: ToolImpl) -> ToolImpl:
    """The merged tool as one member's environment has it: that member's gold calls and probes."""
    return replace(merged, calls=[c.model_copy(update={"tool": merged.name}) for c in tool.calls],
                   probes=list(tool.probes))


def _without_foreign_answers(data: Any, members: list[ToolImpl]) -> Any:
    """Keyed records other than the members' gold ones, minus those that would answer a member's question."""
    if not isinstance(data, dict):
        return data
    golds = [c.answer or "" for t in members for c in t.calls]
    gold_keys = {str(v) for t in members for c in t.calls for v in c.arguments.values()}
    return {k: v for k, v in data.items() if k in gold_keys or not _answers_any(golds, json.dumps(v))}


def _answers_any(golds: list[str], text: str) -> bool:
    return any(answer_matches(g, text) for g in golds)


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
                             concurrency: int = 64, index: MergeIndex | None = None) -> MergeResult:
    """Merge one window's drafts against `index` (a fresh one: the window alone, as a batch merge).

    A window's tool that joins a subset gets the merged tool of the whole subset so far; earlier members keep
    the environments they were written with (a smaller merged tool: the same document and code over the
    data of the members before them). Every subset that grew is re-verified over all its members; its
    `EnvMerge` row names them all. A tool the index already holds (a re-run) gets back the merged tool it
    was served before, and nothing is re-verified or re-written."""
    index = index if index is not None else MergeIndex()
    current = list(drafts)
    tools = [(i, t) for i, d in enumerate(drafts) for t in d.tools]
    await index.lookup({t.signature for _, t in tools})
    new = [(i, t) for i, t in tools if f"{drafts[i].qa.id}/{t.name}" not in index.where]
    for i, t in tools:  # seen before: the same tool as then
        key = f"{drafts[i].qa.id}/{t.name}"
        if key in index.where and index.served.get(key, 0) >= 2:
            subset = index.where[key][1][: index.served[key]]
            try:
                own = _served(_merged_tool(subset), t)
            except BuildError:
                continue
            d = current[i]
            current[i] = EnvDraft(d.qa, [own if x.name == t.name else x for x in d.tools], d.attempt)
    if not new:
        return MergeResult(current, [])
    # the known groups of the window's signatures, each by its first tool, are listed with the window's tools
    # by key, not by when the index met them: a run resumed after a crash loads earlier windows' groups from the
    # warehouse in another order than the run that made them, and the listing is the grouping prompt
    known = sorted((g for g in index.groups.values() if g.signature in {t.signature for _, t in new}),
                   key=lambda g: g.key)
    offset = len(drafts)
    listing = new + [(offset + k, g.subsets[0][0].tool) for k, g in enumerate(known)]
    found = await grouper.groups(listing)
    grouped: set[tuple[int, str]] = set()
    touched: list[tuple[_Group, list[_Member], list[tuple[int, _Member]]]] = []  # (group, subset, new members)

    env_ids: dict[int, str] = {}  # per draft: its environment's content id, computed once for all its tools

    def join(group: _Group, i: int, t: ToolImpl) -> None:
        key = f"{drafts[i].qa.id}/{t.name}"
        if i not in env_ids:
            env_ids[i] = drafts[i].environment().id
        member = _Member(key, drafts[i].qa.id, t,
                         MergeMember(env_id=env_ids[i], qa_id=drafts[i].qa.id, tool=t.name), group.size)
        group.size += 1
        subset = group.place(member)
        index.where[key] = (group, subset)
        entry = next((e for e in touched if e[1] is subset), None)
        if entry is None:
            touched.append(entry := (group, subset, []))
        entry[2].append((i, member))

    for members in found:
        target = next((known[i - offset] for i, _ in members if i >= offset), None)
        fresh = [(i, t) for i, t in members if i < offset and (i, t.name) not in grouped]
        if not fresh:
            continue
        if target is None:
            first_i, first_t = fresh[0]
            target = index.groups.setdefault(f"{drafts[first_i].qa.id}/{first_t.name}",
                                             _Group(f"{drafts[first_i].qa.id}/{first_t.name}", first_t.signature))
        for i, t in fresh:
            grouped.add((i, t.name))
            join(target, i, t)
    for i, t in new:  # alone for now: a later window's equivalent tool may join it
        if (i, t.name) not in grouped:
            join(index.groups.setdefault(f"{drafts[i].qa.id}/{t.name}", _Group(f"{drafts[i].qa.id}/{t.name}", t.signature)),
                 i, t)
    # order the touched subsets as the groups and their subsets stand
    rank = {key: k for k, key in enumerate(index.groups)}
    order = {id(s): (rank[g.key], g.subsets.index(s)) for g, s, _ in touched}
    touched.sort(key=lambda e: order[id(e[1])])

    sem = asyncio.Semaphore(concurrency)
    plans = []
    for _, subset, fresh in touched:
        if len(subset) < 2:
            continue
        try:
            merged_tool = _merged_tool(subset)
        except BuildError as err:
            plans.append((subset, None, [], [str(err)]))
            continue
        candidates = []
        for i, m in fresh:
            own = _served(merged_tool, m.tool)
            new_tools = [own if x.name == m.tool.name else x for x in current[i].tools]
            if len({x.name for x in new_tools}) != len(new_tools):
                candidates = []
                break
            candidates.append((i, m, own))
        plans.append((subset, merged_tool, candidates, [] if candidates else ["merged tool name clashes in an environment"]))

    async def verify(plan: Any) -> list[str]:
        subset, merged_tool, candidates, reasons = plan
        if merged_tool is None or not candidates:
            return reasons
        async with sem:
            return await check_merged(pool, merged_tool, [(m.qa_id, _served(merged_tool, m.tool)) for m in subset])

    verdicts = await asyncio.gather(*(verify(p) for p in plans))
    merges: list[EnvMerge] = []
    new_groups = 0
    for (subset, merged_tool, candidates, _), failures in zip(plans, verdicts, strict=True):
        ok = merged_tool is not None and bool(candidates) and not failures
        members = [m.owner for m in subset]
        rows = len(merged_tool.data) if merged_tool is not None and hasattr(merged_tool.data, "__len__") else 0
        merges.append(EnvMerge(signature=subset[0].tool.signature, merged_tool=subset[0].tool.name, members=members,
                               method=grouper.method, merged=ok, rows=rows,  # type: ignore[arg-type]
                               reasons=[] if ok else failures[:5], parents=[m.qa_id or m.env_id for m in members],
                               run_id=run_id))
        if ok:  # swap in the merged tool (other merges may already have changed other tools of the draft)
            new_groups += len(subset) - len(candidates) < 2
            for i, m, own in candidates:
                index.served[m.key] = len(subset)
                d = current[i]
                current[i] = EnvDraft(d.qa, [own if x.name == m.tool.name else x for x in d.tools], d.attempt)
    rows_out = []
    for i, t in new:
        key = f"{drafts[i].qa.id}/{t.name}"
        group, subset = index.where[key]
        m = next(x for x in subset if x.key == key)
        rows_out.append(MergeCandidate(
            qa_id=m.qa_id, env_id=m.owner.env_id, group=group.key, subset=subset[0].key, position=m.position,
            served_by=index.served.get(key, 0), signature=t.signature, doc=t.doc, source=t.source, data=t.data,
            calls=list(t.calls), probes=[MergeProbe(arguments=p.arguments, answer=p.answer) for p in t.probes],
            origin=t.origin, written_by=t.written_by, parents=[m.qa_id], run_id=run_id))
    return MergeResult(current, merges, rows_out, new_groups)
