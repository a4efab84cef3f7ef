"""`runner.kind = "ray"`: the envs flow's batches run as Prefect task runs on a real two-node Ray cluster on loopback
(prefect-ray), and the warehouse ends with the same record ids as a thread-runner run on the same inputs."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

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


@pytest.fixture(scope="module")
def ray_cluster() -> Iterator[Any]:
    """One head and one worker node for the module's tests (starting them is most of a test's time)."""
    from tests.support.ray_cluster import RayCluster

    _require_prefect_ray()
    short = Path(os.environ.get("TMPDIR", "/tmp")) / f"rt{os.getpid()}"  # unix socket paths are capped at 107 bytes
    short.mkdir(exist_ok=True)
    cluster = RayCluster(short)
    try:
        cluster.start()
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(short, ignore_errors=True)


def _run(db: Path, url: str, runner: dict[str, Any], **spec: Any) -> dict[str, Any]:
    from arenaforge.flows.envs_flows import EnvsParams, envs

    params = EnvsParams(
        sources=["sample"], seed=0, **spec,
        overrides={"warehouse.path": str(db), "model.backend": "openai", "model.base_url": url,
                   "model.model": "scripted", "model.max_retries": 1, "model.backoff_base_s": 0.01,
                   "sandbox.backend": "process", "sandbox.process_allows_model_code": True, **runner})
    return asyncio.run(envs(params))


def _task_runs_in_workers(cluster: Any, name: str) -> int:
    return sum(log.read_text(errors="replace").count(f":task_name:{name}")
               for log in (cluster.work / "ray" / "session_latest" / "logs").glob("worker-*.out"))


def _on_ray(cluster: Any) -> dict[str, str]:
    return {"runner.kind": "ray", "runner.address": cluster.address}


@pytest.mark.slow
def test_envs_on_a_two_node_ray_cluster_matches_the_thread_runner(prefect_server, scripted_openai, ray_cluster,
                                                                  tmp_path: Path):
    scripted_openai.responder = EnvsResponder()
    on_ray = _run(tmp_path / "ray.duckdb", scripted_openai.url, _on_ray(ray_cluster), n=6, batch_size=2)
    on_threads = _run(tmp_path / "threads.duckdb", scripted_openai.url, {}, n=6, batch_size=2)
    ray_wh, thread_wh = Warehouse(tmp_path / "ray.duckdb"), Warehouse(tmp_path / "threads.duckdb")
    assert on_ray["environments"] == on_threads["environments"] == len(thread_wh.load(Environment)) > 0
    for kind in (Environment, QAInstance, QAVerification, Rejection):
        assert sorted(r.id for r in ray_wh.load(kind)) == sorted(r.id for r in thread_wh.load(kind)), kind.__name__
    assert _task_runs_in_workers(ray_cluster, "build-environments") >= 2, "the batches ran as task runs in Ray workers"
    _, runs = ray_wh.query("SELECT count(DISTINCT run_id) FROM environments")
    assert runs == [(1,)], "the workers wrote under the flow's run id"


TABLES = ["qa_instances", "environments", "env_merges", "merge_candidates", "distractor_sets", "rejections"]


@pytest.mark.slow
def test_merge_across_on_ray_matches_the_thread_runner(prefect_server, scripted_openai, ray_cluster, tmp_path: Path):
    """The workers build and verify each batch's tools; the flow merges and finishes the batches in order."""
    scripted_openai.responder = EnvsResponder()
    spec = {"n": 10, "batch_size": 3, "merge_across": True}  # 4 batches: 2 merges, 1 grown by a later batch
    on_ray = _run(tmp_path / "ray.duckdb", scripted_openai.url, _on_ray(ray_cluster), **spec)
    on_threads = _run(tmp_path / "threads.duckdb", scripted_openai.url, {}, **spec)
    assert on_threads["merges"] > 0 and on_threads.get("merges_grown", 0) > 0, "later batches joined earlier groups"
    assert {k: v for k, v in on_ray.items() if k != "run_id"} == {k: v for k, v in on_threads.items() if k != "run_id"}
    ray_wh, thread_wh = Warehouse(tmp_path / "ray.duckdb"), Warehouse(tmp_path / "threads.duckdb")
    for table in TABLES:
        ids = [wh.query(f"SELECT id FROM {table} ORDER BY id")[1] for wh in (ray_wh, thread_wh)]
        assert ids[0] == ids[1], table
    assert _task_runs_in_workers(ray_cluster, "build-tools") >= 2, "the tools were built in Ray workers"


SFT_TABLES = ["tool_chains", "tasks", "trajectories", "judge_scores", "rejections"]


def _sft_warehouse(db: Path, runner: dict[str, Any], batch_size: int) -> dict[str, Any]:
    """The bundled sample tools ingested and graphed, then the sft flow, offline, on `runner`."""
    from importlib import resources

    from arenaforge.flows.sft_flows import GraphParams, IngestParams, SftParams, graph, ingest, sft

    overrides = {"warehouse.path": str(db), "sandbox.backend": "process"}
    sample = str(resources.files("arenaforge.data").joinpath("sample_tools"))
    asyncio.run(ingest(IngestParams(paths=[sample], overrides=overrides)))
    asyncio.run(graph(GraphParams(overrides=overrides)))
    return asyncio.run(sft(SftParams(seed=3, batch_size=batch_size, overrides={**overrides, **runner})))


@pytest.mark.slow
def test_sft_trajectories_on_a_two_node_ray_cluster_match_the_thread_runner(prefect_server, ray_cluster,
                                                                          tmp_path: Path):
    """The workers run and judge the trajectories batch by batch; the flow records the walks once all are judged."""
    on_ray = _sft_warehouse(tmp_path / "ray.duckdb", _on_ray(ray_cluster), batch_size=5)
    on_threads = _sft_warehouse(tmp_path / "threads.duckdb", {}, batch_size=5)
    assert on_threads["trajectories"] > 5, "more than one batch"
    assert {k: v for k, v in on_ray.items() if k != "run_id"} == {k: v for k, v in on_threads.items() if k != "run_id"}
    ray_wh, thread_wh = Warehouse(tmp_path / "ray.duckdb"), Warehouse(tmp_path / "threads.duckdb")
    for table in SFT_TABLES:
        ids = [wh.query(f"SELECT id FROM {table} ORDER BY id")[1] for wh in (ray_wh, thread_wh)]
        assert ids[0] == ids[1], table
    edges = "SELECT server, src, dst, uses FROM graph_edges ORDER BY server, src, dst"
    assert ray_wh.query(edges)[1] == thread_wh.query(edges)[1], "every walked edge counted once per trajectory"
    assert sum(row[3] for row in thread_wh.query(edges)[1]) > 0
    assert _task_runs_in_workers(ray_cluster, "run-and-judge-trajectories") >= 2, "the batches ran in Ray workers"
    _, runs = ray_wh.query("SELECT count(DISTINCT run_id) FROM trajectories")
    assert runs == [(1,)], "the workers wrote under the flow's run id"
