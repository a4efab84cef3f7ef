"""Environments as the offline pipeline synthesizes them from the bundled sample source (QA, tools verified in the
sandbox, distractors), for tests that run many of them through another harness."""

from __future__ import annotations

import asyncio

from arenaforge.environments.runtime import create_pool
from arenaforge.schemas.models import Environment
from arenaforge.tasks.embeddings import embed
from arenaforge.tasks.envs.build_tools import ToolBuilder
from arenaforge.tasks.envs.decompose_qa import QASpec, QASynthesizer
from arenaforge.tasks.envs.distractors import DistractorMix, choose_distractors
from arenaforge.tasks.envs.knowledge import load_sample
from arenaforge.tasks.envs.synthesize_env import synthesize_environments
from arenaforge.tasks.envs.tool_impl import assemble
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
    chosen = choose_distractors(drafts, DistractorMix(), embed)
    return [assemble(d.qa, d.tools, c.tools, [t.name for t in c.tools], None) for d, c in zip(drafts, chosen, strict=True)]
