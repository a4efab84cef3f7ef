"""With every model request failing, synthesis ends Failed, exits 3 and says why, within the retry budget.

A dead endpoint (nothing listens) and a server that answers every request with HTTP 500, for `envs synth`
and `sft synth` run as a user runs them. Nothing is produced, the run is `failed` in the warehouse, the
screen names the typed failure kind and the endpoint, and no request spent more than its retry budget:
a 500 is not retried, a dead endpoint is taken for dead after its retries.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib import resources
from pathlib import Path

import pytest

from arenaforge.testing.scripted_openai import Reply
from arenaforge.warehouse import Warehouse

pytestmark = pytest.mark.prefect_server
BUDGET = {"ARENAFORGE_MODEL__MAX_RETRIES": "3", "ARENAFORGE_MODEL__BACKOFF_BASE_S": "0.2",
          "ARENAFORGE_MODEL__BACKOFF_MAX_S": "1", "ARENAFORGE_MODEL__RETRY_BUDGET_S": "4",
          "ARENAFORGE_MODEL__CACHE": "false", "ARENAFORGE_SANDBOX__BACKEND": "process",
          "ARENAFORGE_SANDBOX__PROCESS_ALLOWS_MODEL_CODE": "true"}


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "80", **BUDGET}
    return subprocess.run([sys.executable, "-m", "arenaforge.flows.cli", "--db", "w.duckdb", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=900)


def _prepare_sft(cwd: Path) -> None:
    sample = str(resources.files("arenaforge.data").joinpath("sample_tools"))
    assert cli("ingest", sample, cwd=cwd).returncode == 0
    assert cli("--backend", "offline", "graph", "build", cwd=cwd).returncode == 0


@pytest.mark.parametrize("command", ["envs", "sft"])
@pytest.mark.parametrize("endpoint", ["dead", "http_500"])
def test_synthesis_with_every_request_failing_exits_3_and_says_why(prefect_server, scripted_openai, tmp_path: Path,
                                                                    command: str, endpoint: str) -> None:
    if endpoint == "dead":
        url, kind = "http://127.0.0.1:9/v1", "provider_unreachable"
    else:
        scripted_openai.responder = lambda req: Reply(status=500, body={"error": {"message": "CUDA out of memory"}})
        url, kind = scripted_openai.url, "provider_failed"
    if command == "sft":
        _prepare_sft(tmp_path)
    args = ["envs", "synth", "--n", "3"] if command == "envs" else ["sft", "synth"]
    res = cli("--backend", "openai", "--base-url", url, "--model", "m", *args, cwd=tmp_path)
    screen = re.sub(r"[\s│┃]", "", res.stdout)
    assert res.returncode == 3, res.stdout + res.stderr
    errors = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "failures of what it depends on" in errors[0], res.stderr
    assert kind in screen and url.split("//")[1].split("/")[0] in screen, res.stdout
    if endpoint == "http_500":
        assert "CUDAoutofmemory" in screen, "the server's own words reach the screen"
    wh = Warehouse(tmp_path / "w.duckdb")
    _, runs = wh.query("SELECT status FROM v_runs WHERE flow = ?", [command])
    assert runs == [("failed",)]
    _, calls = wh.query("SELECT count(*), max(attempts), max(latency_s), count(*) FILTER (WHERE cost_class <> 'failed') "
                        "FROM llm_calls")
    requests, attempts, slowest, not_failed = calls[0]
    assert requests > 0 and not_failed == 0
    assert slowest < float(BUDGET["ARENAFORGE_MODEL__RETRY_BUDGET_S"]) + 2, "no request outlives its retry budget"
    if endpoint == "http_500":
        assert attempts == 1 and len(scripted_openai.chat_requests()) == requests, "a 500 is not retried"
    produced = "environments" if command == "envs" else "trajectories"
    assert wh.count(produced) == 0
