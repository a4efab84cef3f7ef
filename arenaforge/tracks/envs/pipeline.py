"""The RL environment track's stages (flow `envs`), as plain functions over the warehouse.

    synthesize_qas      sources -> QA instances -> verification      writes qa_instances, qa_verifications,
                                                                     rejections; returns kept QA ids
    build_environments  kept QA ids -> tools verified in the sandbox  writes environments, env_merges,
                        -> merging -> distractors -> self-test       distractor_sets, rejections
      = build_tools (the tools part: drafts and rejections, nothing written) then finish_environments

Stages pass references (QA ids), never datasets, and write once per batch at their end, so a
killed run loses at most the batch in flight and a re-run (content ids) completes it.
`arenaforge/flows/envs_flows.py` wraps these in Prefect tasks; `arenaforge/benchmarks/envs.py` calls them
directly. Every stage is a coroutine over the run's `RunScope` (its model and sandbox pool).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Any, Literal

from pydantic import BaseModel, Field, model_validator

from arenaforge.schemas.kinds_envs import DistractorSet
from arenaforge.schemas.models import Environment, QAInstance, Rejection, Verification
from arenaforge.services.run_scope import RunScope
from arenaforge.tracks.envs.build_tools import ToolBuilder
from arenaforge.tracks.envs.check_env import self_test
from arenaforge.tracks.envs.decompose_qa import STRUCTURES, QASpec, QASynthesizer
from arenaforge.tracks.envs.distractors import DistractorMix, Embedder, Pool, choose_distractors
from arenaforge.tracks.envs.knowledge import KnowledgeSource, run_sources
from arenaforge.tracks.envs.merge_envs import MergeIndex, ToolGrouper, merge_environments
from arenaforge.tracks.envs.stepwise_qa import StepwiseQASynthesizer
from arenaforge.tracks.envs.synthesize_env import SynthResult, synthesize_environments
from arenaforge.tracks.envs.tool_impl import EnvDraft, ToolImpl, assemble
from arenaforge.tracks.envs.verify_qa import KeepRule, QAJudge, judge_one, verify_batch
from arenaforge.warehouse import lookups


class EnvsSpec(BaseModel):
    """Parameters of the `envs` flow (also its typed form in the Prefect UI)."""

    sources: list[str] = Field(default_factory=lambda: ["sample"],
                               description="Knowledge sources: sample, tau2_retail, astra, or paths to table files/dirs.")
    n: int = Field(default=24, ge=1, le=100_000, description="QA instances to synthesize per source.")
    min_hops: int = Field(default=1, ge=1, le=8, description="Hop budget: minimum longest dependency chain.")
    max_hops: int = Field(default=3, ge=1, le=8, description="Hop budget: maximum longest dependency chain.")
    structures: list[Literal["single_hop", "parallel_single_hop", "multi_hop", "parallel_multi_hop"]] = Field(
        default_factory=lambda: list(STRUCTURES), description="QA structures to synthesize: single_hop, "
                                                              "parallel_single_hop, multi_hop, parallel_multi_hop.")
    mode: Literal["unconditioned", "conditioned"] = Field(
        default="unconditioned", description="unconditioned or conditioned (on seed questions).")
    seed_questions: list[str] = Field(default_factory=list, description="Seeds for conditioned mode (default: the source's).")
    keep_rule: Literal["threshold", "percentile"] = Field(default="threshold",
                                                         description="QA keep rule: threshold or percentile.")
    qs_threshold: float = Field(default=0.75, ge=0, le=1, description="Keep QS >= this (threshold rule).")
    qs_percentile: float = Field(default=85.0, ge=0, le=100,
                                 description="Keep QS >= this percentile of the batch (percentile rule).")
    max_attempts: int = Field(default=2, ge=0, le=10, description="Regenerations of a failing tool.")
    distractors_high: int = Field(default=1, ge=0, le=20, description="Distractor tools per environment, "
                                                                       "highly similar to its tools.")
    distractors_medium: int = Field(default=1, ge=0, le=20, description="Distractors of medium similarity.")
    distractors_low: int = Field(default=1, ge=0, le=20, description="Distractors of low similarity.")
    merge: bool = Field(default=True, description="Merge functionally equivalent tools.")
    merge_across: bool = Field(
        default=False, description="Merge each batch against the tools of the run's earlier batches and of earlier "
                                   "runs in the warehouse, in synthesis order (False: within each batch only, as "
                                   "before; batches read back in id order).")
    distractor_pool_max: int = Field(
        default=4096, ge=0, description="With merge_across: at most this many of earlier runs' tools, the most recent, "
                                        "join the distractor pool (each is embedded once per run; 0: none).")
    batch_size: int = Field(default=400, ge=1, description="QA instances per environment-building batch.")
    pipeline: Literal["batch", "stream"] = Field(
        default="batch", description="batch: each stage over all QAs in turn; stream: each QA moves on when ready.")
    shared_data: str | None = Field(default=None, description="Path of ../shared/data (tau2_retail, astra sources).")
    seed: int | None = Field(default=None, description="Generator seed (default: config seed).")
    decomposition: Literal["whole", "stepwise"] = Field(
        default="whole", description="whole: one request writes a QA's whole decomposition; stepwise: the program "
                                     "plans the facts and a model writes each sub-QA and the main question in short "
                                     "requests (for small models).")
    tool_code: Literal["model", "evidence"] = Field(
        default="model", description="model: a model writes each tool's code; evidence: the model writes the tool's "
                                     "document and the program assembles its code from the typed evidence.")

    @model_validator(mode="after")
    def _stream_keeps_by_threshold(self) -> EnvsSpec:
        if self.pipeline == "stream" and self.keep_rule != "threshold":
            raise ValueError("pipeline stream keeps QAs by threshold only (percentile needs the whole batch's scores)")
        return self

    def qa_spec(self, seed: int) -> QASpec:
        return QASpec(n=self.n, min_hops=self.min_hops, max_hops=self.max_hops, structures=tuple(self.structures),
                      mode=self.mode, seed_questions=tuple(self.seed_questions), seed=seed)

    def keep(self) -> KeepRule:
        return KeepRule(self.keep_rule, self.qs_threshold, self.qs_percentile)

    def mix(self) -> DistractorMix:
        return DistractorMix(self.distractors_high, self.distractors_medium, self.distractors_low)


def stamp(records: list[Any], run_id: str | None) -> list[Any]:
    return [r if r.run_id == run_id else r.model_copy(update={"run_id": run_id}) for r in records]


async def synthesize_qas(run: RunScope, spec: EnvsSpec, sources: dict[str, KnowledgeSource] | None = None
                         ) -> tuple[list[str], dict[str, int]]:
    """Synthesize and verify QA instances from every source; (kept QA ids, counts)."""
    seed = run_seed(run, spec)
    sources = run_sources(run, spec.sources, spec.shared_data) if sources is None else sources
    instances: list[QAInstance] = []
    rejections: list[Rejection] = []
    synth = qa_synthesizer(run, spec)
    judge = QAJudge(run.model)
    started: dict[str, Any] = {}

    def judge_soon(qa: QAInstance) -> None:  # verification starts while other instances are synthesized
        if qa.id not in started:
            started[qa.id] = asyncio.ensure_future(judge_one(judge, qa, run.run_id))

    for source in sources.values():
        rejections.extend(source.rejections)
        batch = await synth.synthesize(source, spec.qa_spec(seed), judge_soon)
        instances.extend(batch.instances)
        rejections.extend(batch.rejections)
    verdict = await verify_batch(judge, instances, spec.keep(), spec.min_hops, spec.max_hops, run.run_id, started)
    rejections.extend(verdict.rejections)
    records = stamp(instances, run.run_id) + verdict.verifications + stamp(rejections, run.run_id)
    await asyncio.to_thread(run.wh.upsert, records)
    counts = {"qa_instances": len(instances), "qa_kept": len(verdict.kept),
              "qa_rejected": len(instances) - len(verdict.kept), "rejections": len(rejections)}
    return [qa.id for qa in verdict.kept], counts


async def build_environments(run: RunScope, spec: EnvsSpec, qa_ids: list[str],
                             sources: dict[str, KnowledgeSource] | None = None, embed: Embedder | None = None,
                             timings: dict[str, float] | None = None) -> dict[str, int]:
    """Tools, sandbox verification, merging, distractors and self-test for one batch of QA ids."""
    if not qa_ids:
        return {"environments": 0}
    timings = timings if timings is not None else {}
    return await finish_batch(run, spec, await build_tools(run, spec, qa_ids, sources, timings), embed, timings)


async def build_tools(run: RunScope, spec: EnvsSpec, qa_ids: list[str],
                      sources: dict[str, KnowledgeSource] | None = None,
                      timings: dict[str, float] | None = None) -> SynthResult:
    """One batch's tools built and verified in the sandbox: its drafts (in synthesis order with
    `spec.merge_across`) and rejections, nothing written; `finish_environments` takes them on."""
    instances = await asyncio.to_thread(lookups.by_ids, run.wh, QAInstance, qa_ids)
    if spec.merge_across:  # in synthesis order: batches in a row merge as one batch
        order = {qa_id: k for k, qa_id in enumerate(qa_ids)}
        instances.sort(key=lambda qa: order[qa.id])
    sources = run_sources(run, spec.sources, spec.shared_data) if sources is None else sources
    clock = Clock(timings if timings is not None else {})
    pool = await run.sandbox()
    clock.lap("pool_start_s")
    built = SynthResult([], [])
    by_source: dict[str, list[QAInstance]] = {}
    for qa in instances:
        by_source.setdefault(qa.source, []).append(qa)
    for name, qas in by_source.items():
        builder = ToolBuilder(run.model, sources.get(name), run_seed(run, spec), spec.tool_code)
        result = await synthesize_environments(builder, pool, qas, spec.max_attempts, run.run_id)
        built.drafts += result.drafts
        built.rejections += result.rejections
    clock.lap("tools_verified_s")
    return built


async def finish_batch(run: RunScope, spec: EnvsSpec, built: SynthResult, embed: Embedder | None = None,
                       timings: dict[str, float] | None = None) -> dict[str, int]:
    """`finish_environments` over one batch's `build_tools` result, with the run's sandbox pool and seed."""
    return await finish_environments(run, spec, await run.sandbox(), built.drafts, built.rejections,
                                     run_seed(run, spec), embed, Clock(timings if timings is not None else {}))


def qa_synthesizer(run: RunScope, spec: EnvsSpec) -> QASynthesizer:
    """The run's QA writer: one request per decomposition, or short steps (`spec.decomposition`)."""
    return StepwiseQASynthesizer(run.model) if spec.decomposition == "stepwise" else QASynthesizer(run.model)


def run_seed(run: RunScope, spec: EnvsSpec) -> int:
    return run.cfg.seed if spec.seed is None else spec.seed


def merge_index(run: RunScope) -> MergeIndex:
    """The run's merge groups, shared by its batches (windows), looking earlier runs' tools up in the warehouse."""
    if run.merge_index is None:
        async def load(signatures: list[str]) -> list[Any]:
            return await asyncio.to_thread(lookups.merge_candidates, run.wh, signatures)

        run.merge_index = MergeIndex(load)
    return run.merge_index


async def distractor_pool(run: RunScope, limit: int) -> Pool:
    """The run's distractor pool: on first use, the `limit` most recent tools earlier runs wrote as merge
    candidates (a warehouse of many runs is not loaded and embedded whole)."""
    if run.distractor_pool is None:
        rows = await asyncio.to_thread(lookups.earlier_runs_candidates, run.wh, run.run_id, limit)
        run.distractor_pool = Pool([(ToolImpl(r.doc, r.source, r.data, r.signature, [], [], r.origin, r.written_by), r.qa_id)
                                    for r in rows])
    return run.distractor_pool


async def finish_environments(run: RunScope, spec: EnvsSpec, pool: Any, drafts: list[EnvDraft],
                              rejections: list[Rejection], seed: int, embed: Embedder | None,
                              clock: Clock, merge_turn: contextlib.AbstractAsyncContextManager[Any] | None = None,
                              write_turn: contextlib.AbstractAsyncContextManager[Any] | None = None
                              ) -> dict[str, int]:
    """Merging, distractors and self-test over one batch's verified drafts; writes its records and `rejections`.

    With `spec.merge_across`, the batch merges against the run's merge index, inside `merge_turn`, and writes
    inside `write_turn` (the streaming pipeline's: its windows merge one at a time and write one at a time, in
    order)."""
    merges: list[Any] = []
    candidates: list[Any] = []
    new_groups = 0
    async with merge_turn or contextlib.nullcontext():
        clock.lap("merge_wait_s")  # for the turn of the windows before (stream)
        if spec.merge and (len(drafts) > 1 or (spec.merge_across and drafts)):
            index = merge_index(run) if spec.merge_across else None
            merged = await merge_environments(ToolGrouper(run.model), pool, drafts, run.run_id, index=index)
            drafts, merges, new_groups = merged.drafts, merged.merges, merged.new_groups
            candidates = merged.candidates if spec.merge_across else []  # what later batches and runs merge against
        # in the turn, so each window draws from the windows before it, whatever order they finish in
        earlier = (await distractor_pool(run, spec.distractor_pool_max)).window(drafts) if spec.merge_across else None
    clock.lap("merge_s")
    chosen = await asyncio.to_thread(choose_distractors, drafts, spec.mix(), embed, seed, earlier)
    clock.lap("distractors_s")
    finals: list[tuple[EnvDraft, Environment, list[Any]]] = []
    for draft, pick in zip(drafts, chosen, strict=True):
        env = assemble(draft.qa, draft.tools, pick.tools, [t.name for t in pick.tools], None)
        finals.append((draft, env, pick.picks))
    sem = asyncio.Semaphore(64)

    async def test(env: Environment) -> tuple[dict[str, bool], list[str]]:
        async with sem:
            return await self_test(pool, env, seed)

    tested = await asyncio.gather(*(test(env) for _, env, _ in finals))
    clock.lap("self_test_s")
    envs: list[Environment] = []
    dsets: list[DistractorSet] = []
    for (draft, env, picks), (checks, details) in zip(finals, tested, strict=True):
        # the sandbox checks every kept draft passed; how many attempts it took is not part of the environment
        base = {"imports": True, "gold_calls": True, "other_records": True, "no_answer_leak": True, "no_timeout": True}
        all_checks = {**base, **checks}
        ver = Verification(passed=all(all_checks.values()), checks=all_checks, details=details)
        if not ver.passed:
            infra = any(d.startswith("sandbox_failure") for d in details)
            rejections.append(Rejection(stage="self_test", subject=draft.qa.id,
                                        reason="sandbox_failure" if infra else "self_test_failed",
                                        detail="; ".join(details), parents=[draft.qa.id], run_id=run.run_id,
                                        payload={"checks": all_checks}, environment_failure=infra))
            continue
        final = env.model_copy(update={"verification": ver, "run_id": run.run_id})
        final = Environment.model_validate(final.model_dump(exclude={"id"}))  # id over the final content
        envs.append(final)
        dsets.append(DistractorSet(env_id=final.id, mix=spec.mix().as_dict(), picks=picks, parents=[final.id, draft.qa.id],
                                   run_id=run.run_id))
    async with write_turn or contextlib.nullcontext():
        await asyncio.to_thread(run.wh.upsert, envs + merges + dsets + candidates + stamp(rejections, run.run_id))
    clock.lap("write_s")
    done = sum(m.merged for m in merges)  # a group that grew counts once: where it first merged
    counts = {"environments": len(envs), "env_rejections": len(rejections), "merges": new_groups,
              "merges_refused": sum(not m.merged for m in merges), "distractor_sets": len(dsets)}
    if done - new_groups:
        counts["merges_grown"] = done - new_groups
    return counts


class Clock:
    def __init__(self, into: dict[str, float]) -> None:
        import time

        self._now = time.perf_counter
        self.into = into
        self.last = self._now()

    def lap(self, name: str) -> None:
        now = self._now()
        self.into[name] = self.into.get(name, 0.0) + now - self.last
        self.last = now


def chunks(ids: list[str], size: int) -> list[list[str]]:
    return [ids[i:i + size] for i in range(0, len(ids), size)]
