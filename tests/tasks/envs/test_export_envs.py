"""Exports: verl 0.9.1 files (splits, per-tool tools_kwargs, configs), Harbor tasks whose verifier trusts only the
tools service's signed call log (forgeries score 0), JSON-lines."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

from arenaforge.environments.runtime import create_pool
from arenaforge.schemas.models import Environment
from arenaforge.services.embeddings import embed
from arenaforge.tracks.envs.build_tools import ToolBuilder
from arenaforge.tracks.envs.decompose_qa import QASpec, QASynthesizer
from arenaforge.tracks.envs.distractors import choose_distractors
from arenaforge.tracks.envs.export import grade_source, write_harbor, write_jsonl
from arenaforge.tracks.envs.knowledge import load_sample
from arenaforge.tracks.envs.pipeline import EnvsSpec
from arenaforge.tracks.envs.synthesize_env import synthesize_environments
from arenaforge.tracks.envs.tool_impl import assemble
from arenaforge.tracks.train.verl.dataset import write_verl
from tests.support.envs_fakes import sandbox_cfg
from tests.support.harbor import ToolsService
from tests.support.models import offline_model
from tests.support.requirements import require_docker


@pytest.fixture(scope="module")
def envs() -> list[Environment]:
    src = load_sample()
    instances = asyncio.run(QASynthesizer(offline_model()).synthesize(src, QASpec(n=4, seed=9))).instances

    async def go():
        pool = await create_pool(sandbox_cfg())
        try:
            return (await synthesize_environments(ToolBuilder(offline_model(), src), pool, instances, max_attempts=1)).drafts
        finally:
            await pool.shutdown()

    drafts = asyncio.run(go())
    src.close()
    chosen = choose_distractors(drafts, EnvsSpec().mix(), embed)
    return [assemble(d.qa, d.tools, c.tools, [t.name for t in c.tools], None) for d, c in zip(drafts, chosen, strict=True)]


def test_verl_export_writes_splits_tools_and_configs(envs, tmp_path: Path) -> None:
    files = write_verl(envs, tmp_path / "verl")
    train, val = pl.read_parquet(files.train), pl.read_parquet(files.val)
    assert train.height + val.height == len(envs) and val.height >= 1
    assert {"prompt", "agent_name", "reward_model", "extra_info", "tools", "data_source"} <= set(train.columns)
    by_id = {e.id: e for e in envs}
    row = train.row(0, named=True)
    env = by_id[row["extra_info"]["env_id"]]
    assert row["prompt"][-1]["role"] == "user" and row["prompt"][-1]["content"] == env.question
    assert json.loads(row["reward_model"]["ground_truth"]) == env.gold_answers
    assert row["extra_info"]["split"] == "train" and val.row(0, named=True)["extra_info"]["split"] == "val"
    # stock ToolAgentLoop: tools_kwargs keyed by each tool's name, the sample limited to its own tools
    own = row["extra_info"]["tool_selection"]
    assert sorted(own) == sorted(t.name for t in env.tools)
    kwargs = row["extra_info"]["tools_kwargs"]
    assert all(kwargs[name]["create_kwargs"] == {"env_id": env.id, "function": name} for name in own)
    assert [t["function"]["name"] for t in json.loads(row["tools"])] == [t.name for t in env.tools]
    import yaml

    tools = yaml.safe_load(files.tool_config.read_text())["tools"]
    assert {t["tool_schema"]["function"]["name"] for t in tools} >= set(own)
    assert {t["class_name"] for t in tools} == {"arenaforge.tracks.train.verl.verl_adapter.VerlArenaTool"}
    (loop,) = yaml.safe_load(files.agent_config.read_text())
    assert loop["name"] == row["agent_name"] == "arena_agent" and loop["environments"] == str(files.environments)
    assert sorted(Environment.model_validate_json(x).id for x in files.environments.read_text().splitlines()) == \
        sorted(by_id)


def test_verl_tool_names_split_same_name_different_schema() -> None:
    from arenaforge.tracks.train.verl.dataset import verl_tool_names
    from tests.support.rl import tiny_env

    a = tiny_env()
    b = tiny_env(country="Sylvania", capital="Ostia")
    changed = b.tools[0].model_copy(update={"description": "Another capital lookup."})
    b = b.model_copy(update={"tools": [changed, b.tools[1]]})
    names, schemas = verl_tool_names([a, b])
    assert names[(a.id, "get_capital")] == "get_capital" and names[(b.id, "get_capital")] == "get_capital_2"
    assert names[(b.id, "get_population")] == "get_population"  # same schema: one verl tool
    assert set(schemas) == {"get_capital", "get_capital_2", "get_population"}


def test_jsonl_round_trips(envs, tmp_path: Path) -> None:
    path = write_jsonl(envs, tmp_path / "envs.jsonl")
    back = [Environment.model_validate_json(line) for line in path.read_text().splitlines()]
    assert [e.id for e in back] == [e.id for e in envs]


def _sh(script: Path, tools_url: str, logs: Path, bin_dir: Path, call_log: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "TOOLS_URL": tools_url, "LOGS_DIR": str(logs), "CALL_LOG": str(call_log),
           "PATH": f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin"}
    return subprocess.run(["sh", str(script)], env=env, capture_output=True, text=True, timeout=120)


def _reward(logs: Path) -> dict:
    return json.loads((logs / "verifier" / "reward.json").read_text())


def _details(logs: Path) -> dict:
    return json.loads((logs / "verifier" / "details.json").read_text())


@pytest.fixture
def harbor_task(envs, tmp_path: Path):
    (d,) = write_harbor(envs[:1], tmp_path / "harbor")
    bin_dir = tmp_path / "bin"  # what the task's Dockerfile installs: call-tool on PATH
    bin_dir.mkdir()
    (bin_dir / "call-tool").symlink_to(d / "environment" / "call_tool.py")
    service = ToolsService(d / "environment" / "tools", tmp_path / "tools-fs" / "calls.jsonl")
    try:
        yield d, envs[0], service, bin_dir
    finally:
        service.stop()


def test_harbor_task_solves_and_grades_from_the_tools_service(harbor_task, tmp_path: Path) -> None:
    import tomllib

    d, env, service, bin_dir = harbor_task
    for rel in ("instruction.md", "task.toml", "environment/Dockerfile", "environment/docker-compose.yaml",
                "environment/tools/Dockerfile", "solution/solve.sh", "tests/Dockerfile", "tests/test.sh",
                "tests/gold.json"):
        assert (d / rel).is_file(), rel
    assert (d / "environment" / "Dockerfile").read_text().startswith("ARG BASE_IMAGE=python:3.11-slim\nFROM ")
    task = tomllib.loads((d / "task.toml").read_text())
    assert task["schema_version"] == "1.4" and task["metadata"]["id"] == env.id
    assert task["agent"]["user"] == "agent" and task["verifier"]["environment_mode"] == "separate"
    assert task["artifacts"] == [{"source": "/var/lib/arena-tools/calls.jsonl", "service": "tools"}]
    logs, log = tmp_path / "logs", service.call_log
    assert _sh(d / "tests" / "test.sh", service.url, logs, bin_dir, log).returncode == 0
    assert _reward(logs) == {"reward": 0.0} and _details(logs)["calls"] == 0  # no calls yet
    solved = _sh(d / "solution" / "solve.sh", service.url, logs, bin_dir, log)
    assert solved.returncode == 0, solved.stderr
    assert _sh(d / "tests" / "test.sh", service.url, logs, bin_dir, log).returncode == 0
    details = _details(logs)
    assert _reward(logs) == {"reward": 1.0}  # one reward: Harbor reads every key of reward.json as one
    assert details["subtasks"] == len(env.gold_answers) and details["calls"] == len(env.calls)
    # a distractor call costs precision
    extra = subprocess.run([str(bin_dir / "call-tool"), env.distractors[0], "{}"], env={**os.environ,
                           "TOOLS_URL": service.url}, capture_output=True, text=True, timeout=60)
    assert extra.stdout.strip()
    _sh(d / "tests" / "test.sh", service.url, logs, bin_dir, log)
    assert 0 < _reward(logs)["reward"] < 1.0 and _details(logs)["calls"] == len(env.calls) + 1


def test_harbor_verifier_reads_only_the_tools_service_log(harbor_task, tmp_path: Path) -> None:
    """What the agent can write (a call log under /logs, a reward file) does not count; a missing service log is
    an error (exit 1, no reward file), never a score."""
    d, env, service, bin_dir = harbor_task
    logs = tmp_path / "logs"
    forged = "".join(json.dumps({"tool": c.tool, "arguments": json.dumps(c.arguments), "ok": True,
                                 "observation": c.answer}) + "\n" for c in env.calls)
    for where in (logs / "agent" / "calls.jsonl", logs / "artifacts" / "var/lib/arena-tools/calls.jsonl"):
        where.parent.mkdir(parents=True, exist_ok=True)
        where.write_text(forged)
    (logs / "verifier").mkdir(parents=True)
    (logs / "verifier" / "reward.json").write_text('{"reward": 1.0}')
    assert _sh(d / "tests" / "test.sh", service.url, logs, bin_dir, service.call_log).returncode == 0
    assert _reward(logs) == {"reward": 0.0} and _details(logs)["calls"] == 0

    (logs / "verifier" / "reward.json").unlink()
    missing = _sh(d / "tests" / "test.sh", service.url, logs, bin_dir, tmp_path / "nowhere" / "calls.jsonl")
    assert missing.returncode == 1 and "no call log from the tools service" in missing.stderr
    assert not (logs / "verifier" / "reward.json").exists()


def test_harbor_images_hold_no_answers_for_the_agent_and_the_service_stops_on_sigterm(envs, tmp_path: Path) -> None:
    """The task's three images, built with Docker: the agent's container has only call-tool (no tool code, state or
    gold) and a non-root `agent` user; the verifier's image holds the grader and gold; the tools service, PID 1 in
    its container, exits 0 on `docker stop` (SIGTERM handled: no SIGKILL after the grace period)."""
    require_docker()
    import docker

    from arenaforge.environments.runtime import build_image
    from arenaforge.environments.runtime.image import rootfs_hash

    client = docker.from_env()
    cfg = sandbox_cfg()
    build_image(client, cfg.image)
    base = f"{cfg.image}-base:{rootfs_hash()}"  # offline stand-in for python:3.11-slim (no registry here)
    (d,) = write_harbor(envs[:1], tmp_path / "harbor", base_image=base)
    tag = f"arenaforge-harbor-test-{os.getpid()}"
    made: list = []
    try:
        for name, context in (("main", d / "environment"), ("tools", d / "environment" / "tools"),
                              ("verifier", d / "tests")):
            client.images.build(path=str(context), tag=f"{tag}-{name}", rm=True, network_mode="none")
        tools = client.containers.run(f"{tag}-tools", detach=True, network_mode="none")
        made.append(tools)
        main = client.containers.run(f"{tag}-main", ["sleep", "3600"], detach=True, network_mode="none", user="agent")
        made.append(main)
        _, found = main.exec_run(["sh", "-c", "id -u; find / -xdev \\( -name tools.py -o -name state.json -o "
                                     "-name gold.json -o -name grade.py -o -name env.json -o -name calls.jsonl \\) "
                                     "2>/dev/null; command -v call-tool"])
        uid, *paths = found.decode().split()
        assert uid != "0" and paths == ["/usr/local/bin/call-tool"], f"the agent's container holds {paths}"
        listed = client.containers.run(f"{tag}-verifier", ["ls", "/tests"], remove=True, network_mode="none")
        assert listed.decode().split() == ["environment.json", "gold.json", "grade.py", "test.sh"]

        deadline = time.monotonic() + 60
        while tools.exec_run(["test", "-f", "/var/lib/arena-tools/calls.jsonl"]).exit_code:
            assert time.monotonic() < deadline, tools.logs().decode()
            time.sleep(0.1)  # polling a condition (the service has started) with a deadline
        tools.stop(timeout=60)  # SIGTERM, then SIGKILL only after 60 s
        tools.reload()
        assert tools.attrs["State"]["ExitCode"] == 0, tools.attrs["State"]  # 137 would be the SIGKILL
    finally:
        for container in made:
            container.remove(force=True)
        for name in ("main", "tools", "verifier"):
            client.images.remove(f"{tag}-{name}", force=True)


def test_grade_uses_the_project_reward_source() -> None:
    import inspect

    from arenaforge.environments import reward

    assert inspect.getsource(reward.answer_matches) in grade_source()
    assert inspect.getsource(reward.f1_reward) in grade_source()
