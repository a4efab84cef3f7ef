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


def test_distractors_option_reads_both_forms_onto_the_spec_defaults() -> None:
    from arenaforge.flows.commands.envs import SYNTH_OPTIONS
    from arenaforge.schemas.errors import InputError

    def distractor_fields(text: str) -> dict[str, int]:
        return SYNTH_OPTIONS._grouped_fields("distractors", text)

    fields = {"distractors_high": 2, "distractors_medium": 0, "distractors_low": 1}
    assert distractor_fields("high=2,medium=0,low=1") == fields == distractor_fields("2,0,1")
    assert distractor_fields("high=2") == {**fields, "distractors_medium": 1}  # EnvsSpec's default for the others
    assert SYNTH_OPTIONS._grouped_default("distractors") == "1,1,1"
    for bad in ("top=1", "1,x,2", "1,2"):
        with pytest.raises(InputError, match="use high,medium,low counts like 1,1,1"):
            distractor_fields(bad)


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
    service = ToolsService(task / "environment" / "tools", tmp_path / "tools-fs" / "calls.jsonl")
    try:  # the verifier reads the tools service's call log (what Harbor collects from it)
        run_env = {**os.environ, "TOOLS_URL": service.url, "LOGS_DIR": str(tmp_path / "logs"),
                   "CALL_LOG": str(service.call_log),
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


def test_envs_flow_over_three_replicas_one_killed_matches_one_endpoint(prefect_server, tmp_path: Path) -> None:
    """The same inputs over one endpoint and over three replicas, one SIGKILLed-like (connections cut) mid-run:
    the same records, ids included, and one usage row per request (nothing lost, nothing counted twice)."""
    import threading

    from arenaforge.flows.envs_flows import EnvsParams, envs
    from arenaforge.testing.scripted_openai import Reply, ScriptedOpenAI

    def run(urls: list[str], db: Path) -> Warehouse:
        params = EnvsParams(
            sources=["sample"], n=5, seed=0,
            overrides={"warehouse.path": str(db), "model.backend": "openai", "model.endpoints": urls,
                       "model.model": "scripted", "model.max_retries": 1, "model.backoff_base_s": 0.01,
                       "sandbox.backend": "process", "sandbox.process_allows_model_code": True})
        asyncio.run(envs(params))
        return Warehouse(db)

    started = []
    try:
        for _ in range(4):
            server = ScriptedOpenAI()
            server.responder = EnvsResponder()
            server.start()
            started.append(server)
        single, victim, a, b = started
        hold = threading.Event()
        answer = EnvsResponder()

        def held_after_three(req: dict) -> Reply:
            if len(victim.chat_requests()) <= 3:
                return answer(req)
            hold.set()
            return Reply(body=answer(req).body, delay_s=600)  # cut by the kill long before it is sent

        victim.responder = held_after_three
        killer = threading.Thread(target=lambda: hold.wait(300) and victim.kill())
        killer.start()
        one = run([single.url], tmp_path / "one.duckdb")
        pooled = run([victim.url, a.url, b.url], tmp_path / "pool.duckdb")
        killer.join()
    finally:
        for server in started:
            server.stop()
    assert hold.is_set(), "the replica was killed with a request in flight"
    for kind in (Environment, QAInstance, QAVerification, Rejection):
        assert sorted(r.id for r in pooled.load(kind)) == sorted(r.id for r in one.load(kind)), kind.__name__
    assert len(one.load(Environment)) == 5
    # a step asking the same thing twice at once gets one answer sent and one cached, or two sent, by timing (either
    # endpoint count): compare the requests the steps made (one row each) and the distinct answers, not the split
    usage = ("SELECT count(*), count(DISTINCT key), count(*) FILTER (WHERE cost_class = 'failed'), "
             "count(*) FILTER (WHERE cost_class = 'sent') FROM llm_calls")
    assert pooled.query(usage)[1][0][:3] == one.query(usage)[1][0][:3], "one usage row per request, none failed"
    assert one.query(usage)[1][0][2] == 0 and one.query(usage)[1][0][3] == len(single.chat_requests())
