"""`runner.kind = "ray"`: the envs flow's batches run as Prefect task runs on a real two-node Ray cluster on loopback
(prefect-ray), and the warehouse ends with the same record ids as a thread-runner run on the same inputs."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import shutil
from pathlib import Path

import pytest

from arenaforge.schemas.kinds_envs import QAVerification
from arenaforge.schemas.models import Environment, QAInstance, Rejection
from arenaforge.warehouse import Warehouse
from tests.support.envs_fakes import EnvsResponder
from tests.support.requirements import skip_or_fail

pytestmark = pytest.mark.prefect_server


def _require_prefect_ray() -> None:
    # looked up, not imported: importing prefect at collection binds its log handlers to whatever stream is
    # current then, and a later test's closed stream sent its logging into a recursion
    if importlib.util.find_spec("prefect_ray") is None:
        skip_or_fail("prefect-ray is absent (the `ray` extra; scripts/setup.sh installs it)")


def test_envs_on_a_two_node_ray_cluster_matches_the_thread_runner(prefect_server, scripted_openai, tmp_path: Path):
    from arenaforge.flows.envs_flows import EnvsParams, envs
    from tests.support.ray_cluster import RayCluster

    _require_prefect_ray()
    scripted_openai.responder = EnvsResponder()

    def run(db: Path, runner: dict) -> dict:
        params = EnvsParams(
            sources=["sample"], n=6, seed=0, batch_size=2,
            overrides={"warehouse.path": str(db), "model.backend": "openai", "model.base_url": scripted_openai.url,
                       "model.model": "scripted", "model.max_retries": 1, "model.backoff_base_s": 0.01,
                       "sandbox.backend": "process", "sandbox.process_allows_model_code": True, **runner})
        return asyncio.run(envs(params))

    short = Path(os.environ.get("TMPDIR", "/tmp")) / f"rt{os.getpid()}"  # unix socket paths are capped at 107 bytes
    short.mkdir(exist_ok=True)
    cluster = RayCluster(short)
    try:
        cluster.start()
        on_ray = run(tmp_path / "ray.duckdb", {"runner.kind": "ray", "runner.address": cluster.address})
    finally:
        cluster.stop()
    on_threads = run(tmp_path / "threads.duckdb", {})
    ray_wh, thread_wh = Warehouse(tmp_path / "ray.duckdb"), Warehouse(tmp_path / "threads.duckdb")
    assert on_ray["environments"] == on_threads["environments"] == len(thread_wh.load(Environment)) > 0
    for kind in (Environment, QAInstance, QAVerification, Rejection):
        assert sorted(r.id for r in ray_wh.load(kind)) == sorted(r.id for r in thread_wh.load(kind)), kind.__name__
    ran = sum(log.read_text(errors="replace").count(":task_name:build-environments")
              for log in (short / "ray" / "session_latest" / "logs").glob("worker-*.out"))
    assert ran >= 2, "the batches ran as task runs in Ray workers"
    shutil.rmtree(short, ignore_errors=True)
    _, runs = ray_wh.query("SELECT count(DISTINCT run_id) FROM environments")
    assert runs == [(1,)], "the workers wrote under the flow's run id"
