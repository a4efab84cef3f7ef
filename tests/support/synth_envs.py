"""Environments as the offline pipeline synthesizes them from the bundled sample source (QA, tools verified in the
sandbox, distractors), for tests that run many of them through another harness."""

from __future__ import annotations

import asyncio

from arenaforge.environments.runtime import create_pool
from arenaforge.schemas.models import Environment
from arenaforge.services.embeddings import embed
from arenaforge.tracks.envs.build_tools import ToolBuilder
from arenaforge.tracks.envs.decompose_qa import QASpec, QASynthesizer
from arenaforge.tracks.envs.distractors import choose_distractors
from arenaforge.tracks.envs.knowledge import load_sample
from arenaforge.tracks.envs.pipeline import EnvsSpec
from arenaforge.tracks.envs.synthesize_env import synthesize_environments
from arenaforge.tracks.envs.tool_impl import assemble
from tests.support.envs_fakes import sandbox_cfg
from tests.support.models import offline_model


def synthesize(n: int, seed: int = 9) -> list[Environment]:
    """Up to `n` environments (one per QA that got verified tools), in synthesis order."""
    src = load_sample()
    instances = asyncio.run(QASynthesizer(offline_model()).synthesize(src, QASpec(n=n, seed=seed))).instances

    async def go():
        pool = await create_pool(sandbox_cfg())
        try:
            return (await synthesize_environments(ToolBuilder(offline_model(), src), pool, instances, max_attempts=1)).drafts
        finally:
            await pool.shutdown()

    drafts = asyncio.run(go())
    src.close()
    chosen = choose_distractors(drafts, EnvsSpec().mix(), embed)
    return [assemble(d.qa, d.tools, c.tools, [t.name for t in c.tools], None) for d, c in zip(drafts, chosen, strict=True)]


def spread(envs: list[Environment], k: int) -> list[Environment]:
    """`k` of `envs`, evenly spaced from the fewest gold calls to the most: the interop tests run each through
    another harness's own processes (seconds apiece), and a spread covers the shapes a full list would."""
    ranked = sorted(envs, key=lambda env: (len(env.calls), env.id))
    if len(ranked) <= k:
        return ranked
    return [ranked[round(i * (len(ranked) - 1) / (k - 1))] for i in range(k)]
