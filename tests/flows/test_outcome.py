"""Every command says what went wrong, on screen, at 80 columns: the top rejection reasons after ingest
and synth, a non-zero exit when nothing was produced (3 when a service it needs failed), the full
detail never cut; and the warehouse side of it: views keep full text, typed run timestamps, row
totals in `db show`, comments on tables and columns."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

from arenaforge.warehouse import Warehouse

pytestmark = pytest.mark.prefect_server


def cli(*args: str, cwd: Path, env: dict | None = None) -> subprocess.CompletedProcess:
    full = {**os.environ, "NO_COLOR": "1", "COLUMNS": "80", "ARENAFORGE_SANDBOX__BACKEND": "process", **(env or {})}
    return subprocess.run([sys.executable, "-m", "arenaforge.flows.cli", *args], cwd=cwd, env=full,
                          capture_output=True, text=True, timeout=600)


def _flat(text: str) -> str:
    """Screen text without whitespace and table borders: what a cell says, however it was wrapped."""
    return re.sub(r"[\s│┃]", "", text)


def _fits_80(text: str) -> None:
    wide = [line for line in text.splitlines() if len(line) > 80]
    assert not wide, wide


def test_ingest_of_a_missing_path_names_it_and_exits_2(prefect_server, tmp_path: Path) -> None:
    res = cli("--db", "w.duckdb", "ingest", "no-such-tools", cwd=tmp_path)
    assert res.returncode == 2, res.stdout + res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "ingest: no tools" in errors[0] and str(tmp_path / "no-such-tools") in errors[0]
    assert "ingest/missing_path" in res.stdout and str(tmp_path / "no-such-tools") in _flat(res.stdout)
    _fits_80(res.stdout)
    _, runs = Warehouse(tmp_path / "w.duckdb").query("SELECT status, error FROM v_runs WHERE flow = 'ingest'")
    assert runs[0][0] == "failed" and "no tools" in runs[0][1]


def test_a_malformed_tool_file_is_reported_with_its_reason(prefect_server, tmp_path: Path) -> None:
    (tmp_path / "tools.json").write_text('{"type": "function", "function": {"name": "x", ')
    res = cli("--db", "w.duckdb", "ingest", "tools.json", cwd=tmp_path)
    assert res.returncode == 2, res.stdout + res.stderr
    assert "ingest/malformed_json" in res.stdout and "all 1 inputs refused" in res.stderr
    _fits_80(res.stdout)


def test_partial_ingest_exits_0_and_lists_the_top_reasons(prefect_server, tmp_path: Path) -> None:
    sample = str(resources.files("arenaforge.data").joinpath("sample_tools"))
    res = cli("--db", "w.duckdb", "ingest", sample, cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    counts = json.JSONDecoder().raw_decode(res.stdout[res.stdout.index("{"):])[0]
    assert counts["tools"] > 0 and counts["rejections"] > 0
    assert f"ingest: {counts['rejections']} rejected, top reasons" in res.stdout
    assert f"all: arenaforge db show rejections --run {counts['run_id']}" in res.stdout
    _fits_80(res.stdout)


def test_envs_synth_against_a_dead_endpoint_exits_3(prefect_server, tmp_path: Path) -> None:
    res = cli("--db", "w.duckdb", "--backend", "openai", "--base-url", "http://127.0.0.1:9/v1", "--model", "m",
              "envs", "synth", "--n", "2", cwd=tmp_path,
              env={"ARENAFORGE_MODEL__MAX_RETRIES": "0", "ARENAFORGE_MODEL__CACHE": "false"})
    assert res.returncode == 3, res.stdout + res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "envs: no environments" in errors[0] and "failures of what it depends on" in errors[0]
    assert "provider_error(provider_unreachable)" in _flat(res.stdout), res.stdout  # the typed failure kind
    assert "127.0.0.1:9" in _flat(res.stdout)  # the detail, not cut
    _fits_80(res.stdout)


def test_views_keep_full_text_and_db_show_counts_rows(tmp_path: Path) -> None:
    from arenaforge.schemas.models import Environment, FunctionDoc, GoldCall, Verification
    from arenaforge.warehouse import recorded_run

    question = "Which of the " + "very " * 30 + "long-named stores ships to Oslo?"
    wh = Warehouse(tmp_path / "w.duckdb")
    with recorded_run(wh, "envs", {}) as (run, counts):
        counts["environments"] = wh.upsert([Environment(
            name=f"long-{i}", tools=[FunctionDoc(name="f")], code="def f(): return 1\n", question=question + str(i),
            calls=[GoldCall(tool="f", arguments={})], verification=Verification(passed=True, checks={}), run_id=run.id)
            for i in range(3)])
    _, rows = wh.query("SELECT question FROM v_environments ORDER BY name")
    assert [r[0] for r in rows] == [question + str(i) for i in range(3)]  # the view does not cut
    _, typed = wh.query("SELECT typeof(started_at), typeof(finished_at), duration_s >= 0 FROM v_runs")
    assert typed == [("TIMESTAMP WITH TIME ZONE", "TIMESTAMP WITH TIME ZONE", True)]
    _, cols = wh.query("SELECT column_name FROM duckdb_columns() WHERE table_name = 'v_train_steps'")
    assert {"skipped", "groups_used", "grad_norm"} <= {c for (c,) in cols}

    shown = cli("--db", "w.duckdb", "db", "show", "environments", "--limit", "2", cwd=tmp_path)
    assert shown.returncode == 0 and "v_environments: 2 of 3 rows; --limit N shows more" in shown.stdout, shown.stdout
    tables = cli("--db", "w.duckdb", "db", "tables", cwd=tmp_path, env={"COLUMNS": "160"})
    assert "Executable RL environments" in tables.stdout and "v_graph_edges" in tables.stdout
    described = cli("--db", "w.duckdb", "db", "describe", "v_train_steps", cwd=tmp_path, env={"COLUMNS": "200"})
    assert described.returncode == 0 and "did not update the policy" in described.stdout


def test_outcome_rule_is_one_function() -> None:
    """The exit rule in one place: infrastructure first, then refused input, nothing when something was made."""
    from arenaforge.flows.outcome import InfrastructureFailed, NothingProduced, Outcome, check, is_infrastructure
    from arenaforge.warehouse.reports import ReasonCount

    infra = ReasonCount("decompose_qa", "provider_error", "provider_unreachable", 4, "s", "refused")
    data = ReasonCount("verify_qa", "low_quality", "quality_rejection", 2, "q", "qs 0.2")
    model = ReasonCount("decompose_qa", "invalid_model_output", "invalid_output", 1, "q", "not JSON")
    assert is_infrastructure(infra) and not is_infrastructure(data) and not is_infrastructure(model)
    with pytest.raises(InfrastructureFailed, match="4 of 6 rejections are failures of what it depends on") as err:
        check(Outcome("envs", "run-1", 0, "environments", [infra, data], 6))
    assert err.value.exit_code == 3
    with pytest.raises(NothingProduced, match="all 2 inputs refused") as err:
        check(Outcome("envs", "run-1", 0, "environments", [data], 2))
    assert err.value.exit_code == 2
    assert check(Outcome("envs", "run-1", 1, "environments", [infra], 4)) is None
    assert check(Outcome("envs", "run-1", 0, "environments", [], 0)) is None
