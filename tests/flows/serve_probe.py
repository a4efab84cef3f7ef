"""A tiny flow the serve tests deploy next to the real ones: writes `n` rows, optionally slowly.

Used so the server/worker/UI tests do not depend on which capability flows have landed.
"""

from __future__ import annotations

import time

from prefect import flow, task
from pydantic import BaseModel, Field

from arenaforge.flows.artifacts import progress, run_summary
from arenaforge.schemas.config import load_config
from arenaforge.schemas.models import Rejection
from arenaforge.warehouse import Warehouse, recorded_run


class ProbeParams(BaseModel):
    tag: str = Field(default="probe", description="Written into every row's subject.")
    n: int = Field(default=5, ge=1, le=10_000, description="Rows to write.")
    batch: int = Field(default=5, ge=1, description="Rows per transaction.")
    pause_s: float = Field(default=0.0, ge=0, description="Sleep between batches (to kill a run mid-way).")
    wait_for_flow: str | None = Field(
        default=None, description="After the rows, keep writing one tick row a second until a run of this flow completed."
    )
    wait_timeout_s: float = Field(default=300, gt=0)


@task(retries=2, retry_delay_seconds=1)
def write_batch(db: str, tag: str, start: int, stop: int, run_id: str) -> int:
    wh = Warehouse(db)
    rows = [
        Rejection(stage="probe", subject=f"{tag}-{i}", reason="malformed_json", detail=str(i), run_id=run_id)
        for i in range(start, stop)
    ]
    return wh.upsert(rows)


def _tick_until_done(wh: Warehouse, params: ProbeParams, run_id: str, since: str) -> int:
    """Interleave writes with another flow's run: one row per tick until it has completed.

    A run that finished after this one started overlapped it, whichever of the two the worker started first."""
    deadline = time.monotonic() + params.wait_timeout_s
    new, tick = 0, 0
    while True:
        _, done = wh.query(
            "SELECT count(*) FROM v_runs WHERE flow = ? AND status = 'completed' AND finished_at >= ?",
            [params.wait_for_flow, since],
        )
        if done[0][0]:
            return new
        if time.monotonic() > deadline:
            raise TimeoutError(f"no completed {params.wait_for_flow} run within {params.wait_timeout_s}s")
        new += wh.upsert([Rejection(stage="tick", subject=f"{params.tag}-tick-{tick}", reason="malformed_json", run_id=run_id)])
        tick += 1
        time.sleep(1.0)


@flow(name="serve-probe")
def probe(params: ProbeParams = ProbeParams()) -> int:
    """Write `n` probe rows to the warehouse in batches."""
    cfg = load_config()
    wh = Warehouse(cfg.warehouse.path, lock_timeout_s=cfg.warehouse.lock_timeout_s)
    bar = progress(f"probe-{params.tag}", params.n)
    with recorded_run(wh, "serve-probe", params.model_dump()) as (run, counts):
        new = 0
        for start in range(0, params.n, params.batch):
            stop = min(start + params.batch, params.n)
            new += write_batch(str(wh.path), params.tag, start, stop, run.id)
            bar.set(stop)
            if params.pause_s:
                time.sleep(params.pause_s)
        if params.wait_for_flow:
            new += _tick_until_done(wh, params, run.id, run.started_at)
        counts["rejections"] = new
    run_summary("serve-probe", run.id, counts, warehouse_path=str(wh.path))
    return new
