"""The distribution is one package, and the product runs from a built wheel installed outside any checkout."""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    done = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                           str(out), str(REPO)], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    (built,) = out.glob("arenaforge-*.whl")
    return built


def test_the_wheel_holds_exactly_one_top_level_package(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    top = {n.split("/")[0] for n in names}
    assert {t for t in top if not t.endswith(".dist-info")} == {"arenaforge"}
    # data, prompts and contracts travel inside the package
    for needed in ("arenaforge/tracks/envs/prompts/envs_decompose.txt", "arenaforge/data/sample_source/customers.csv",
                   "arenaforge/schemas/json/environment.schema.json", "arenaforge/warehouse/migrations/0001_init.sql",
                   "arenaforge/warehouse/migrations/0009_views.sql", "arenaforge/tracks/envs/harbor/tools_server.py.tmpl",
                   "arenaforge/tracks/envs/harbor/forge_agents.py", "arenaforge/tracks/envs/openenv/server.py.tmpl",
                   "arenaforge/tracks/envs/verifiers/toolset.py.tmpl",
                   "arenaforge/tracks/envs/verifiers/taskset.py.tmpl", "arenaforge/tracks/envs/verifiers/init.py.tmpl"):
        assert needed in names, needed


@pytest.mark.slow
def test_demo_runs_from_the_installed_wheel_outside_the_repo(wheel: Path, tmp_path: Path, prefect_server) -> None:
    site = tmp_path / "site"
    done = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    work = tmp_path / "elsewhere"
    work.mkdir()
    # the installed copy comes first on the path, ahead of the checkout's editable install
    env = {**os.environ, "PYTHONPATH": str(site), "NO_COLOR": "1"}
    where = subprocess.run([sys.executable, "-c", "import arenaforge; print(arenaforge.__file__)"], cwd=work, env=env,
                           capture_output=True, text=True, timeout=120)
    assert where.stdout.strip() == str(site / "arenaforge" / "__init__.py")
    demo = subprocess.run([sys.executable, "-m", "arenaforge.flows.cli", "demo", "--n", "6"], cwd=work, env=env,
                          capture_output=True, text=True, timeout=900)
    assert demo.returncode == 0, demo.stderr[-3000:]
    assert (work / "arenaforge.lake").is_dir() and not (REPO / "arenaforge.lake").exists()  # the default warehouse.path
    assert "environments" in demo.stdout
