"""`arenaforge serve`: deployments with typed forms and schedules, limits, CLI runs, bad input, killed runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from typing import Any

import pytest
from typer.testing import CliRunner

from tests.support.served import served_flows

pytestmark = pytest.mark.prefect_server


def _client(stack: Any) -> Any:
    from prefect.client.orchestration import get_client

    return get_client(sync_client=True)


def _wait_state(stack: Any, flow_run_id: Any, done: tuple[str, ...], timeout_s: float = 120) -> Any:
    deadline = time.monotonic() + timeout_s
    with stack.client_settings(), _client(stack) as client:
        while True:
            run = client.read_flow_run(flow_run_id)
            if run.state and run.state.type.value in done:
                return run
            assert time.monotonic() < deadline, f"flow run stuck in {run.state}"
            time.sleep(0.5)  # polling the run's state with a deadline


def _probe_rows(stack: Any, tag: str) -> list[tuple]:
    _, rows = stack.warehouse.query(
        "SELECT record->>'subject' AS s, count(*) FROM rejections WHERE record->>'subject' LIKE ? GROUP BY 1 ORDER BY 1",
        [f"{tag}-%"],
    )
    return rows


def test_every_flow_has_a_deployment_with_a_typed_form(served: Any) -> None:
    with served.client_settings(), _client(served) as client:
        deployments = {d.name: d for d in client.read_deployments()}
        pool = client.read_work_pool("arenaforge-test")
    assert pool.type == "process"
    assert set(served_flows()) <= set(deployments)
    for name in served_flows():
        d = deployments[name]
        assert d.work_pool_name == "arenaforge-test"
        assert d.enforce_parameter_schema
        schema = d.parameter_openapi_schema
        assert schema["properties"], f"{name}: no parameters in the UI form"
    probe = deployments["probe"].parameter_openapi_schema
    model = probe["definitions"]["ProbeParams"]["properties"]
    assert model["n"]["default"] == 5 and model["n"]["description"] == "Rows to write."
    assert model["n"]["type"] == "integer" and model["n"]["maximum"] == 10_000


def test_concurrency_limits_exist(served: Any) -> None:
    with served.client_settings(), _client(served) as client:
        limits = {c.name: c.limit for c in client.read_global_concurrency_limits(limit=100)}
    assert limits["model-endpoint"] == 16 and limits["sandbox"] == 8
    assert limits["tag:model-endpoint"] == 16 and limits["tag:sandbox"] == 8


def test_schedule_from_config_can_be_paused_and_resumed(served: Any) -> None:
    with served.client_settings(), _client(served) as client:
        deployment = client.read_deployment_by_name(served.deployments["probe"])
        (sched,) = deployment.schedules
        assert sched.schedule.interval.total_seconds() == 3600
        assert sched.active is False and sched.parameters == {"params": {"tag": "scheduled", "n": 2}}
        client.update_deployment_schedule(deployment.id, sched.id, active=True)  # what the UI toggle does
        assert client.read_deployment_schedules(deployment.id)[0].active is True
        client.update_deployment_schedule(deployment.id, sched.id, active=False)
        assert client.read_deployment_schedules(deployment.id)[0].active is False


def _deployment_runs(client: Any, deployment_id: Any) -> list[Any]:
    from prefect.client.schemas.filters import DeploymentFilter, DeploymentFilterId

    return client.read_flow_runs(deployment_filter=DeploymentFilter(id=DeploymentFilterId(any_=[deployment_id])))


def _wait_runs(client: Any, deployment_id: Any, done: Any, what: str, timeout_s: float = 240) -> list[Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        runs = [r for r in _deployment_runs(client, deployment_id) if done(r)]
        if runs:
            return runs
        assert time.monotonic() < deadline, f"no {what} within {timeout_s:.0f}s"
        time.sleep(0.5)  # polling the API with a deadline


def test_a_schedule_creates_and_completes_runs_and_a_paused_one_does_not(served: Any, prefect_server: Any) -> None:
    """What `[prefect.schedules]` promises, on the real server's scheduler and the real worker."""
    from arenaforge.flows.deployments import apply_deployments

    probe = served_flows()["probe"]
    schedules = {
        "probe-paused": {"interval_s": 3, "active": False, "parameters": {"params": {"tag": "sched-off", "n": 1}}},
        "probe-every-3s": {"interval_s": 3, "parameters": {"params": {"tag": "sched-on", "n": 1}}},
    }
    applied = {}
    with served.client_settings(), _client(served) as client:
        try:
            for name in schedules:  # the paused one first: any scheduler pass that sees the active one saw it too
                cfg = served.cfg.model_copy(update={"prefect": served.cfg.prefect.model_copy(
                    update={"schedules": {name: schedules[name]}})})
                apply_deployments(cfg, {name: probe}, env=served._flow_run_env(), working_dir=served.project_dir())
                applied[name] = client.read_deployment_by_name(f"serve-probe/{name}")
            on, off = applied["probe-every-3s"], applied["probe-paused"]

            completed = _wait_runs(client, on.id, lambda r: r.state and r.state.is_completed(), "completed scheduled run")
            assert all(r.auto_scheduled for r in completed)
            assert completed[0].parameters == {"params": {"tag": "sched-on", "n": 1}}
            assert _probe_rows(served, "sched-on")[0] == ("sched-on-0", 1)  # the run did its work
            assert _deployment_runs(client, off.id) == [], "a paused schedule created runs"

            # the UI's toggle: resumed, the paused schedule starts creating runs
            (sched,) = client.read_deployment_schedules(off.id)
            client.update_deployment_schedule(off.id, sched.id, active=True)
            created = _wait_runs(client, off.id, lambda r: r.auto_scheduled, "run after resuming")
            assert created[0].parameters == {"params": {"tag": "sched-off", "n": 1}}
        finally:
            for deployment in applied.values():  # stop the schedules (and drop their future runs)
                client.delete_deployment(deployment.id)
    log = (prefect_server.home / "server.log").read_text()
    assert "Can't evaluate bulk DML" not in log
    assert not [line for line in log.splitlines() if "ERROR" in line and "schedule" in line], log[-3000:]


def test_bad_schedule_config_is_one_line() -> None:
    from arenaforge.flows.deployments import build_schedules
    from arenaforge.schemas.errors import ConfigError

    with pytest.raises(ConfigError, match="exactly one of cron"):
        build_schedules("ingest", {"cron": "0 * * * *", "interval_s": 5})
    with pytest.raises(ConfigError, match="unknown keys"):
        build_schedules("ingest", {"every": 5})
    (cron,) = build_schedules("ingest", {"cron": "0 3 * * *", "timezone": "UTC", "parameters": {"a": 1}})
    assert cron.cron == "0 3 * * *" and cron.parameters == {"a": 1}


def test_cli_run_validates_params_and_completes(served: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    from arenaforge.flows.cli import app
    from arenaforge.flows.registry import FLOWS

    monkeypatch.setitem(FLOWS, "probe", served_flows()["probe"])
    monkeypatch.setenv("ARENAFORGE_PREFECT__API_URL", served.api_url)
    runner = CliRunner()
    bad = runner.invoke(app, ["serve", "run", "probe", "--param", "n=lots"])
    assert bad.exit_code != 0 and "n: Input should be a valid integer" in str(bad.exception)
    ok = runner.invoke(app, ["serve", "run", "probe", "--param", "tag=cli", "--param", "n=3", "--wait"])
    assert ok.exit_code == 0, ok.output
    assert "Completed" in ok.output
    assert _probe_rows(served, "cli") == [("cli-0", 1), ("cli-1", 1), ("cli-2", 1)]


def test_server_rejects_wrong_types_before_running(served: Any) -> None:
    """What a wrong value in the UI form hits: the server's schema check; no run is created."""
    with served.client_settings(), _client(served) as client:
        deployment = client.read_deployment_by_name(served.deployments["probe"])
        with pytest.raises(Exception, match="Validation failed") as err:
            client.create_flow_run_from_deployment(deployment.id, parameters={"params": {"n": "many"}})
        assert "n" in str(err.value)


def test_run_while_server_down_is_one_clear_line(tmp_path: Any) -> None:
    env = {**os.environ, "ARENAFORGE_PREFECT__API_URL": "http://127.0.0.1:9/api", "ARENAFORGE_DB": str(tmp_path / "x.duckdb")}
    proc = subprocess.run(
        [sys.executable, "-m", "arenaforge.flows.cli", "serve", "run", "train-sft", "--param", "max_steps=2"],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "does not answer; start it with `arenaforge serve`" in lines[0], proc.stderr


def test_killed_run_reruns_to_completion_without_duplicates(served: Any) -> None:
    """SIGKILL the flow-run process mid-way; a re-run completes; content ids keep every row once."""
    from arenaforge.flows.deployments import start_run

    flows = served_flows()
    params = {"tag": "killed", "n": 40, "batch": 4, "pause_s": 0.4}
    first = start_run(served.api_url, "probe", params, flows=flows, wait_s=0)
    deadline = time.monotonic() + 120
    while not _probe_rows(served, "killed"):  # wait until it is mid-way, then kill it
        assert time.monotonic() < deadline, "first run never wrote"
        time.sleep(0.2)
    with served.client_settings(), _client(served) as client:
        pid = int(str(client.read_flow_run(first.id).infrastructure_pid).rsplit(":", 1)[-1])
    os.kill(pid, signal.SIGKILL)
    killed = _wait_state(served, first.id, ("CRASHED", "FAILED", "CANCELLED"))
    partial = _probe_rows(served, "killed")
    assert 0 < len(partial) < 40, f"{killed.state}: {len(partial)} rows"
    again = start_run(served.api_url, "probe", params | {"pause_s": 0}, flows=flows, wait_s=None)
    assert again.state.is_completed()
    rows = _probe_rows(served, "killed")
    assert len(rows) == 40 and all(n == 1 for _, n in rows)
