"""The RL environment track's stages (flow `envs`), as plain functions over the warehouse.

    synthesize_qas      sources -> QA instances -> verification      writes qa_instances, qa_verifications,
                                                                     rejections; returns kept QA ids
    build_environments  kept QA ids -> tools verified in the sandbox  writes environments, env_merges,
                        -> merging -> distractors -> self-test       distractor_sets, rejections

Stages pass references (QA ids), never datasets, and write once per batch at their end, so a
killed run loses at most the batch in flight and a re-run (content ids) completes it.
`arenaforge/flows/envs_flows.py` wraps these in Prefect tasks; `arenaforge/tasks/benchmarks/envs.py` calls them
directly. Backends are picked once here, by the factory tables of each step.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from typing import Any, Literal

from pydantic import BaseModel, Field

from arenaforge.schemas.config import Config
from arenaforge.schemas.kinds_envs import DistractorSet
from arenaforge.schemas.models import Environment, QAInstance, Rejection, Verification
from arenaforge.tasks.envs.decompose_qa import QA_SYNTHESIZERS, STRUCTURES, QASpec
from arenaforge.tasks.envs.distractors import DistractorMix, Embedder, choose_distractors
from arenaforge.tasks.envs.knowledge import KnowledgeSource, load_source
from arenaforge.tasks.envs.merge_envs import GROUPERS, merge_environments
from arenaforge.tasks.envs.synthesize_env import TOOL_BUILDERS, EnvDraft, assemble, self_test, synthesize_environments
from arenaforge.tasks.envs.verify_qa import QA_JUDGES, KeepRule, judge_one, verify_batch
from arenaforge.warehouse.db import Warehouse


class EnvsSpec(BaseModel):
    """Parameters of the `envs` flow (also its typed form in the Prefect UI)."""

    sources: list[str] = Field(default_factory=lambda: ["sample"],
                               description="Knowledge sources: sample, tau2_retail, astra, or paths to table files/dirs.")
    n: int = Field(default=24, ge=1, le=100_000, description="QA instances to synthesize per source.")
    min_hops: int = Field(default=1, ge=1, le=8)
    max_hops: int = Field(default=3, ge=1, le=8)
    structures: list[Literal["single_hop", "parallel_single_hop", "multi_hop", "parallel_multi_hop"]] = Field(
        default_factory=lambda: list(STRUCTURES))
    mode: Literal["unconditioned", "conditioned"] = "unconditioned"
    seed_questions: list[str] = Field(default_factory=list, description="Seeds for conditioned mode (default: the source's).")
    keep_rule: Literal["threshold", "percentile"] = "threshold"
    qs_threshold: float = Field(default=0.75, ge=0, le=1)
    qs_percentile: float = Field(default=85.0, ge=0, le=100)
    max_attempts: int = Field(default=2, ge=0, le=10, description="Regenerations of a failing tool.")
    distractors_high: int = Field(default=1, ge=0, le=20)
    distractors_medium: int = Field(default=1, ge=0, le=20)
    distractors_low: int = Field(default=1, ge=0, le=20)
    merge: bool = True
    batch_size: int = Field(default=400, ge=1, description="QA instances per environment-building batch.")
    shared_data: str | None = Field(default=None, description="Path of ../shared/data (tau2_retail, astra sources).")
    seed: int | None = Field(default=None, description="Generator seed (default: config seed).")

    def qa_spec(self, seed: int) -> QASpec:
        return QASpec(n=self.n, min_hops=self.min_hops, max_hops=self.max_hops, structures=tuple(self.structures),
                      mode=self.mode, seed_questions=tuple(self.seed_questions), seed=seed)

    def keep(self) -> KeepRule:
        return KeepRule(self.keep_rule, self.qs_threshold, self.qs_percentile)

    def mix(self) -> DistractorMix:
        return DistractorMix(self.distractors_high, self.distractors_medium, self.distractors_low)


@contextlib.contextmanager
def model_for(cfg: Config, wh: Warehouse, run_id: str | None) -> Iterator[Any]:
    """The ChatModel of the openai backend (None offline)."""
    if cfg.model.backend == "offline":
        yield None
        return
    from arenaforge.tasks.models import chat_model

    with chat_model(cfg.model, wh, run_id) as model:
        yield model


def load_sources(spec: EnvsSpec) -> dict[str, KnowledgeSource]:
    out = {}
    for name in spec.sources:
        source = load_source(name, shared_data=spec.shared_data)
        out[source.name] = source
    return out


def _stamp(records: list[Any], run_id: str | None) -> list[Any]:
    return [r if r.run_id == run_id else r.model_copy(update={"run_id": run_id}) for r in records]


def synthesize_qas(cfg: Config, wh: Warehouse, run_id: str | None, spec: EnvsSpec,
                   sources: dict[str, KnowledgeSource] | None = None) -> tuple[list[str], dict[str, int]]:
    """Synthesize and verify QA instances from every source; (kept QA ids, counts)."""
    seed = cfg.seed if spec.seed is None else spec.seed
    own = sources is None
    sources = load_sources(spec) if sources is None else sources
    instances: list[QAInstance] = []
    rejections: list[Rejection] = []
    with model_for(cfg, wh, run_id) as model:
        synth = QA_SYNTHESIZERS[cfg.model.backend](model)
        judge = QA_JUDGES[cfg.model.backend](model)

        async def go() -> Any:
            started: dict[str, Any] = {}

            def judge_soon(qa: QAInstance) -> None:  # verification starts while other instances are synthesized
                if qa.id not in started:
                    started[qa.id] = asyncio.ensure_future(judge_one(judge, qa, run_id))

            for source in sources.values():
                rejections.extend(source.rejections)
                batch = await synth.synthesize(source, spec.qa_spec(seed), judge_soon)
                instances.extend(batch.instances)
                rejections.extend(batch.rejections)
            return await verify_batch(judge, instances, spec.keep(), spec.min_hops, spec.max_hops, run_id, started)

        verdict = asyncio.run(go())
    if own:
        for source in sources.values():
            source.close()
    rejections.extend(verdict.rejections)
    records = _stamp(instances, run_id) + verdict.verifications + _stamp(rejections, run_id)
    wh.upsert(records)
    counts = {"qa_instances": len(instances), "qa_kept": len(verdict.kept),
              "qa_rejected": len(instances) - len(verdict.kept), "rejections": len(rejections)}
    return [qa.id for qa in verdict.kept], counts


def build_environments(cfg: Config, wh: Warehouse, run_id: str | None, spec: EnvsSpec, qa_ids: list[str],
                       sources: dict[str, KnowledgeSource] | None = None, embed: Embedder | None = None,
                       pool: Any = None, timings: dict[str, float] | None = None) -> dict[str, int]:
    """Tools, sandbox verification, merging, distractors and self-test for one batch of QA ids."""
    if not qa_ids:
        return {"environments": 0}
    seed = cfg.seed if spec.seed is None else spec.seed
    instances = _load_qas(wh, qa_ids)
    own_sources = sources is None
    sources = load_sources(spec) if sources is None else sources
    try:
        with model_for(cfg, wh, run_id) as model:
            return asyncio.run(_build(cfg, wh, run_id, spec, instances, sources, model, seed, embed, pool,
                                      timings if timings is not None else {}))
    finally:
        if own_sources:
            for source in sources.values():
                source.close()


def _load_qas(wh: Warehouse, ids: list[str]) -> list[QAInstance]:
    with wh.connect() as con:
        rows = con.execute("SELECT record FROM qa_instances WHERE list_contains(?, id) ORDER BY id", [ids]).fetchall()
    return [QAInstance.model_validate_json(r[0]) for r in rows]


async def _build(cfg: Config, wh: Warehouse, run_id: str | None, spec: EnvsSpec, instances: list[QAInstance],
                 sources: dict[str, KnowledgeSource], model: Any, seed: int, embed: Embedder | None,
                 pool: Any, timings: dict[str, float]) -> dict[str, int]:
    from arenaforge.environments.runtime import create_pool

    clock = _Clock(timings)
    own_pool = pool is None
    pool = await create_pool(cfg.sandbox) if own_pool else pool
    clock.lap("pool_start_s")
    rejections: list[Rejection] = []
    try:
        drafts: list[EnvDraft] = []
        by_source: dict[str, list[QAInstance]] = {}
        for qa in instances:
            by_source.setdefault(qa.source, []).append(qa)
        for name, qas in by_source.items():
            source = sources.get(name)
            if source is None and cfg.model.backend == "offline":
                rejections += [Rejection(stage="synthesize_env", subject=qa.id, reason="source_unavailable",
                                         detail=f"knowledge source {name} is not loaded", parents=[qa.id]) for qa in qas]
                continue
            builder = TOOL_BUILDERS[cfg.model.backend](model, source, seed)
            result = await synthesize_environments(builder, pool, qas, spec.max_attempts, run_id)
            drafts += result.drafts
            rejections += result.rejections
        clock.lap("tools_verified_s")
        merges = []
        if spec.merge and len(drafts) > 1:
            merged = await merge_environments(GROUPERS[cfg.model.backend](model), pool, drafts, run_id)
            drafts, merges = merged.drafts, merged.merges
        clock.lap("merge_s")
        chosen = await asyncio.to_thread(choose_distractors, drafts, spec.mix(), embed, seed)
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
    finally:
        if own_pool:
            await pool.shutdown()
    envs: list[Environment] = []
    dsets: list[DistractorSet] = []
    for (draft, env, picks), (checks, details) in zip(finals, tested, strict=True):
        base = {"imports": True, "gold_calls": True, "no_answer_leak": True, "no_timeout": True}
        all_checks = {**base, **checks}
        ver = Verification(passed=all(all_checks.values()), checks=all_checks,
                           details=[f"tools verified after {draft.attempt + 1} attempt(s)", *details])
        if not ver.passed:
            infra = any(d.startswith("sandbox_failure") for d in details)
            rejections.append(Rejection(stage="self_test", subject=draft.qa.id,
                                        reason="sandbox_failure" if infra else "self_test_failed",
                                        detail="; ".join(details), parents=[draft.qa.id], run_id=run_id,
                                        payload={"checks": all_checks}, environment_failure=infra))
            continue
        final = env.model_copy(update={"verification": ver, "run_id": run_id})
        final = Environment.model_validate(final.model_dump(exclude={"id"}))  # id over the final content
        envs.append(final)
        dsets.append(DistractorSet(env_id=final.id, mix=spec.mix().as_dict(), picks=picks, parents=[final.id, draft.qa.id],
                                   run_id=run_id))
    wh.upsert(envs + merges + dsets + _stamp(rejections, run_id))
    clock.lap("write_s")
    return {"environments": len(envs), "env_rejections": len(rejections), "merges": sum(m.merged for m in merges),
            "merges_refused": sum(not m.merged for m in merges), "distractor_sets": len(dsets)}


class _Clock:
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
