"""The streaming envs pipeline writes exactly the batch pipeline's records on the same inputs.

Both pipelines run the bundled sample source, once on the offline provider and once against the scripted
OpenAI-compatible endpoint over real HTTP (answers come back in whatever order the server finishes them,
so the streaming pipeline meets QAs in a different order than the batch one), each into its own
warehouse on the process sandbox; every record table must hold the same ids.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from arenaforge.schemas.config import load_config
from arenaforge.services.run_scope import open_run_scope
from arenaforge.testing.scripted_endpoint import ScriptedEndpoint
from arenaforge.tracks.envs.pipeline import EnvsSpec
from arenaforge.tracks.envs.stream import run_envs
from arenaforge.warehouse import Warehouse

TABLES = ["qa_instances", "qa_verifications", "environments", "env_merges", "distractor_sets", "rejections"]
ANSWER = """
from arenaforge.testing.envs_responder import EnvsResponder
answer = EnvsResponder()
"""


def _synthesize(db: Path, overrides: dict[str, object], spec: EnvsSpec) -> tuple[dict[str, list[str]], dict[str, int]]:
    cfg = load_config(None, overrides={"warehouse.path": str(db), "sandbox.backend": "process", **overrides})
    wh = Warehouse(db)

    async def go() -> dict[str, int]:
        async with open_run_scope(cfg, wh, "test") as run:
            return await run_envs(run, spec)

    counts = asyncio.run(go())
    return {t: [r[0] for r in wh.query(f"SELECT id FROM {t} ORDER BY id")[1]] for t in TABLES}, counts


def _both(tmp_path: Path, overrides: dict[str, object], **spec: object) -> None:
    batch, batch_counts = _synthesize(tmp_path / "batch.duckdb", overrides, EnvsSpec(pipeline="batch", **spec))
    stream, stream_counts = _synthesize(tmp_path / "stream.duckdb", overrides, EnvsSpec(pipeline="stream", **spec))
    assert batch["environments"] and batch["qa_verifications"], "the inputs go all the way through"
    assert stream == batch
    assert stream_counts == batch_counts


def test_stream_equals_batch_offline(tmp_path):
    _both(tmp_path, {"model.backend": "offline"}, sources=["sample"], n=24, seed=0, batch_size=7)


@pytest.mark.slow
def test_stream_equals_batch_against_an_http_endpoint(tmp_path):
    with ScriptedEndpoint(ANSWER, 0.01) as endpoint:
        overrides = {"model.backend": "openai", "model.base_url": endpoint.url, "model.model": "scripted",
                     "model.cache": False, "model.concurrency_initial": 16, "model.concurrency_max": 16,
                     "sandbox.process_allows_model_code": True}  # trusted: the scripted model writes our code
        _both(tmp_path, overrides, sources=["sample"], n=24, seed=0, batch_size=7)


def test_stream_refuses_the_percentile_rule():
    with pytest.raises(ValueError, match="threshold only"):
        EnvsSpec(pipeline="stream", keep_rule="percentile")


def test_with_merge_across_windows_write_in_order_when_a_later_one_finishes_first(tmp_path, monkeypatch):
    """A crash must leave the first windows written (a re-run's merge index takes up where they stopped; a later
    window's groups loaded without an earlier one's would place its members after them). Window 1's self-tests are
    held until another window's have run: window 2 is ready first, and still writes after window 1."""
    import arenaforge.tracks.envs.pipeline as pipeline
    from arenaforge.tracks.envs.stream import stream_envs

    spec = EnvsSpec(pipeline="stream", sources=["sample"], n=16, seed=7, batch_size=4, merge_across=True)
    cfg = load_config(None, overrides={"warehouse.path": str(tmp_path / "w.duckdb"), "sandbox.backend": "process",
                                       "model.backend": "offline"})
    first_window: set[str] = set()
    other_tested = asyncio.Event()
    real_self_test = pipeline.self_test

    async def held(pool, env, seed):
        if env.qa_id in first_window:
            await other_tested.wait()
        result = await real_self_test(pool, env, seed)
        if env.qa_id not in first_window:
            other_tested.set()
        return result

    async def go() -> list[int]:
        async with open_run_scope(cfg, Warehouse(tmp_path / "ids.duckdb"), "ids") as run:  # window 1's QA ids
            ids, _ = await pipeline.synthesize_qas(run, spec)
        first_window.update(ids[:4])
        monkeypatch.setattr(pipeline, "self_test", held)
        written: list[int] = []
        async with open_run_scope(cfg, Warehouse(tmp_path / "w.duckdb"), "test") as run:
            await stream_envs(run, spec, on_window=lambda number, _: written.append(number))
        return written

    written = asyncio.run(go())
    assert other_tested.is_set() and len(written) >= 3
    assert written == sorted(written), "each window is written after the ones before it"
