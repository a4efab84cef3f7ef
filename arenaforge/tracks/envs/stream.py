"""The streaming envs pipeline (`EnvsSpec.pipeline = "stream"`): each QA moves on as soon as it is ready.

    per QA, the moment it is ready:   decomposed -> judged + structural checks -> (kept) tools built
                                      -> sandbox-verified, regenerated on failure
    per batch_size window of kept QAs, the moment its last QA's tools are done:
                                      merging -> distractors -> self-test -> written

Everything runs on the run's one event loop and goes through its one model limiter. A QA's later stages
ask for their slots at a higher priority (`request_priority`: judge 1, tools 2, a window's merging 3)
than new decompositions, and within a stage the QA planned first goes first; so QAs go through in about
the order they were planned instead of every decomposition first, and windows of kept QAs complete one after another while later QAs are still being
decomposed: merging, distractors and self-tests of a window overlap the requests of the next ones, and
only the last window's run after the last request. The tool stage is bounded by a semaphore (as the batch
pipeline's); records go to the warehouse through a `RecordWriter` every second, so a killed run loses at
most the last second's records and a re-run (content ids) completes it. At most `DECOMPOSE_AHEAD`
decompositions are past their prompt at once (so the first requests leave before the whole run's prompts are
built), and the sandbox pool starts just after the first ones.

Same results as the batch pipeline (`synthesize_qas` then `build_environments` per chunk of
`batch_size`): the same per-QA functions, and the end stages see the same drafts in the same order. The
windows are the batch pipeline's chunks: kept QAs in synthesis order (sources in turn, each source's
planned decompositions in order, a repeated instance at its first place), cut every `batch_size`, each
grouped by source (by id within a source, as the batch pipeline reads a chunk back, unless
`merge_across` keeps synthesis order). A window is cut by walking the decompositions in that order as they
resolve. The percentile keep rule needs the whole batch's scores before anything is kept, so `EnvsSpec`
refuses it with stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from arenaforge.schemas.models import QAInstance, Rejection
from arenaforge.services.models.limiter import request_priority
from arenaforge.services.run_scope import RunScope
from arenaforge.tracks.envs.build_tools import ToolBuilder
from arenaforge.tracks.envs.decompose_qa import DecomposeInputs
from arenaforge.tracks.envs.distractors import Embedder
from arenaforge.tracks.envs.knowledge import KnowledgeSource, run_sources
from arenaforge.tracks.envs.pipeline import (
    Clock,
    EnvsSpec,
    build_environments,
    chunks,
    finish_environments,
    qa_synthesizer,
    stamp,
    synthesize_qas,
)
from arenaforge.tracks.envs.stream_writer import RecordWriter
from arenaforge.tracks.envs.synthesize_env import synthesize_one
from arenaforge.tracks.envs.tool_impl import EnvDraft
from arenaforge.tracks.envs.verify_qa import QAJudge, judge_one, verify_batch

# QAs whose tools are being built or verified at once: about the endpoint's limit, so the tool stage takes
# QAs in the order they were kept and an early window's tools are not spread over the whole run
TOOL_CONCURRENCY = 128
# decompositions rendered and sent (or waiting for a model slot) at once: twice the endpoint's limit keeps a queue
# at the limiter, while the first requests go out after 256 prompts are built instead of the whole run's
DECOMPOSE_AHEAD = 2 * TOOL_CONCURRENCY
JUDGE, TOOLS, FINISH = 1, 2, 3  # request priorities of a QA's later stages (a new decomposition's is 0); within
                                # a stage, the QA planned first goes first


OnWindow = Callable[[int, dict[str, int]], None]  # (window number, its counts), once its records are written


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
                      embed: Embedder | None = None, timings: dict[str, float] | None = None,
                      on_window: OnWindow | None = None) -> dict[str, int]:
    """QAs through verification and sandbox-verified tools one by one, each window's end stages once it is done.

    `timings` gets the end stages' times summed over windows; from the start until every tool is verified
    (`tools_verified_s`), until the last window is cut (`last_window_cut_s`), and each window's milestones
    (`window<N>_cut_s`, `_tools_s`: its tools done, `_done_s`: written). `on_window` hears of each window once its
    environments are written (the flow logs it)."""
    timings = timings if timings is not None else {}
    started = time.perf_counter()
    seed = run.cfg.seed if spec.seed is None else spec.seed
    sources = run_sources(run, spec.sources, spec.shared_data) if sources is None else sources
    async with RecordWriter(run.wh) as writer:
        flow = _Stream(run, spec, sources, seed, writer, embed, timings, on_window)
        jobs: list[asyncio.Future[tuple[QAInstance, bool] | None]] = []
        for source in sources.values():  # every decomposition is planned now; `DECOMPOSE_AHEAD` of them go out
            flow.reject(source.rejections)
            planned = flow.synth.plan(source, spec.qa_spec(seed))
            if isinstance(planned, Rejection):
                flow.reject([planned])
                continue
            jobs += [asyncio.ensure_future(flow.qa(inputs, len(jobs) + k)) for k, inputs in enumerate(planned)]
        # the pool is first needed once a QA is decomposed and judged (two answers away): it starts after the first
        # requests, not before them
        pool_started = flow.pool_started = asyncio.ensure_future(_after_first_requests(run.sandbox))
        counts = await flow.windows(jobs)
        await pool_started  # started with the run even when no QA was kept: its errors are the run's
    timings["tools_verified_s"] = max(flow.tools_done_at - started, 0.0)
    timings["last_window_cut_s"] = max(flow.last_window_at - started, 0.0)
    return counts


async def _after_first_requests(start: Callable[[], Awaitable[Any]]) -> Any:
    """`start()`, one loop pass later: the decompositions started just before it send their requests first."""
    await asyncio.sleep(0)
    return await start()


def _batch_order(chunk: list[QAInstance], synthesis_order: bool) -> list[str]:
    """A chunk's QA ids as the batch pipeline meets them, grouped by source: in synthesis order when merging
    across batches, else by id (its warehouse read)."""
    by_source: dict[str, list[str]] = {}
    for qa in (chunk if synthesis_order else sorted(chunk, key=lambda q: q.id)):
        by_source.setdefault(qa.source, []).append(qa.id)
    return [i for ids in by_source.values() for i in ids]


class _Stream:
    """One streaming run's per-QA steps, its windows and what they have started."""

    def __init__(self, run: RunScope, spec: EnvsSpec, sources: dict[str, KnowledgeSource], seed: int,
                 writer: RecordWriter, embed: Embedder | None, timings: dict[str, float],
                 on_window: OnWindow | None = None) -> None:
        self.run, self.spec, self.seed, self.writer, self.on_window = run, spec, seed, writer, on_window
        self.pool_started: asyncio.Future[Any]  # set once the first decompositions are started
        self.embed, self.timings = embed, timings
        self.synth = qa_synthesizer(run, spec)
        self.judge = QAJudge(run.model)
        self.builders = {name: ToolBuilder(run.model, source, seed, spec.tool_code) for name, source in sources.items()}
        self.no_source = ToolBuilder(run.model, None, seed, spec.tool_code)
        self.paths: dict[str, asyncio.Future[bool]] = {}  # per instance id: judged, and kept or not
        self.tools: dict[str, asyncio.Future[EnvDraft | Rejection]] = {}
        self.tool_slots = asyncio.Semaphore(TOOL_CONCURRENCY)
        self.decompose_slots = asyncio.Semaphore(DECOMPOSE_AHEAD)  # first come (planned order), first served
        # with merge_across, windows merge one at a time in order (each against the ones before it), and write in
        # order: a crash leaves the first windows written, which a re-run's merge index takes up where they stopped
        self.merge_turns, self.write_turns = _Turns(), _Turns()
        self.qa_rejections = 0
        self.started = self.tools_done_at = self.last_window_at = time.perf_counter()

    def reject(self, rejections: list[Rejection]) -> None:
        self.qa_rejections += len(rejections)
        self.writer.add(stamp(rejections, self.run.run_id))

    async def qa(self, inputs: DecomposeInputs, position: int) -> tuple[QAInstance, bool] | None:
        """One planned decomposition through judging (and, once kept, its tools started): the instance and
        whether it is kept; None when it was refused."""
        async with self.decompose_slots:  # its prompt is built only when it may go out
            made = await self.synth.decompose(inputs)
        if isinstance(made, Rejection):
            self.reject([made])
            return None
        if made.id not in self.paths:  # a repeated instance (same content id) is judged once
            self.paths[made.id] = asyncio.ensure_future(self.verify(made, position))
        return made, await self.paths[made.id]

    async def verify(self, qa: QAInstance, position: int) -> bool:
        self.writer.add(stamp([qa], self.run.run_id))
        with request_priority(JUDGE, -position):
            judged = asyncio.ensure_future(judge_one(self.judge, qa, self.run.run_id))
            verdict = await verify_batch(self.judge, [qa], self.spec.keep(), self.spec.min_hops, self.spec.max_hops,
                                         self.run.run_id, {qa.id: judged})
        self.writer.add(verdict.verifications)
        self.reject(verdict.rejections)
        for kept in verdict.kept:
            self.tools[kept.id] = asyncio.ensure_future(self.build(kept, position))
        return bool(verdict.kept)

    async def build(self, qa: QAInstance, position: int) -> EnvDraft | Rejection:
        pool = await self.pool_started
        with request_priority(TOOLS, -position):
            async with self.tool_slots:
                return await synthesize_one(self.builders.get(qa.source, self.no_source), pool, qa,
                                            self.spec.max_attempts, self.run.run_id)

    async def windows(self, jobs: list[asyncio.Future[tuple[QAInstance, bool] | None]]) -> dict[str, int]:
        """Walk the decompositions in synthesis order as they resolve; start each window's end stages once
        `batch_size` kept QAs are known (the last window at the end); the counts of the whole run."""
        seen: set[str] = set()
        window: list[QAInstance] = []
        finishing: list[asyncio.Future[dict[str, int]]] = []
        instances = kept = 0
        for job in jobs:
            got = await job
            if got is None or got[0].id in seen:
                continue
            seen.add(got[0].id)
            instances += 1
            if got[1]:
                kept += 1
                window.append(got[0])
            if len(window) == self.spec.batch_size:
                finishing.append(asyncio.ensure_future(self.finish(window, len(finishing) + 1)))
                window = []
        if window:
            finishing.append(asyncio.ensure_future(self.finish(window, len(finishing) + 1)))
        self.last_window_at = time.perf_counter()
        counts = {"qa_instances": instances, "qa_kept": kept, "qa_rejected": instances - kept}
        for result in await asyncio.gather(*finishing):
            for key, value in result.items():
                counts[key] = counts.get(key, 0) + value
        counts["rejections"] = self.qa_rejections
        return counts

    async def finish(self, window: list[QAInstance], number: int) -> dict[str, int]:
        """One window's merging, distractors and self-test, once its QAs' tools are done."""
        self.mark(f"window{number}_cut_s")
        with request_priority(FINISH, -number):
            outcomes = dict(zip([qa.id for qa in window], await asyncio.gather(*(self.tools[qa.id] for qa in window)),
                                strict=True))
            self.tools_done_at = max(self.tools_done_at, time.perf_counter())  # the last window's: every tool
            self.mark(f"window{number}_tools_s")
            rejected = [r for r in outcomes.values() if isinstance(r, Rejection)]
            self.writer.add(stamp(rejected, self.run.run_id))
            across = self.spec.merge and self.spec.merge_across
            drafts = [d for i in _batch_order(window, across) if isinstance(d := outcomes[i], EnvDraft)]
            result = await finish_environments(self.run, self.spec, await self.pool_started, drafts, [], self.seed,
                                               self.embed, Clock(self.timings),
                                               self.merge_turns.turn(number) if across else None,
                                               self.write_turns.turn(number) if across else None)
        result["env_rejections"] = result.get("env_rejections", 0) + len(rejected)
        self.mark(f"window{number}_done_s")
        if self.on_window is not None:
            self.on_window(number, result)
        return result

    def mark(self, name: str) -> None:
        """A window's milestone in `timings`: seconds since the run started."""
        self.timings[name] = time.perf_counter() - self.started


class _Turns:
    """Turns taken in order: `async with turns.turn(n):` waits until turns 1..n-1 have ended."""

    def __init__(self) -> None:
        self.ended = 0
        self.changed = asyncio.Condition()

    @contextlib.asynccontextmanager
    async def turn(self, number: int) -> AsyncIterator[None]:
        async with self.changed:
            await self.changed.wait_for(lambda: self.ended == number - 1)
        try:
            yield
        finally:
            async with self.changed:
                self.ended += 1
                self.changed.notify_all()
