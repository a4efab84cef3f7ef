"""Sub-environment merging: equivalent tools merged with their data unioned; unsafe merges refused and kept apart."""

from __future__ import annotations

import asyncio

import pytest

from arenaforge.environments.runtime import create_pool
from arenaforge.tracks.envs.build_tools import ToolBuilder
from arenaforge.tracks.envs.decompose_qa import QASpec, QASynthesizer
from arenaforge.tracks.envs.knowledge import load_sample
from arenaforge.tracks.envs.merge_envs import ToolGrouper, merge_environments
from arenaforge.tracks.envs.synthesize_env import synthesize_environments
from arenaforge.tracks.envs.tool_data import Probe
from tests.support.envs_fakes import EnvsResponder, model_cfg, sandbox_cfg
from tests.support.models import http_model as chat_model
from tests.support.models import offline_model


@pytest.fixture(scope="module")
def sample():
    src = load_sample()
    yield src
    src.close()


async def _drafts_and_merge(sample, instances, grouper=None, mutate=None):
    pool = await create_pool(sandbox_cfg())
    try:
        built = await synthesize_environments(ToolBuilder(offline_model(), sample), pool, instances, max_attempts=1)
        drafts = mutate(built.drafts) if mutate else built.drafts
        return drafts, await merge_environments(grouper or ToolGrouper(offline_model()), pool, drafts, run_id="r")
    finally:
        await pool.shutdown()


def test_equivalent_tools_merge_and_every_qa_still_verifies(sample) -> None:
    spec = QASpec(n=12, structures=("single_hop", "multi_hop"), max_hops=2, seed=4)
    instances = asyncio.run(QASynthesizer(offline_model()).synthesize(sample, spec)).instances
    drafts, result = asyncio.run(_drafts_and_merge(sample, instances))
    merged = [m for m in result.merges if m.merged]
    assert merged, [m.reasons for m in result.merges]
    for m in merged:
        assert len(m.members) >= 2 and m.signature.startswith(("lookup:", "count:", "sum:"))
        owners = [d for d in result.drafts if d.qa.id in {x.qa_id for x in m.members}]
        tools = [next(t for t in d.tools if t.name == m.merged_tool) for d in owners]
        keys = [set(t.data) if isinstance(t.data, dict) else len(t.data) for t in tools]
        assert all(k == keys[0] for k in keys)  # one tool, one data set: the union
        assert m.rows >= max(len(t.data) for d in drafts for t in d.tools if t.signature == m.signature)
    assert len(result.drafts) == len(drafts)


def test_unsafe_merge_is_refused_and_tools_kept(sample, monkeypatch) -> None:
    # data that cannot be cleaned of foreign answers (as model-written data may be) must fail re-verification
    import arenaforge.tracks.envs.merge_envs

    monkeypatch.setattr(arenaforge.tracks.envs.merge_envs, "_without_foreign_answers", lambda data, members: data)
    spec = QASpec(n=12, structures=("single_hop",), seed=4)
    instances = asyncio.run(QASynthesizer(offline_model()).synthesize(sample, spec)).instances

    def poison(drafts):
        # make one member's mock data answer another member's question: the merged tool would leak
        from dataclasses import replace

        by_sig = {}
        for d in drafts:
            for t in d.tools:
                by_sig.setdefault(t.signature, []).append((d, t))
        sig, pair = next((s, p) for s, p in by_sig.items() if len(p) >= 2 and isinstance(p[0][1].data, dict))
        (d0, t0), (d1, t1) = pair[:2]
        attr = sig.split(".")[1].split(":")[0]
        poisoned_key = "ZZ-POISON"
        data = dict(t1.data)
        data[poisoned_key] = {**next(iter(t1.data.values())), attr: t0.calls[0].answer}
        t1p = replace(t1, data=data, probes=t1.probes + [Probe({next(iter(t1.calls[0].arguments)): poisoned_key})])
        return [d if d is not d1 else type(d)(d.qa, [t1p if t is t1 else t for t in d.tools], d.attempt) for d in drafts]

    # the offline grouper groups by signature: no collision pre-check can see the poisoned row's meaning
    drafts, result = asyncio.run(_drafts_and_merge(sample, instances, ToolGrouper(offline_model()), poison))
    refused = [m for m in result.merges if not m.merged]
    assert refused and any("answer_leak" in r for m in refused for r in m.reasons)
    for m in refused:  # members keep their own tools, untouched
        for member in m.members:
            before = next(d for d in drafts if d.qa.id == member.qa_id)
            after = next(d for d in result.drafts if d.qa.id == member.qa_id)
            assert [t.data for t in before.tools] == [t.data for t in after.tools]


def test_model_grouper_over_http(sample, scripted_openai) -> None:
    spec = QASpec(n=10, structures=("single_hop",), seed=4)
    instances = asyncio.run(QASynthesizer(offline_model()).synthesize(sample, spec)).instances
    scripted_openai.responder = EnvsResponder()
    with chat_model(model_cfg(scripted_openai.url)) as model:
        drafts, result = asyncio.run(_drafts_and_merge(sample, instances, ToolGrouper(model)))
    assert result.merges and all(m.method == "model" for m in result.merges)
    assert "Group functionally equivalent tools" in scripted_openai.chat_requests()[0]["messages"][0]["content"]


def test_windows_against_one_index_make_the_batch_merges_groups(sample) -> None:
    from arenaforge.tracks.envs.merge_envs import MergeIndex

    spec = QASpec(n=24, structures=("single_hop", "multi_hop"), max_hops=2, seed=0)
    instances = asyncio.run(QASynthesizer(offline_model()).synthesize(sample, spec)).instances

    async def go():
        pool = await create_pool(sandbox_cfg())
        try:
            drafts = (await synthesize_environments(ToolBuilder(offline_model(), sample), pool, instances, 1)).drafts
            batch = await merge_environments(ToolGrouper(offline_model()), pool, drafts, run_id="r")
            index, windows = MergeIndex(), []
            for k in range(0, len(drafts), 4):
                windows.append(await merge_environments(ToolGrouper(offline_model()), pool, drafts[k:k + 4], "r",
                                                        index=index))
            return batch, windows
        finally:
            await pool.shutdown()

    batch, windows = asyncio.run(go())

    from tests.tasks.envs.test_merge_across import _final as groups

    window_merges = [m for w in windows for m in w.merges]
    assert groups(window_merges) == groups(batch.merges) and len(groups(batch.merges)) >= 2
    assert sum(w.new_groups for w in windows) == batch.new_groups == sum(m.merged for m in batch.merges)
    assert any(len(m.members) > 2 for m in window_merges if m.merged), "groups grew across windows"
    # each group's final row is the batch's row (members, merged tool, rows); a member that joined last has the
    # batch's draft, the earlier ones keep the merged tool of their window
    finals = {(r.merged_tool, frozenset(m.qa_id for m in r.members)): r for r in window_merges if r.merged}
    for row in batch.merges:
        if row.merged:
            same = finals[(row.merged_tool, frozenset(m.qa_id for m in row.members))]
            assert (same.members, same.merged_tool, same.rows) == (row.members, row.merged_tool, row.rows)
    batch_drafts = {d.qa.id: d for d in batch.drafts}
    for w in windows:
        for d in w.drafts:
            for row in batch.merges:
                if row.merged and row.members[-1].qa_id == d.qa.id:
                    tool = [t for t in d.tools if t.name == row.merged_tool]
                    assert tool and tool == [t for t in batch_drafts[d.qa.id].tools if t.name == row.merged_tool]
    assert len({c.id for w in windows for c in w.candidates}) == sum(len(d.tools) for d in batch.drafts)
