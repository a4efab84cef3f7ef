"""Our Harbor export under the real Harbor CLI (PyPI harbor 0.26.0, scripts/setup-harbor.sh): `harbor lint` clean under
its default rules and every rule, and `harbor run` with its docker environment: the oracle scores 1, nop 0, and an
agent that is root in its container and forges everything it can without calling a tool scores 0, with no trial
ending in an error. (The whole demo export, with times: `arenaforge bench harbor_run`.)"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest

from arenaforge.tracks.envs import harbor_cli
from arenaforge.tracks.envs.export import write_harbor
from tests.support.envs_fakes import sandbox_cfg
from tests.support.requirements import require_docker, require_harbor
from tests.support.rl import tiny_env

pytestmark = [pytest.mark.docker, pytest.mark.slow]


@pytest.fixture(scope="module")
def tasks(tmp_path_factory) -> Path:
    """Two exported tasks FROM the project's sandbox base image (no registry here to pull python:3.11-slim)."""
    require_docker()
    import docker

    from arenaforge.environments.runtime import build_image
    from arenaforge.environments.runtime.image import rootfs_hash

    cfg = sandbox_cfg()
    build_image(docker.from_env(), cfg.image)
    root = tmp_path_factory.mktemp("harbor") / "tasks"
    write_harbor([tiny_env(), tiny_env(country="Sylvania", capital="Ostia", population=4021)], root,
                 base_image=f"{cfg.image}-base:{rootfs_hash()}")
    return root


def test_harbor_lint_passes(tasks: Path) -> None:
    install = require_harbor()
    dirs = sorted(tasks.iterdir())
    assert harbor_cli.lint(install, dirs) == (True, [])
    assert harbor_cli.lint(install, dirs, select_all=True) == (True, [])  # root-agent and unpinned-image too
    # the gate sees a violation: the old layout (grader in the agent's container, agent as root)
    toml = dirs[0] / "task.toml"
    toml.write_text(toml.read_text().replace('environment_mode = "separate"', 'environment_mode = "shared"')
                    .replace('user = "agent"', 'user = "root"'))
    try:
        passed, findings = harbor_cli.lint(install, dirs[:1], select_all=True)
    finally:
        write_harbor([tiny_env()], tasks, base_image=_base(tasks))
    assert not passed and {"shared-verifier", "root-agent"} <= {f["rule"] for f in findings}


def _base(tasks: Path) -> str:
    return (tasks / tiny_env().name / "environment" / "Dockerfile").read_text().splitlines()[0].split("=", 1)[1]


def test_oracle_scores_one_nop_and_root_forgers_zero(tasks: Path, tmp_path: Path) -> None:
    install = require_harbor()
    forgers = str(resources.files("arenaforge.tracks.envs").joinpath("harbor"))
    names = sorted(d.name for d in tasks.iterdir())
    for agent, extra, expected in (("oracle", [], 1.0), ("nop", [], 0.0),
                                   ("forge_agents:AllForgeries", ["--ak", f"tasks_dir={tasks}"], 0.0)):
        outcomes = harbor_cli.run_job(install, tasks, agent, tmp_path / "jobs", agent.split(":")[-1].lower(),
                                      n_concurrent=2, extra_args=extra, extra_env={"PYTHONPATH": forgers})
        assert [(o.task, o.error, o.reward) for o in outcomes] == [(n, None, expected) for n in names], agent
