"""Flow `envs` end to end: `arenaforge envs synth` offline (sample + tau2 retail), show, export; openai over HTTP."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from typer.testing import CliRunner

from arenaforge.flows.cli import app
from arenaforge.schemas.kinds_envs import DistractorSet, EnvMerge, QAVerification
from arenaforge.schemas.models import Environment, QAInstance, Rejection
from arenaforge.warehouse import Warehouse
from tests.support.envs_fakes import EnvsResponder
from tests.support.harbor import ToolsService
from tests.support.requirements import SHARED_DATA

pytestmark = pytest.mark.prefect_server


def _invoke(*args: str):
    result = CliRunner().invoke(app, list(args), catch_exceptions=False, env={"COLUMNS": "200", "NO_COLOR": "1"})
    assert result.exit_code == 0, result.output
    return result.output


def _json(out: str) -> dict:
    """The JSON block a command prints first (a table of rejection reasons may follow)."""
    return json.JSONDecoder().raw_decode(out[out.index("{"):])[0]


def test_envs_synth_offline_show_and_export(prefect_server, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ARENAFORGE_SANDBOX__BACKEND", "process")
    db = str(tmp_path / "w.duckdb")
    sources = ["--source", "sample"]
    if SHARED_DATA.is_dir():  # always in CI
        sources += ["--source", "tau2_retail", "--shared-data", str(SHARED_DATA)]
    out = _invoke("--db", db, "envs", "synth", *sources, "--n", "8", "--max-hops", "3", "--seed", "1")
    counts = _json(out)
    wh = Warehouse(db)
    envs = wh.load(Environment)
    assert counts["environments"] == len(envs) > 0
    assert all(e.verification and e.verification.passed and e.verification.checks["self_test_gold_f1"] for e in envs)
    by_source = {e.name.rsplit("-", 1)[0] for e in envs}
    assert "sample_shop" in by_source and (not SHARED_DATA.is_dir() or "tau2_retail" in by_source)
    assert all(e.distractors for e in envs)
    qas = wh.load(QAInstance)
    assert {q.structure for q in qas} == {"single_hop", "parallel_single_hop", "multi_hop", "parallel_multi_hop"}
    assert len(wh.load(QAVerification)) == len(qas)
    assert len(wh.load(DistractorSet)) == len(envs)
    assert wh.load(EnvMerge)  # equivalent tools were found
    assert all(e.run_id for e in envs) and all(e.parents == [e.qa_id] for e in envs)
    _, runs = wh.query("SELECT status FROM v_runs WHERE flow = 'envs'")
    assert runs == [("completed",)]
    if SHARED_DATA.is_dir():  # tau2's NULL-heavy columns are rejected rows, not silent drops
        assert any(r.reason == "null_heavy_column" for r in wh.load(Rejection))

    shown = _invoke("--db", db, "envs", "show", envs[0].id)
    assert envs[0].tools[0].name in shown and "QA graph" in shown and "self_test_gold_f1" in shown and "def " in shown

    out = _invoke("--db", db, "envs", "export", "--out", str(tmp_path / "exp"))
    written = _json(out)
    verl = written["verl"]
    assert verl["train_rows"] + verl["val_rows"] == len(envs) and verl["val_rows"] >= 1
    assert pl.read_parquet(Path(verl["dir"]) / "train.parquet").height == verl["train_rows"]
    assert len((tmp_path / "exp" / "environments.jsonl").read_text().splitlines()) == len(envs)
    task = Path(written["harbor"]) / envs[0].name
    assert "FROM ${BASE_IMAGE}" in (task / "environment" / "Dockerfile").read_text()
    bin_dir = tmp_path / "bin"  # what the task's image installs
    bin_dir.mkdir()
    (bin_dir / "call-tool").symlink_to(task / "environment" / "call_tool.py")
    service = ToolsService(task / "environment" / "tools")
    try:
        run_env = {**os.environ, "TOOLS_URL": service.url, "LOGS_DIR": str(tmp_path / "logs"),
                   "PATH": f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin"}
        for script in ("solution/solve.sh", "tests/test.sh"):
            subprocess.run(["sh", str(task / script)], env=run_env, check=True, capture_output=True, timeout=60)
    finally:
        service.stop()
    assert json.loads((tmp_path / "logs" / "verifier" / "reward.json").read_text())["reward"] == 1.0


def test_envs_flow_over_openai(prefect_server, scripted_openai, tmp_path: Path) -> None:
    from arenaforge.flows.envs_flows import EnvsParams, envs

    scripted_openai.responder = EnvsResponder(not_json_variants=(4,))  # one answer is prose, never JSON
    db = tmp_path / "o.duckdb"
    params = EnvsParams(
        sources=["sample"], n=5, seed=0,
        overrides={"warehouse.path": str(db), "model.backend": "openai", "model.base_url": scripted_openai.url,
                   "model.model": "scripted", "model.max_retries": 1, "model.backoff_base_s": 0.01,
                   "sandbox.backend": "process", "sandbox.process_allows_model_code": True})
    counts = asyncio.run(envs(params))
    wh = Warehouse(db)
    envs_out = wh.load(Environment)
    assert counts["environments"] == len(envs_out) == 4  # the flow carried on past the bad answer
    bad = [r for r in wh.load(Rejection) if r.reason == "invalid_model_output"]
    assert len(bad) == 1 and bad[0].stage == "decompose_qa" and bad[0].run_id
    assert all(e.verification.passed for e in envs_out)
    steps = {r["response_format"]["json_schema"]["name"] for r in scripted_openai.chat_requests()}
    assert {"envs_decompose", "envs_verify_qa", "envs_tool_doc", "envs_augment_tool", "envs_implement_tool"} <= steps
    assert all(v.verifier == "model" for v in wh.load(QAVerification))
    _, usage = wh.query("SELECT count(*) FROM llm_calls")
    assert usage[0][0] >= 4 * 4
