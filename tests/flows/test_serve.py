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


def _docs_schedules() -> dict[str, dict[str, Any]]:
    """`[prefect.schedules]` as docs/UI.md's "Schedule the synthesis flows" writes it."""
    import re
    import tomllib

    from tests.support.requirements import REPO

    section = (REPO / "docs" / "UI.md").read_text().split("## Schedule the synthesis flows", 1)[1]
    (block,) = re.findall(r"```toml\n(.*?)```", section.split("\n## ", 1)[0], re.S)
    return tomllib.loads(block)["prefect"]["schedules"]


def test_every_deployment_runs_with_its_defaults_when_given_no_parameters() -> None:
    """What a schedule without `parameters` and the UI's Quick run send: nothing; every flow binds it to its
    defaults."""
    from arenaforge.flows.deployments import params_model
    from arenaforge.flows.registry import FLOWS, load_flow

    for name in FLOWS:
        flow = load_flow(name)
        pname, model = params_model(flow)
        bound = flow.validate_parameters({})
        assert bound[pname] == model(), name
        assert flow.validate_parameters({pname: {}})[pname] == model(), name


def test_schedule_parameters_the_form_does_not_have_are_refused_in_one_line(served: Any) -> None:
    from arenaforge.flows.deployments import apply_deployments
    from arenaforge.schemas.errors import ConfigError

    cases = [({"params": {"n_chains": 200}}, "prefect.schedules.sft.parameters: params has no field 'n_chains'"),
             ({"n_chains": 200}, "prefect.schedules.sft.parameters: expected { params = { ... } }"),
             ({"params": {"batch_size": 0}}, "prefect.schedules.sft.parameters: params.batch_size: Input should be "
                                             "greater than or equal to 1 (got 0)")]
    for parameters, message in cases:
        cfg = served.cfg.model_copy(update={"prefect": served.cfg.prefect.model_copy(
            update={"schedules": {"sft": {"interval_s": 3600, "active": False, "parameters": parameters}}})})
        with pytest.raises(ConfigError) as err:
            apply_deployments(cfg, {"sft": "arenaforge.flows.sft_flows:sft"}, working_dir=served.project_dir())
        assert str(err.value).startswith(message), str(err.value)


@pytest.mark.slow
@pytest.mark.timeout(1000)  # three real flows at once on a loaded machine; the waits below are the bounds
def test_the_docs_schedule_examples_complete_runs_with_parameters_given_absent_and_empty(served: Any) -> None:
    """docs/UI.md's examples as they are, on the real `sft` and `envs` flows, the server's scheduler and the worker;
    only their timing is made 30 seconds (and switched on). `envs` as written has no `parameters`; the same with
    `parameters = {}`. Each deployment's schedule is paused once the worker has picked up its first run (pausing
    deletes the runs still scheduled, which would include a first run not yet picked up), so each flow runs once."""
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterState, FlowRunFilterStateType
    from prefect.client.schemas.objects import StateType

    from arenaforge.flows.deployments import apply_deployments
    from arenaforge.flows.registry import FLOWS

    docs = _docs_schedules()
    assert "parameters" in docs["sft"] and "parameters" not in docs["envs"], docs  # given / absent, as the test says
    # 30 s apart: the worker (prefetching 10 s ahead) picks up one run per deployment before the test pauses it
    now = {"interval_s": 30}
    cases = {  # deployment -> (registry entry, schedule, the parameters its runs must carry)
        "docs-sft": ("sft", {**_timing_replaced(docs["sft"]), **now}, docs["sft"]["parameters"]),
        "docs-envs": ("envs", {**_timing_replaced(docs["envs"]), **now}, {}),
        "docs-envs-empty": ("envs", {**_timing_replaced(docs["envs"]), **now, "parameters": {}}, {}),
    }
    applied: dict[str, Any] = {}
    with served.client_settings(), _client(served) as client:
        try:
            for name, (flow, schedule, _) in cases.items():
                cfg = served.cfg.model_copy(update={"prefect": served.cfg.prefect.model_copy(
                    update={"schedules": {name: schedule}})})
                apply_deployments(cfg, {name: FLOWS[flow]}, env=served._flow_run_env(),
                                  working_dir=served.project_dir())
                applied[name] = client.read_deployment_by_name(f"{flow}/{name}")
            for name, deployment in applied.items():
                picked = _wait_runs(client, deployment.id,
                                    lambda r: r.auto_scheduled and r.state and r.state.type != StateType.SCHEDULED,
                                    f"{name}: scheduled run picked up by the worker")
                first = min(picked, key=lambda r: r.expected_start_time)
                (sched,) = client.read_deployment_schedules(deployment.id)
                client.update_deployment_schedule(deployment.id, sched.id, active=False)
                queued = client.read_flow_runs(flow_run_filter=FlowRunFilter(state=FlowRunFilterState(
                    type=FlowRunFilterStateType(any_=[StateType.SCHEDULED]))))
                for run in queued:
                    if run.deployment_id == deployment.id and run.id != first.id:
                        client.delete_flow_run(run.id)
            for name, deployment in applied.items():
                done = _wait_runs(client, deployment.id, lambda r: r.auto_scheduled and r.state and r.state.is_final(),
                                  f"{name}: finished scheduled run", timeout_s=900)
                assert done[0].state.is_completed(), f"{name}: {done[0].state}"
                assert done[0].parameters == cases[name][2], name
        finally:
            for deployment in applied.values():
                client.delete_deployment(deployment.id)
    _, rows = served.warehouse.query("SELECT flow, count(*) FROM v_runs WHERE status = 'completed' "
                                     "AND flow IN ('sft', 'envs') GROUP BY 1 ORDER BY 1")
    counts = dict(rows)
    assert counts.get("envs", 0) >= 2 and counts.get("sft", 0) >= 1, rows
    assert served.warehouse.count("environments") > 0  # the envs runs, on their defaults, made environments


def _timing_replaced(schedule: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in schedule.items() if k not in ("cron", "interval_s", "timezone", "active")}


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


def test_serve_ls_prints_json(served: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    import json

    from arenaforge.flows.cli import app

    monkeypatch.setenv("ARENAFORGE_PREFECT__API_URL", served.api_url)
    listed = CliRunner().invoke(app, ["serve", "ls", "--format", "json"])
    assert listed.exit_code == 0, listed.output
    rows = {row["deployment"]: row for row in json.loads(listed.output)}
    assert set(served_flows()) <= set(rows)
    assert rows["probe"] == {"deployment": "probe", "flow": "serve-probe", "work pool": "arenaforge-test",
                             "schedules": "paused 1:00:00"}


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
