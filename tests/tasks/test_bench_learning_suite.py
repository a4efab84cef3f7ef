"""`arenaforge bench learning --suite NAME --suite-db WAREHOUSE` (issue 15): each stage's policy is also evaluated on
an imported suite, with the suite's own metric beside our F1 (here: a user's class imported into its own warehouse,
evaluated with the tiny model); a --suite without a warehouse is refused before any training."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from arenaforge.benchmarks.learning import evaluate_suite, main
from arenaforge.environments.runtime import create_pool
from arenaforge.schemas.config import SandboxConfig, load_config
from arenaforge.schemas.errors import InputError
from arenaforge.schemas.kinds_training import EvalRun
from arenaforge.warehouse import Warehouse
from tests.support.rl import tiny_model_path


def test_stages_are_evaluated_on_an_imported_suite(tmp_path: Path) -> None:
    from arenaforge.tracks.envs.import_python import import_environment, python_environment, read_calls, read_source
    from tests.tasks.envs.test_import_python import BANK, CALLS, STATE

    (tmp_path / "bank.py").write_text(BANK)
    (tmp_path / "calls.json").write_text(json.dumps(CALLS))
    sources = [read_source(f"{tmp_path / 'bank.py'}:Bank")]
    draft = python_environment(sources, initial_state=STATE, calls=read_calls(tmp_path / "calls.json"),
                               init_args={"fee": 1.5}, question="Pay the rent from A1 to A2 and tell me A1's balance.")

    async def imported():
        async with await create_pool(SandboxConfig(backend="process", pool_size=1)) as pool:
            return await import_environment(pool, draft, "my-bank", sources)

    suite_db = tmp_path / "suite.duckdb"
    Warehouse(suite_db).upsert([asyncio.run(imported())])
    learning_db = tmp_path / "learning.duckdb"
    cfg = load_config(None, overrides={"warehouse.path": str(learning_db), "sandbox.backend": "process"})
    wh = Warehouse(learning_db)
    out = asyncio.run(evaluate_suite(cfg, wh, {"untrained": str(tiny_model_path())}, "my-bank", str(suite_db)))
    assert out["suite"] == "my-bank" and out["environments"] == 1
    assert out["untrained"]["episodes"] == 1 and out["untrained"]["native"] in (0.0, 1.0)
    (stored,) = wh.load(EvalRun)
    assert stored.suite == "my-bank" and stored.native == out["untrained"]["native"] and stored.label == "untrained on my-bank"
    assert asyncio.run(evaluate_suite(cfg, wh, {}, "nobody", str(suite_db))) == {
        "skipped": f"no environments of suite 'nobody' in {suite_db}"}


def test_a_suite_without_its_warehouse_is_refused_before_training(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="--suite needs --suite-db"):
        asyncio.run(main(out=str(tmp_path / "bench"), suite="my-bank"))
    assert not (tmp_path / "bench").exists()
