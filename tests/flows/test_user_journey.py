"""A user's project, served from a wheel install: arenaforge built as a wheel and installed into a
fresh virtual environment outside any checkout, `arenaforge serve` started in a project directory,
runs started the way the CLI and the UI form start them, with paths relative to the project.

Proves: deployments load by module path from the installed package; flow runs work in the project
directory (relative paths in parameters and the default `./out` land there, not in the install
directory); the SFT export trains directly (`sft` with `export_dir` -> `train-sft` on that file,
started like the UI's Run > Custom run form does: a deployment run with parameters).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

import pytest

from tests.support.prefect_server import free_port
from tests.support.requirements import REPO

pytestmark = [pytest.mark.prefect_server, pytest.mark.slow]


def _run(cmd: list[str], **kw: Any) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=kw.pop("timeout", 600), **kw)


@pytest.fixture(scope="module")
def venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A virtual environment holding the arenaforge wheel; dependencies come from the test venv's
    site-packages through a .pth line (whose own .pth files, the checkout's editable hook among
    them, are not processed), so `import arenaforge` can only find the wheel."""
    root = tmp_path_factory.mktemp("wheel-install")
    built = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                  str(root / "dist"), str(REPO)])
    assert built.returncode == 0, built.stderr
    (wheel,) = (root / "dist").glob("arenaforge-*.whl")
    env_dir = root / "venv"
    made = _run([sys.executable, "-m", "venv", "--without-pip", str(env_dir)])
    assert made.returncode == 0, made.stderr
    python = env_dir / "bin" / "python"
    purelib = Path(_run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"]).stdout.strip())
    (purelib / "_arenaforge_test_deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    installed = _run([sys.executable, "-m", "pip", "--python", str(python), "install", "--no-deps", "--no-index",
                      "-q", str(wheel)])
    assert installed.returncode == 0, installed.stderr
    where = _run([str(python), "-c", "import arenaforge; print(arenaforge.__file__)"], cwd=root)
    assert where.stdout.strip().startswith(str(purelib)), where.stdout + where.stderr
    return env_dir


def _user_env() -> dict[str, str]:
    """A user's shell: none of the test session's Prefect/Arenaforge settings, no PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "ARENAFORGE_")) and k != "PYTHONPATH"}
    env.update({"NO_COLOR": "1", "COLUMNS": "200", "PYTHONUNBUFFERED": "1"})
    return env


@pytest.fixture(scope="module")
def project(venv: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """`arenaforge serve` (from the wheel) running in a fresh project directory."""
    proj = tmp_path_factory.mktemp("my-project")
    port = free_port()
    (proj / "arenaforge.toml").write_text(
        f'[warehouse]\npath = "project.duckdb"\n[prefect]\nport = {port}\nwork_pool = "journey-{port}"\n')
    shutil.copytree(resources.files("arenaforge.data").joinpath("sample_tools"), proj / "tools")
    proc = subprocess.Popen([str(venv / "bin" / "arenaforge"), "serve"], cwd=proj, env=_user_env(),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 300
        while not any("Ctrl-C stops" in line for line in lines):
            line = proc.stdout.readline()
            assert line or proc.poll() is None, "serve exited early:\n" + "".join(lines)
            lines.append(line)
            assert time.monotonic() < deadline, "".join(lines)
        yield {"dir": proj, "api": f"http://127.0.0.1:{port}/api", "out": "".join(lines), "venv": venv}
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGINT)  # one Ctrl-C
            try:
                proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)


def _cli(project: dict[str, Any], *args: str) -> subprocess.CompletedProcess:
    return _run([str(project["venv"] / "bin" / "arenaforge"), *args], cwd=project["dir"], env=_user_env())


def _wait_final(api: str, flow_run_id: Any, timeout_s: float = 600) -> Any:
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    deadline = time.monotonic() + timeout_s
    with temporary_settings(updates={PREFECT_API_URL: api}), get_client(sync_client=True) as client:
        while True:
            run = client.read_flow_run(flow_run_id)
            if run.state and run.state.is_final():
                return run
            assert time.monotonic() < deadline, f"flow run still {run.state}"
            time.sleep(0.5)  # polling the API with a deadline


def test_serve_names_the_project_directory(project: dict[str, Any]) -> None:
    assert f"project: {project['dir']}" in project["out"]
    assert str(project["dir"] / "project.duckdb") in project["out"]


def test_relative_paths_resolve_in_the_project_and_export_trains(project: dict[str, Any]) -> None:
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from arenaforge.schemas.kinds_training import TrainStep
    from arenaforge.schemas.models import Tool
    from arenaforge.warehouse import Warehouse

    proj: Path = project["dir"]
    ingest = _cli(project, "serve", "run", "ingest", "--param", 'paths=["tools"]', "--wait")
    assert ingest.returncode == 0, ingest.stdout + ingest.stderr
    for step in (["graph"], ["sft", "--param", "export_dir=exports/sft"]):
        done = _cli(project, "serve", "run", *step, "--wait")
        assert done.returncode == 0, done.stdout + done.stderr
    data = proj / "exports" / "sft" / "sft.jsonl"
    rows = [json.loads(line) for line in data.read_text().splitlines()]
    assert rows and all(isinstance(r["tools"], list) for r in rows)

    # train-sft as the UI's Run > Custom run form starts it: a deployment run with parameters
    with temporary_settings(updates={PREFECT_API_URL: project["api"]}), get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name("train-sft/train-sft")
        assert deployment.job_variables["working_dir"] == str(proj)
        run = client.create_flow_run_from_deployment(deployment.id, parameters={
            "params": {"data": "exports/sft/sft.jsonl", "experiment": "journey", "max_steps": 2, "batch_size": 2}})
    run = _wait_final(project["api"], run.id)
    assert run.state.is_completed(), run.state

    wh = Warehouse(proj / "project.duckdb")
    assert len(wh.load(Tool)) > 3
    steps = [s for s in wh.load(TrainStep) if s.experiment == "journey"]
    assert sorted(s.step for s in steps) == [1, 2] and all(s.metrics["loss"] > 0 for s in steps)
    assert (proj / "out" / "train" / "journey").is_dir()  # the default ./out is the project's
    site = Path(_run([str(project["venv"] / "bin" / "python"), "-c",
                      "import arenaforge, pathlib; print(pathlib.Path(arenaforge.__file__).parent.parent)"],
                     cwd=proj).stdout.strip())
    assert site.name == "site-packages" and site.is_relative_to(project["venv"])
    assert not (site / "out").exists() and not (REPO / "out" / "train" / "journey").exists()


def test_a_missing_relative_path_is_named_absolutely(project: dict[str, Any]) -> None:
    from arenaforge.warehouse import Warehouse

    failed = _cli(project, "serve", "run", "ingest", "--param", 'paths=["no-such-tools"]', "--wait")
    assert failed.returncode == 1, failed.stdout + failed.stderr
    _, rows = Warehouse(project["dir"] / "project.duckdb").query(
        "SELECT subject, detail FROM v_rejections WHERE reason = 'missing_path'")
    assert (str(project["dir"] / "no-such-tools"),) == tuple({r[0] for r in rows}), rows
