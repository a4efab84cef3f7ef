"""Flow `envs` (`arenaforge envs synth`): ASTRA's RL track from knowledge sources to verified environments.

    synthesize-qas  -> kept QA ids -> build-environments (one task run per batch of QA ids)
    stream-envs     (pipeline = stream: each QA moves on when ready, one task run; tracks/envs/stream.py)
    runner.kind = ray: every batch at once in the Ray workers; with merge_across they build-tools only and
                       this process runs finish-environments per batch, in batch order

Composition only: the stages live in `arenaforge/tracks/envs/pipeline.py`. The flow runs in one event
loop and opens one `RunScope` (the run's model and sandbox pool) that every stage shares. Model-driven
stages use retries=0 (the model-access layer owns retries); both stages are idempotent (content ids),
so a re-run after a crash completes what was missing.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NONE

from arenaforge.flows.artifacts import MODEL_ENDPOINT, SANDBOX, progress, run_summary
from arenaforge.flows.envs_params import EnvsParams
from arenaforge.flows.outcome import finish
from arenaforge.flows.ray_runner import on_ray, runs_on_ray, worker_config, worker_scope
from arenaforge.schemas.config import load_config
from arenaforge.services.run_scope import RunScope, open_run_scope
from arenaforge.tracks.envs.pipeline import build_environments, build_tools, chunks, finish_batch, synthesize_qas
from arenaforge.tracks.envs.stream import stream_envs
from arenaforge.tracks.envs.synthesize_env import SynthResult
from arenaforge.warehouse import Warehouse, recorded_run

# The run scope holds live objects (an HTTP session, a sandbox pool): never part of a cache key.
synthesize_qas_task = task(synthesize_qas, name="synthesize-qas", retries=0, tags=[MODEL_ENDPOINT], cache_policy=NONE)
build_environments_task = task(build_environments, name="build-environments", retries=0,
                               tags=[MODEL_ENDPOINT, SANDBOX], cache_policy=NONE)
stream_envs_task = task(stream_envs, name="stream-envs", retries=0, tags=[MODEL_ENDPOINT, SANDBOX], cache_policy=NONE)


@flow(name="envs", log_prints=True)
async def envs(params: EnvsParams = EnvsParams()) -> dict[str, int]:
    """Synthesize verified, executable RL environments (ASTRA §1b) into the warehouse."""
    cfg = load_config(params.config_path, overrides=params.overrides)
    wh = Warehouse.from_config(cfg.warehouse)
    with recorded_run(wh, "envs", params.model_dump(mode="json")) as (run, counts):
        async with open_run_scope(cfg, wh, run.id) as scope:
            await _stages(scope, params, counts)
        run_summary("envs", run.id, counts, warehouse_path=str(wh.path))
        finish("envs", wh, run.id, counts.get("environments", 0), "environments")
    return {**counts, "run_id": run.id}


async def _stages(scope: RunScope, params: EnvsParams, counts: dict[str, int]) -> None:
    """QAs, then environments batch by batch; counts fill as stages finish (a failed run keeps them)."""
    if params.pipeline == "stream" and not runs_on_ray(scope.cfg):  # on Ray, batches go to the workers
        logger = get_run_logger()

        def written(number: int, window: dict[str, int]) -> None:
            logger.info(f"window {number} written: {window.get('environments', 0)} environments, "
                        f"{window.get('env_rejections', 0)} rejected, {window.get('merges', 0)} new merges")

        counts.update(await stream_envs_task(scope, params, on_window=written))
        return
    qa_ids, qa_counts = await synthesize_qas_task(scope, params)
    counts.update(qa_counts)
    batches = chunks(qa_ids, params.batch_size)
    bar = progress("envs-batches", len(batches), "environment batches built")
    if runs_on_ray(scope.cfg):
        async for result in _batches_on_ray(scope, params, batches):
            for key, value in result.items():
                counts[key] = counts.get(key, 0) + value
            bar.advance()
        return
    for batch in batches:
        for key, value in (await build_environments_task(scope, params, batch)).items():
            counts[key] = counts.get(key, 0) + value
        bar.advance()


async def build_batch_in_worker(cfg_json: dict[str, Any], run_id: str | None, params: EnvsParams,
                                batch: list[str]) -> dict[str, int]:
    """One whole batch of environments, written by the worker (batches merge within themselves)."""
    async with worker_scope(cfg_json, run_id) as scope:
        return await build_environments(scope, params, batch)


async def build_tools_in_worker(cfg_json: dict[str, Any], run_id: str | None, params: EnvsParams,
                                batch: list[str]) -> SynthResult:
    """One batch's tools built and sandbox-verified by the worker; the drafts go back to the flow to finish."""
    async with worker_scope(cfg_json, run_id) as scope:
        return await build_tools(scope, params, batch)


build_batch_task = task(build_batch_in_worker, name="build-environments", retries=0,
                        tags=[MODEL_ENDPOINT, SANDBOX], cache_policy=NONE)
build_tools_task = task(build_tools_in_worker, name="build-tools", retries=0,
                        tags=[MODEL_ENDPOINT, SANDBOX], cache_policy=NONE)
finish_batch_task = task(finish_batch, name="finish-environments", retries=0,
                         tags=[MODEL_ENDPOINT, SANDBOX], cache_policy=NONE)


async def _batches_on_ray(scope: RunScope, params: EnvsParams, batches: list[list[str]]
                          ) -> AsyncIterator[dict[str, int]]:
    """Every batch as a task run on the Ray cluster at `runner.address` (prefect-ray), all at once; each batch's
    counts, in batch order. With `merge_across` the workers only build the tools: this process finishes the
    batches one at a time in order, each merging against (and drawing distractors from) the ones before it."""
    job = build_tools_task if params.merge_across else build_batch_task
    inputs = [{"cfg_json": worker_config(scope.cfg), "run_id": scope.run_id, "params": params, "batch": batch}
              for batch in batches]

    async def in_this_process(result: Any) -> Any:
        return await finish_batch_task(scope, params, result) if params.merge_across else result

    async for counts in on_ray(scope, job, inputs, in_this_process):
        yield counts
