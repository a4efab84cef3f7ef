"""Distractor tools: three similarity bands from tool-doc embeddings, configurable mix, callable in the sandbox."""

from __future__ import annotations

import asyncio

import pytest

from arenaforge.environments.runtime import create_pool, run_calls
from arenaforge.services.embeddings import embed
from arenaforge.tracks.envs.build_tools import ToolBuilder
from arenaforge.tracks.envs.check_env import random_arguments
from arenaforge.tracks.envs.decompose_qa import QASpec, QASynthesizer
from arenaforge.tracks.envs.distractors import DistractorMix, choose_distractors, tool_text
from arenaforge.tracks.envs.knowledge import load_sample
from arenaforge.tracks.envs.pipeline import EnvsSpec
from arenaforge.tracks.envs.synthesize_env import synthesize_environments
from arenaforge.tracks.envs.tool_impl import assemble
from tests.support.envs_fakes import sandbox_cfg
from tests.support.models import offline_model


@pytest.fixture(scope="module")
def drafts():
    src = load_sample()
    instances = asyncio.run(QASynthesizer(offline_model()).synthesize(src, QASpec(n=16, seed=8))).instances

    async def go():
        pool = await create_pool(sandbox_cfg())
        try:
            return (await synthesize_environments(ToolBuilder(offline_model(), src), pool, instances, max_attempts=1)).drafts
        finally:
            await pool.shutdown()

    out = asyncio.run(go())
    src.close()
    return out


def test_bands_mix_and_irrelevance(drafts) -> None:
    chosen = choose_distractors(drafts, DistractorMix(high=2, medium=1, low=1), embed, seed=1)
    assert len(chosen) == len(drafts)
    for draft, pick in zip(drafts, chosen, strict=True):
        bands = [p.band for p in pick.picks]
        assert bands.count("high") <= 2 and bands.count("medium") <= 1 and bands.count("low") <= 1
        own = {t.name for t in draft.tools} | {t.signature for t in draft.tools}
        assert not any(t.name in own or t.signature in own for t in pick.tools)
        assert all(not t.calls for t in pick.tools)  # distractors answer nothing here
        sims = {p.band: p.similarity for p in pick.picks}
        if "high" in sims and "low" in sims:
            assert sims["high"] >= sims["low"]
    assert sum(len(c.picks) for c in chosen) >= len(drafts) * 3
    none = choose_distractors(drafts, DistractorMix(0, 0, 0), embed)
    assert all(not c.picks for c in none)


def test_distractors_are_callable(drafts) -> None:
    chosen = choose_distractors(drafts[:6], EnvsSpec().mix(), embed, seed=2)
    draft, pick = drafts[0], chosen[0]
    env = assemble(draft.qa, draft.tools, pick.tools, [t.name for t in pick.tools], None)
    assert set(env.distractors) == {t.name for t in pick.tools} and env.distractors
    import random

    rng = random.Random(0)
    calls = [(t.name, random_arguments(t.doc, t.data, rng)) for t in pick.tools]

    async def go():
        pool = await create_pool(sandbox_cfg())
        try:
            return await run_calls(pool, env, calls)
        finally:
            await pool.shutdown()

    obs = asyncio.run(go())
    assert all(o.outcome == "ok" and o.output for o in obs)


@pytest.mark.slow
def test_minilm_embeddings_rank_related_tools_higher(drafts) -> None:
    """Distractor selection on the real all-MiniLM-L6-v2 embeddings (offline wheel, 384-d, normalised)."""
    from arenaforge.services.embeddings import embed

    docs = {t.name: t.doc for d in drafts for t in d.tools}
    chosen = choose_distractors(drafts[:8], EnvsSpec().mix(), embed, seed=0)
    assert any(c.picks for c in chosen)
    vecs = embed([tool_text(d) for d in docs.values()])
    assert vecs.shape[1] == 384
    assert abs(float((vecs[0] ** 2).sum()) - 1.0) < 1e-4
