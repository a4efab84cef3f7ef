"""Pool-level limits and choices on the process backend (fast, no engine needed): concurrency cap,
session wall-clock limit, output limit, auto backend fallback, the CLI and the benchmark."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path

import pytest
from typer.testing import CliRunner

from arenaforge.environments.package import write_package
from arenaforge.environments.runtime import create_pool, run_calls
from arenaforge.environments.runtime import launchers as launchers_module
from tests.environments.conftest import sandbox_config
from tests.environments.toolsets import adversarial_env, retail_functions_env


def test_concurrency_cap_queues_calls() -> None:
    code = "import time\ndef interval(seconds):\n    start = time.time()\n    time.sleep(seconds)\n    return [start, time.time()]\n"
    from arenaforge.schemas.models import Environment, FunctionDoc

    env = Environment(name="cap", tools=[FunctionDoc(name="interval")], code=code)

    async def scenario() -> list:
        async with await create_pool(sandbox_config("process", max_concurrency=2)) as pool:
            sessions = [await pool.open(env) for _ in range(5)]
            return await asyncio.gather(*(pool.call(s, "interval", {"seconds": 0.3}) for s in sessions))

    intervals = [json.loads(o.output) for o in asyncio.run(scenario())]
    overlap = max(sum(1 for s, e in intervals if s <= point < e) for point, _ in intervals)
    assert 1 <= overlap <= 2  # never more than max_concurrency calls at once


def test_session_wall_clock_limit() -> None:
    async def scenario() -> list:
        async with await create_pool(sandbox_config("process", session_timeout_s=2.0, pool_size=1)) as pool:
            session = await pool.open(adversarial_env())
            return [
                await pool.call(session, "nap", {"seconds": 2.1}),
                await pool.call(session, "noop", {}),
            ]

    first, second = asyncio.run(scenario())
    assert first.outcome == "ok"
    assert second.outcome == "timeout" and "session exceeded" in (second.error or "")


def test_output_limit_is_configurable() -> None:
    async def scenario() -> list:
        async with await create_pool(sandbox_config("process", output_limit_bytes=1000, pool_size=1)) as pool:
            return await run_calls(pool, adversarial_env(), [("flood_return", {}), ("get_user_balance", {"user_id": "u1"})])

    flood, normal = asyncio.run(scenario())
    assert flood.truncated and flood.output.startswith("x" * 1000) and "[truncated: " in flood.output
    assert len(flood.output) < 1100
    assert (normal.output, normal.truncated) == ("100.0", False)


def test_auto_falls_back_to_process_with_a_warning(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(launchers_module, "docker_engine_answers", lambda url=None: False)

    async def scenario() -> str:
        async with await create_pool(sandbox_config("auto", pool_size=1)) as pool:
            obs = await run_calls(pool, retail_functions_env(), [("get_user_balance", {"user_id": "u2"})])
            assert obs[0].output == "5.0"
            return pool.backend

    with caplog.at_level(logging.WARNING, logger="arenaforge.sandbox"):
        assert asyncio.run(scenario()) == "process"
    assert any("no Docker engine answers" in r.getMessage() for r in caplog.records)


def test_cli_run_and_check(tmp_path: Path) -> None:
    from arenaforge.flows.cli import app

    write_package(retail_functions_env(), tmp_path / "env")
    runner = CliRunner()
    result = runner.invoke(
        app, ["sandbox", "run", str(tmp_path / "env"), "get_user_balance", "--args", '{"user_id": "u1"}', "--backend", "process"]
    )
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["output"] == "100.0"
    failing = runner.invoke(app, ["sandbox", "run", str(tmp_path / "env"), "get_order_details", "--args", '{"order_id": "zz"}', "--backend", "process"])
    assert failing.exit_code == 1 and "order zz not found" in failing.output
    checked = runner.invoke(app, ["sandbox", "check", str(tmp_path / "env"), "--backend", "process"])
    assert checked.exit_code == 0, checked.output
    assert [json.loads(line)["passed"] for line in checked.output.splitlines()] == [True, True]


def test_cli_check_accepts_none_where_no_answer_is_declared(tmp_path: Path) -> None:
    from arenaforge.flows.cli import app
    from arenaforge.schemas.models import GoldCall

    env = retail_functions_env()
    ok = env.model_copy(update={"calls": [*env.calls, GoldCall(tool="noop", arguments={}),
                                          GoldCall(tool="noop", arguments={}, answer="")]})
    expects_text = env.model_copy(update={"calls": [GoldCall(tool="noop", arguments={}, answer="done")]})
    write_package(ok.model_copy(update={"id": ""}), tmp_path / "ok")
    write_package(expects_text.model_copy(update={"id": ""}), tmp_path / "expects")
    runner = CliRunner()
    checked = runner.invoke(app, ["sandbox", "check", str(tmp_path / "ok"), "--backend", "process"])
    rows = [json.loads(line) for line in checked.output.splitlines()]
    assert checked.exit_code == 0, checked.output
    assert [(r["outcome"], r["passed"]) for r in rows] == [("ok", True), ("ok", True), ("no_output", True), ("no_output", True)]
    failed = runner.invoke(app, ["sandbox", "check", str(tmp_path / "expects"), "--backend", "process"])
    assert failed.exit_code == 1 and json.loads(failed.output.splitlines()[0])["passed"] is False


@pytest.mark.parametrize(("answer", "outcome", "output", "passes"), [
    (None, "ok", "anything", True),
    ("5.0", "ok", "5", True),
    ("5.0", "ok", "6", False),
    (None, "no_output", "", True),
    ("  ", "no_output", "", True),
    ("pending", "no_output", "", False),
    (None, "error", "", False),
    (None, "timeout", "", False),
    (None, "limit", "", False),
])
def test_gold_call_rule(answer, outcome, output, passes) -> None:
    from arenaforge.environments.reward import gold_call_passes

    assert gold_call_passes(answer, outcome, output) is passes


def test_benchmark_smoke() -> None:
    from arenaforge.benchmarks.sandbox import main

    import asyncio

    result = asyncio.run(main(levels="1,4", trivial_calls=40, cpu_calls=4, subprocess_calls=4, docker_run_calls=0,
                              backend="process", pool_size=1, state_mb=0.3, state_opens=3, state_concurrency=4,
                              module_kb=40, module_opens=3))
    assert result["pool_backend"] == "process"
    state = result["stateful"]
    assert state["state_bytes"] >= 300_000 and state["templates_loaded"] == 2  # the bench env and the state: one load each
    assert state["open_one_by_one"]["calls"] == 3 and state["open_concurrent"]["succeeded"] == 4
    assert result["pool"]["trivial"]["4"]["calls"] == 40 and result["pool"]["trivial"]["4"]["failed"] == 0
    assert result["pool"]["cpu50ms"]["1"]["p50_ms"] >= 45
    assert result["subprocess"]["trivial"]["1"]["failed"] == 0
    assert result["ratios"]["pool_over_subprocess"]["trivial"]["1"] > 1
    module = result["large_module"]
    assert module["code_bytes"] >= 40_000 and module["template"]["calls_ok"] == module["compile_every_open"]["calls_ok"] == 24


def test_session_cpu_limit_and_odd_results() -> None:
    code = (
        "def spin():\n    while True:\n        pass\n"
        "def surrogate():\n    return 'a\\ud800b'\n"
        "class Bad:\n    def __repr__(self):\n        raise RuntimeError('no repr')\n"
        "def unrenderable():\n    return Bad()\n"
        "def ok():\n    return 'fine'\n"
    )
    from arenaforge.schemas.models import Environment, FunctionDoc

    env = Environment(name="odd", tools=[FunctionDoc(name=n) for n in ("spin", "surrogate", "unrenderable", "ok")], code=code)

    async def scenario() -> list:
        async with await create_pool(sandbox_config("process", session_cpu_s=1, pool_size=1)) as pool:
            session = await pool.open(env)
            return [
                await pool.call(session, "spin", {}, timeout_s=10),
                await pool.call(session, "surrogate", {}),
                await pool.call(session, "unrenderable", {}),
                await pool.call(session, "ok", {}),
            ]

    spin, surrogate, unrenderable, ok = asyncio.run(scenario())
    assert spin.outcome == "limit" and "SIGXCPU" in (spin.error or "")  # before the 10 s wall-clock limit
    assert surrogate.outcome == "ok" and surrogate.output.startswith("a") and surrogate.output.endswith("b")
    assert unrenderable.outcome == "error" and "could not be rendered" in (unrenderable.error or "")
    assert ok.output == "fine"


def test_process_backend_without_uid_switching(monkeypatch: pytest.MonkeyPatch) -> None:
    """The degraded path (no root, or no world-readable Python): process groups instead of session uids."""
    from arenaforge.environments.runtime.process_backend import ProcessLauncher

    monkeypatch.setattr(ProcessLauncher, "can_setuid", property(lambda self: False))

    async def scenario() -> tuple[dict, list]:
        async with await create_pool(sandbox_config("process", pool_size=1)) as pool:
            session = await pool.open(adversarial_env())
            obs = [
                await pool.call(session, "cancel_pending_order", {"order_id": "W1001", "reason": "r"}),
                await pool.call(session, "get_order_details", {"order_id": "W1001"}),
                await pool.call(session, "spin", {}, timeout_s=1.0),
                await pool.call(session, "get_order_details", {"order_id": "W1001"}),
                await pool.call(session, "segfault", {}),
                await pool.call(session, "scratch_roundtrip", {}),
            ]
            await pool.close(session)
            return pool.info, obs

    info, obs = asyncio.run(scenario())
    assert info["setuid"] is False
    assert [o.outcome for o in obs] == ["ok", "ok", "timeout", "ok", "limit", "ok"]
    assert '"cancelled"' in obs[1].output and '"pending"' in obs[3].output
    assert obs[5].output.endswith(":kept")


def test_auto_falls_back_when_the_docker_backend_cannot_prepare(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    from arenaforge.environments.runtime.docker_backend import DockerLauncher
    from arenaforge.schemas.errors import SandboxError

    async def broken(self: DockerLauncher) -> None:
        raise SandboxError("debootstrap is not installed")

    monkeypatch.setattr(launchers_module, "docker_engine_answers", lambda url=None: True)
    monkeypatch.setattr(DockerLauncher, "prepare", broken)

    async def scenario(backend: str) -> str:
        async with await create_pool(sandbox_config(backend, pool_size=1)) as pool:
            return pool.backend

    with caplog.at_level(logging.WARNING, logger="arenaforge.sandbox"):
        assert asyncio.run(scenario("auto")) == "process"
    assert any("falling back to the process backend" in r.getMessage() for r in caplog.records)
    with pytest.raises(SandboxError, match="debootstrap"):
        asyncio.run(scenario("docker"))  # asked for docker explicitly: no silent fallback


@pytest.mark.parametrize("backend", ["process", "docker"])
def test_cli_status_reports_one_truthful_net_isolated(backend: str) -> None:
    """The pool and each of its workers say the same about the network, and it is what the worker sees: only
    loopback (docker: network_mode none; process as root: a private network namespace)."""
    import os

    from arenaforge.flows.cli import app
    from tests.support.requirements import require_docker

    if backend == "docker":
        require_docker()
    status = CliRunner().invoke(app, ["sandbox", "status", "--backend", backend])
    assert status.exit_code == 0, status.output
    report = json.loads(status.output)
    assert report["pool"]["backend"] == backend and report["workers"], report
    assert [w["net_isolated"] for w in report["workers"]] == [report["pool"]["net_isolated"]] * len(report["workers"])
    if backend == "docker" or os.geteuid() == 0:
        assert report["pool"]["net_isolated"] is True


def test_an_unknown_backend_is_one_clear_line_naming_the_registered_ones() -> None:
    from arenaforge.schemas.errors import ConfigError

    with pytest.raises(ConfigError, match="unknown sandbox backend 'podman'; known: auto, docker, process") as info:
        asyncio.run(create_pool(sandbox_config("podman", pool_size=1)))
    assert "\n" not in str(info.value)


def test_a_registered_backend_is_chosen_by_name_and_asked_its_capabilities(monkeypatch: pytest.MonkeyPatch) -> None:
    """Adding a backend is a launcher plus its registration: the pool asks its capabilities (here: it may run
    model-written code without the process backend's opt-in), never its name."""
    import dataclasses

    from arenaforge.environments.runtime.process_backend import ProcessLauncher
    from arenaforge.schemas.models import Provenance

    class ConfinedLauncher(ProcessLauncher):
        backend = "confined"
        capabilities = dataclasses.replace(ProcessLauncher.capabilities, isolates_model_code=True)

    monkeypatch.setitem(launchers_module.LAUNCHERS, "confined", ConfinedLauncher)
    env = retail_functions_env().model_copy(update={"provenance": Provenance(backend="openai", model="some-model")})

    async def scenario() -> tuple[str, str | None]:
        async with await create_pool(sandbox_config("confined", pool_size=1)) as pool:
            obs = await run_calls(pool, env, [("get_user_balance", {"user_id": "u2"})])
            return pool.backend, obs[0].output

    assert asyncio.run(scenario()) == ("confined", "5.0")
