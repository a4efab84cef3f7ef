"""The streaming envs pipeline (`EnvsSpec.pipeline = "stream"`): each QA moves on as soon as it is ready.

    per QA, the moment it is ready:   decomposed -> judged + structural checks -> (kept) tools built
                                      -> sandbox-verified, regenerated on failure
    per batch_size chunk, at the end: merging -> distractors -> self-test

Everything runs on the run's one event loop and goes through its one model limiter, so the endpoint
always has the next QA's request waiting instead of idling at a stage's tail. The tool stage is bounded
by a semaphore (as the batch pipeline's); records go to the warehouse through a `RecordWriter` every
second, so a killed run loses at most the last second's records and a re-run (content ids) completes it.

Same results as the batch pipeline (`synthesize_qas` then `build_environments` per chunk of
`batch_size`): the same per-QA functions, and the end stages see the same drafts in the same order
(kept QAs in synthesis order, chunked, each chunk ordered by id and grouped by source). The percentile
keep rule needs the whole batch's scores before anything is kept, so `EnvsSpec` refuses it with stream.
Merging and distractors still wait for the end of the run: incremental merging is not built yet.
"""

from __future__ import annotations

import asyncio
from typing import Any

from arenaforge.schemas.models import QAInstance, Rejection
from arenaforge.tasks.envs.build_tools import ToolBuilder
from arenaforge.tasks.envs.decompose_qa import QABatch, QASynthesizer
from arenaforge.tasks.envs.distractors import Embedder
from arenaforge.tasks.envs.knowledge import KnowledgeSource
from arenaforge.tasks.envs.pipeline import (Clock, EnvsSpec, build_environments, chunks, finish_environments, stamp,
                                            synthesize_qas)
from arenaforge.tasks.envs.stream_writer import RecordWriter
from arenaforge.tasks.envs.synthesize_env import synthesize_one
from arenaforge.tasks.envs.tool_impl import EnvDraft
from arenaforge.tasks.envs.verify_qa import QAJudge, judge_one, verify_batch
from arenaforge.tasks.run_scope import RunScope

TOOL_CONCURRENCY = 256  # QAs whose tools are being built or verified at once (the batch pipeline's bound)


async def run_envs(run: RunScope, spec: EnvsSpec, sources: dict[str, KnowledgeSource] | None = None,
                   embed: Embedder | None = None, timings: dict[str, float] | None = None) -> dict[str, int]:
    """The whole envs track for `spec`, by its `pipeline` setting; the counts of both stages."""
    if spec.pipeline == "stream":
        return await stream_envs(run, spec, sources, embed, timings)
    ids, counts = await synthesize_qas(run, spec, sources)
    for batch in chunks(ids, spec.batch_size):
        for key, value in (await build_environments(run, spec, batch, sources, embed, timings)).items():
            counts[key] = counts.get(key, 0) + value
    return counts


async def stream_envs(run: RunScope, spec: EnvsSpec, sources: dict[str, KnowledgeSource] | None = None,
                      embed: Embedder | None = None, timings: dict[str, float] | None = None) -> dict[str, int]:
    """QAs through verification and sandbox-verified tools one by one, then the end stages per chunk."""
    clock = Clock(timings if timings is not None else {})
    seed = run.cfg.seed if spec.seed is None else spec.seed
    sources = run.knowledge(spec.sources, spec.shared_data) if sources is None else sources
    pool_started = asyncio.ensure_future(run.sandbox())
    async with RecordWriter(run.wh) as writer:
        flow = _Stream(run, spec, sources, seed, writer, pool_started)
        batches = await asyncio.gather(*(flow.source(source) for source in sources.values()))
        outcomes = await asyncio.gather(*flow.tools.values())
        clock.lap("tools_verified_s")
        kept = [qa for batch in batches for qa in batch.instances if qa.id in flow.tools]
        drafts = {qa.id: got for qa, got in zip(flow.tools_for, outcomes, strict=True) if isinstance(got, EnvDraft)}
        writer.add(stamp([r for r in outcomes if isinstance(r, Rejection)], run.run_id))
        counts = {"qa_instances": sum(len(b.instances) for b in batches), "qa_kept": len(kept),
                  "qa_rejected": sum(len(b.instances) for b in batches) - len(kept), "rejections": flow.qa_rejections}
        pool = await pool_started
        for start in range(0, len(kept), spec.batch_size):
            ordered = _batch_order(kept[start:start + spec.batch_size])
            result = await finish_environments(run, spec, pool, [drafts[i] for i in ordered if i in drafts], [],
                                               seed, embed, clock)
            for key, value in result.items():
                counts[key] = counts.get(key, 0) + value
        counts["env_rejections"] = counts.get("env_rejections", 0) + sum(isinstance(r, Rejection) for r in outcomes)
    return counts


def _batch_order(chunk: list[QAInstance]) -> list[str]:
    """A chunk's QA ids as the batch pipeline meets them: by id (its warehouse read), grouped by source."""
    by_source: dict[str, list[str]] = {}
    for qa in sorted(chunk, key=lambda q: q.id):
        by_source.setdefault(qa.source, []).append(qa.id)
    return [i for ids in by_source.values() for i in ids]


class _Stream:
    """One streaming run's per-QA steps and what they have started."""

    def __init__(self, run: RunScope, spec: EnvsSpec, sources: dict[str, KnowledgeSource], seed: int,
                 writer: RecordWriter, pool_started: asyncio.Future[Any]) -> None:
        self.run, self.spec, self.seed, self.writer, self.pool_started = run, spec, seed, writer, pool_started
        self.synth = QASynthesizer(run.model)
        self.judge = QAJudge(run.model)
        self.builders = {name: ToolBuilder(run.model, source, seed) for name, source in sources.items()}
        self.no_source = ToolBuilder(run.model, None, seed)
        self.judged: dict[str, asyncio.Future[None]] = {}
        self.tools: dict[str, asyncio.Future[EnvDraft | Rejection]] = {}
        self.tools_for: list[QAInstance] = []
        self.tool_slots = asyncio.Semaphore(TOOL_CONCURRENCY)
        self.qa_rejections = 0

    async def source(self, source: KnowledgeSource) -> QABatch:
        self.reject(source.rejections)
        batch = await self.synth.synthesize(source, self.spec.qa_spec(self.seed), self.on_instance)
        self.reject(batch.rejections)
        await asyncio.gather(*(self.judged[qa.id] for qa in batch.instances))
        return batch

    def reject(self, rejections: list[Rejection]) -> None:
        self.qa_rejections += len(rejections)
        self.writer.add(stamp(rejections, self.run.run_id))

    def on_instance(self, qa: QAInstance) -> None:
        if qa.id not in self.judged:  # a duplicate instance (same content id) is judged once
            self.judged[qa.id] = asyncio.ensure_future(self.verify(qa))

    async def verify(self, qa: QAInstance) -> None:
        self.writer.add(stamp([qa], self.run.run_id))
        judged = asyncio.ensure_future(judge_one(self.judge, qa, self.run.run_id))
        verdict = await verify_batch(self.judge, [qa], self.spec.keep(), self.spec.min_hops, self.spec.max_hops,
                                     self.run.run_id, {qa.id: judged})
        self.writer.add(verdict.verifications)
        self.reject(verdict.rejections)
        for kept in verdict.kept:
            self.tools_for.append(kept)
            self.tools[kept.id] = asyncio.ensure_future(self.build(kept))

    async def build(self, qa: QAInstance) -> EnvDraft | Rejection:
        pool = await self.pool_started
        async with self.tool_slots:
            return await synthesize_one(self.builders.get(qa.source, self.no_source), pool, qa, self.spec.max_attempts, self.run.run_id)
