"""`arenaforge envs import harbor` (issue 15): Harbor task directories, written here as a user would write them.

Others' tasks become container tasks: the agent works in the task's own container (built offline FROM the project's
sandbox base image), the task's own tests/test.sh is the native metric beside our F1, and solution/solve.sh is the
gold. A FROM image that is not present locally, or a solution that fails its own tests, is a rejection row with its
reason (one line on stderr). Re-importing adds nothing. Ours (from `envs export --format harbor`) come back as the
environment they were exported from, same id."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from arenaforge.environments.containers import RoutedPool, TaskContainers
from arenaforge.environments.runtime import create_pool
from arenaforge.schemas.models import Environment, Rejection
from arenaforge.testing.scripted_policy import ScriptedEngine
from arenaforge.tracks.envs.export import export_environments
from arenaforge.tracks.envs.import_harbor import read_task
from arenaforge.tracks.train.env_selection import matching_envs
from arenaforge.tracks.train.params import EnvSelection, EpisodeParams
from arenaforge.tracks.train.rollout.evaluate import EvalConfig, evaluate
from arenaforge.warehouse import Warehouse
from tests.support.envs_fakes import sandbox_cfg
from tests.support.requirements import require_docker
from tests.support.rl import call_text, tiny_model_path

SUM_TESTS = """#!/bin/bash
mkdir -p /logs/verifier
if [ "$(cat /app/answer.txt 2>/dev/null)" = "12" ]; then echo 1 > /logs/verifier/reward.txt; else echo 0 > /logs/verifier/reward.txt; fi
"""
SUM_SOLUTION = """#!/bin/bash
total=0
while read -r n; do total=$((total + n)); done < /app/numbers.txt
echo "$total" > /app/answer.txt
"""


@pytest.fixture(scope="module")
def base_image() -> str:
    """A local image to build FROM (no registry here): the project's sandbox base image."""
    require_docker()
    import docker

    from arenaforge.environments.runtime import build_image
    from arenaforge.environments.runtime.image import rootfs_hash

    cfg = sandbox_cfg()
    build_image(docker.from_env(), cfg.image)
    return f"{cfg.image}-base:{rootfs_hash()}"


def write_task(root: Path, name: str, base: str, *, solution: str | None = SUM_SOLUTION, from_arg: bool = False) -> Path:
    d = root / name
    (d / "environment").mkdir(parents=True)
    (d / "tests").mkdir()
    (d / "instruction.md").write_text("Write the sum of the numbers in /app/numbers.txt to /app/answer.txt.\n")
    (d / "task.toml").write_text(f'version = "1.0"\n\n[metadata]\nname = "{name}"\n\n[verifier]\ntimeout_sec = 60.0\n\n'
                                 '[agent]\ntimeout_sec = 120.0\n')
    head = f"ARG BASE_IMAGE={base}\nFROM ${{BASE_IMAGE}}" if from_arg else f"FROM {base}"  # the first: as our export writes
    (d / "environment" / "Dockerfile").write_text(f"{head}\nCOPY numbers.txt /app/numbers.txt\nWORKDIR /app\n")
    (d / "environment" / "numbers.txt").write_text("3\n4\n5\n")
    (d / "tests" / "test.sh").write_text(SUM_TESTS)
    if solution is not None:
        (d / "solution").mkdir()
        (d / "solution" / "solve.sh").write_text(solution)
    return d


def cli(db: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "arenaforge.flows.cli", "--db", str(db), *args], capture_output=True,
                          text=True, env={**os.environ, "NO_COLOR": "1", "COLUMNS": "200"}, timeout=900)


def shell_policy(commands: list[str]):
    """respond(prompt, index): one run_shell call per command, then a short answer."""

    def respond(prompt: str, _index: int) -> str:
        done = prompt.count("<tool_response>")
        return call_text("run_shell", command=commands[done]) if done < len(commands) else "Done."

    return respond


def run_eval(envs: list[Environment], respond) -> tuple:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_path())
    config = EvalConfig(rollout=EpisodeParams(temperature=0.0, max_turns=4, max_length=8000, max_tokens_per_turn=1000).rollout_config())

    async def scenario():
        async with RoutedPool(await create_pool(sandbox_cfg()), TaskContainers(call_timeout_s=60)) as pool:
            return await evaluate(ScriptedEngine(tok, respond), tok, pool, envs, config, "run_harbor", suite="my-harbor")

    return asyncio.run(scenario())


def test_others_tasks_import_with_their_own_tests_as_native_metric(base_image: str, tmp_path: Path) -> None:
    tasks = tmp_path / "tasks"
    write_task(tasks, "sum-numbers", base_image)
    write_task(tasks, "needs-registry", "python:3.11-slim-not-here")
    write_task(tasks, "wrong-solution", base_image, solution="#!/bin/bash\necho 11 > /app/answer.txt\n")
    db = tmp_path / "wh.duckdb"
    res = cli(db, "envs", "import", "harbor", str(tasks), "--suite", "my-harbor")
    assert res.returncode == 0, res.stderr
    shown = json.loads(res.stdout)
    assert (shown["imported"], shown["new"], shown["ours"]) == (1, 1, 0)
    assert shown["rejected"] == {"base_image_missing": 1, "solution_failed": 1}
    lines = [line for line in res.stderr.splitlines() if line.startswith("rejected ")]
    assert len(lines) == 2 and any("python:3.11-slim-not-here is not present locally" in line for line in lines), res.stderr
    assert any("solution/solve.sh does not pass tests/test.sh: reward 0" in line for line in lines), res.stderr

    wh = Warehouse(db)
    (env,) = matching_envs(wh, EnvSelection(suite="my-harbor", split="all"))
    assert env.container is not None and env.native.kind == "harbor_tests" and env.verification.passed
    assert str((tasks / "sum-numbers").resolve()) in env.native.source and env.run_id == shown["run_id"]
    assert {r.reason for r in wh.load(Rejection, where="(record->>'stage') = 'import_harbor'")} == {"base_image_missing", "solution_failed"}
    again = cli(db, "envs", "import", "harbor", str(tasks / "sum-numbers"), "--suite", "my-harbor")
    assert again.returncode == 0 and json.loads(again.stdout)["new"] == 0 and json.loads(again.stdout)["ids"] == [env.id]

    written = export_environments([env], tmp_path / "out")  # a container task stays in its own (the source's) format
    assert written["container_tasks_not_in_verl_or_harbor"] == 1 and "harbor" not in written and "verl" not in written
    assert Environment.model_validate_json(Path(written["jsonl"]).read_text()) == env

    gold, gold_rollouts = run_eval([env], shell_policy([env.calls[0].arguments["command"]]))
    assert gold.native == 1.0 and gold_rollouts[0].native_passed and gold.suite == "my-harbor"
    own, _ = run_eval([env], shell_policy(["cat numbers.txt", "echo 12 > /app/answer.txt"]))
    assert own.native == 1.0  # the agent's own way, in the task's container, passes the task's own tests
    wrong, wrong_rollouts = run_eval([env], shell_policy(["echo 13 > /app/answer.txt"]))
    assert wrong.native == 0.0 and wrong_rollouts[0].native_reason == "reward 0"


def test_eval_suite_command_runs_an_imported_harbor_suite(base_image: str, tmp_path: Path) -> None:
    write_task(tmp_path / "tasks", "sum-numbers", "python:3.11-slim-not-here", from_arg=True)
    db = tmp_path / "wh.duckdb"
    refused = cli(db, "envs", "import", "harbor", str(tmp_path / "tasks"), "--suite", "my-harbor")
    assert refused.returncode == 2 and "python:3.11-slim-not-here is not present locally" in refused.stderr
    built = cli(db, "envs", "import", "harbor", str(tmp_path / "tasks"), "--suite", "my-harbor",
                "--build-arg", f"BASE_IMAGE={base_image}")  # built from a local image instead
    assert built.returncode == 0 and json.loads(built.stdout)["new"] == 1, built.stderr
    res = cli(db, "eval", "run", "--suite", "my-harbor", "--engine", "hf", "--model-path", str(tiny_model_path()),
              "--max-turns", "2", "--max-length", "64", "--max-tokens-per-turn", "16")
    assert res.returncode == 0, res.stderr
    result = json.loads(res.stdout[: res.stdout.index("\n}\n") + 2])
    # an untrained tiny model does not solve it: its own tests say so (0, not a failure of the environment)
    assert result["suite"] == "my-harbor" and result["native"] == 0.0 and result["episodes"] == 1
    assert "env_failure" not in result["statuses"]


def test_from_images_are_read_with_arg_defaults_build_args_and_stages() -> None:
    from arenaforge.environments.task_image import base_images
    from arenaforge.schemas.models import ContainerTask

    def images(dockerfile: str, **build_args: str) -> list[str]:
        return base_images(ContainerTask(dockerfile=dockerfile, tests={"test.sh": ""}, build_args=build_args))

    exported = "ARG BASE_IMAGE=python:3.11-slim\nFROM ${BASE_IMAGE}\nRUN true\n"
    assert images(exported) == ["python:3.11-slim"] and images(exported, BASE_IMAGE="local:1") == ["local:1"]
    assert images("FROM --platform=linux/amd64 golang:1 AS build\nRUN make\nFROM build\nFROM scratch\n") == ["golang:1"]
    assert images("ARG V=3\nFROM python:${V:-2}-slim\n") == ["python:3-slim"]


def test_a_task_that_is_not_one_is_a_rejection_and_nothing_imported_exits_2(tmp_path: Path) -> None:
    d = tmp_path / "half"
    d.mkdir()
    (d / "task.toml").write_text('version = "1.0"\n')
    res = cli(tmp_path / "wh.duckdb", "envs", "import", "harbor", str(d))
    assert res.returncode == 2, res.stderr
    assert "not a Harbor task: instruction.md, environment/Dockerfile, tests/test.sh missing" in res.stderr
    bad = write_task(tmp_path / "bad", "bad-timeout", "unused")
    (bad / "task.toml").write_text('[agent]\ntimeout_sec = "soon"\n')
    read = read_task(bad, "my-harbor")
    assert isinstance(read, Rejection) and read.reason == "not_a_task" and "task.toml" in read.detail
    missing = cli(tmp_path / "wh.duckdb", "envs", "import", "harbor", str(tmp_path / "nope"))
    assert missing.returncode == 2 and missing.stderr.strip().endswith("no such directory")
