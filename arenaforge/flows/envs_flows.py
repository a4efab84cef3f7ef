"""Flow `envs` (`arenaforge envs synth`): ASTRA's RL track from knowledge sources to verified environments.

    synthesize-qas  -> kept QA ids -> build-environments (one task run per batch of QA ids)

Composition only: the stages live in `arenaforge/tasks/envs/pipeline.py`. Model-driven stages use
retries=0 (the model-access layer owns retries); both stages are idempotent (content ids),
so a re-run after a crash completes what was missing.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, task
from pydantic import Field

from arenaforge.flows.artifacts import MODEL_ENDPOINT, SANDBOX, progress, run_summary
from arenaforge.schemas.config import load_config
from arenaforge.tasks.envs.pipeline import EnvsSpec, build_environments, chunks, synthesize_qas
from arenaforge.warehouse import Warehouse
from arenaforge.warehouse.runs import recorded_run


class EnvsParams(EnvsSpec):
    """`envs` flow parameters: what to synthesize, plus where the config comes from."""

    config_path: str | None = Field(default=None, description="arenaforge.toml to load (default: ./arenaforge.toml).")
    overrides: dict[str, Any] = Field(default_factory=dict, description="Dotted config overrides, e.g. model.backend.")


@task(name="synthesize-qas", retries=0, tags=[MODEL_ENDPOINT])
def synthesize_qas_task(params: EnvsParams, run_id: str) -> tuple[list[str], dict[str, int]]:
    cfg = load_config(params.config_path, overrides=params.overrides)
    return synthesize_qas(cfg, _warehouse(cfg), run_id, params)


@task(name="build-environments", retries=0, tags=[MODEL_ENDPOINT, SANDBOX])
def build_environments_task(params: EnvsParams, run_id: str, qa_ids: list[str]) -> dict[str, int]:
    cfg = load_config(params.config_path, overrides=params.overrides)
    return build_environments(cfg, _warehouse(cfg), run_id, params, qa_ids)


def _warehouse(cfg: Any) -> Warehouse:
    return Warehouse(cfg.warehouse.path, lock_timeout_s=cfg.warehouse.lock_timeout_s,
                     data_path=cfg.warehouse.data_path)


@flow(name="envs", log_prints=True)
def envs(params: EnvsParams) -> dict[str, int]:
    """Synthesize verified, executable RL environments (ASTRA §1b) into the warehouse."""
    cfg = load_config(params.config_path, overrides=params.overrides)
    wh = _warehouse(cfg)
    with recorded_run(wh, "envs", params.model_dump(mode="json")) as (run, counts):
        qa_ids, qa_counts = synthesize_qas_task(params, run.id)
        counts.update(qa_counts)
        batches = chunks(qa_ids, params.batch_size)
        bar = progress("envs-batches", len(batches), "environment batches built")
        for batch in batches:
            for key, value in build_environments_task(params, run.id, batch).items():
                counts[key] = counts.get(key, 0) + value
            bar.advance()
        run_summary("envs", run.id, counts, warehouse_path=str(wh.path))
    return counts
