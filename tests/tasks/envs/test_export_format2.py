"""Exports of format-2 environments (issue 15), imported BFCL multi-turn tasks (several classes, loader arguments,
tools revealed at a later turn): the Harbor tools service runs them exactly as the sandbox does (every gold call's
observation is the sandbox's), the instruction gives every request in order and offers a revealed tool only at its
turn, verl's rows offer only turn 0's tools; and every exported Harbor task imports back as the same environment."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from arenaforge.environments.containers import TaskContainers
from arenaforge.environments.reward import f1_reward
from arenaforge.environments.runtime import create_pool, run_calls
from arenaforge.schemas.config import SandboxConfig
from arenaforge.schemas.models import Environment
from arenaforge.tracks.envs.export import write_harbor
from arenaforge.tracks.envs.import_harbor import import_tasks
from arenaforge.tracks.train.verl.dataset import write_verl
from arenaforge.warehouse import Warehouse
from tests.support.harbor import ToolsService
from tests.support.requirements import require_bfcl

SANDBOX = SandboxConfig(backend="process", pool_size=1, output_limit_bytes=8 << 20, call_timeout_s=30.0)


@pytest.fixture(scope="module")
def bfcl_envs() -> list[Environment]:
    require_bfcl()
    from arenaforge.tracks.envs.import_bfcl import import_suite, locate

    async def imported():
        async with await create_pool(SANDBOX) as pool:
            return await import_suite(pool, locate(), ["miss_func"], limit=2)

    envs, _ = asyncio.run(imported())
    assert len(envs) == 2 and all(len(e.modules) > 1 and e.tool_turns and not e.code for e in envs)
    return envs


def sandbox_texts(env: Environment) -> list[str]:
    async def go():
        async with await create_pool(SANDBOX) as pool:
            return await run_calls(pool, env, env.calls)

    return [o.text() for o in asyncio.run(go())]


def test_harbor_tools_service_runs_format_2_as_the_sandbox_does(bfcl_envs, tmp_path: Path) -> None:
    env = bfcl_envs[0]
    (d,) = write_harbor([env], tmp_path / "harbor")
    late = next(iter(env.tool_turns))
    instruction = (d / "instruction.md").read_text()
    tools_section = instruction.split("## Tools", 1)[1]
    assert f"- `{late}`" not in tools_section and f'"name": "{late}"' in instruction  # announced at its turn only
    assert instruction.count("## Request ") == len(env.native.turns)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "call-tool").symlink_to(d / "environment" / "call_tool.py")
    service = ToolsService(d / "environment" / "tools", tmp_path / "tools-fs" / "calls.jsonl")
    try:
        run = {**os.environ, "TOOLS_URL": service.url, "LOGS_DIR": str(tmp_path / "logs"), "CALL_LOG": str(service.call_log),
               "PATH": f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin"}
        solved = subprocess.run(["sh", str(d / "solution" / "solve.sh")], env=run, capture_output=True, text=True,
                                timeout=300)
        assert solved.returncode == 0, solved.stderr
        graded = subprocess.run(["sh", str(d / "tests" / "test.sh")], env=run, capture_output=True, text=True, timeout=300)
        assert graded.returncode == 0, graded.stderr
        log = [json.loads(line) for line in service.call_log.read_text().splitlines()]
    finally:
        service.stop()
    texts = sandbox_texts(env)
    assert [c["observation"] for c in log] == texts  # before the fix: every call an AttributeError
    assert len(log) == len(env.calls) and all(c["ok"] for c in log)
    # Harbor's verifier gives the reward our F1 gives the same observations (BFCL's gold replay is not always 1)
    reward = json.loads((tmp_path / "logs" / "verifier" / "reward.json").read_text())
    assert reward == {"reward": f1_reward(env.gold_answers, texts, len(texts)).f1}


def test_verl_rows_offer_only_the_first_turn_s_tools(bfcl_envs, tmp_path: Path) -> None:
    files = write_verl(bfcl_envs, tmp_path / "verl")
    rows = pl.read_parquet(files.train).to_dicts() + pl.read_parquet(files.val).to_dicts()
    for row in rows:
        env = next(e for e in bfcl_envs if e.id == row["extra_info"]["env_id"])
        offered = [t["function"]["name"] for t in json.loads(row["tools"])]
        assert offered == [t.name for t in env.visible_tools(0)] and not set(env.tool_turns) & set(offered)
        assert set(row["extra_info"]["tool_selection"]) == set(offered)
    stored = [Environment.model_validate_json(line) for line in files.environments.read_text().splitlines()]
    assert {e.id for e in stored} == {e.id for e in bfcl_envs}  # modules, loader args and tool turns intact


def test_exported_harbor_tasks_import_back_as_the_same_environments(bfcl_envs, tmp_path: Path) -> None:
    write_harbor(bfcl_envs, tmp_path / "harbor")
    envs, rejections = asyncio.run(import_tasks(TaskContainers(), tmp_path / "harbor", "harbor"))
    assert rejections == [] and [e.id for e in envs] == sorted((e.id for e in bfcl_envs), key=lambda i: next(
        e.name for e in bfcl_envs if e.id == i))
    assert all(e.container is None for e in envs) and envs == sorted(bfcl_envs, key=lambda e: e.name)
    db = tmp_path / "wh.duckdb"
    for new in (2, 0):  # into a fresh warehouse, then again: nothing added
        res = subprocess.run([sys.executable, "-m", "arenaforge.flows.cli", "--db", str(db), "envs", "import", "harbor",
                              str(tmp_path / "harbor")], capture_output=True, text=True, timeout=300)
        assert res.returncode == 0 and json.loads(res.stdout)["new"] == new and json.loads(res.stdout)["ours"] == 2, res.stderr
    stored = Warehouse(db).load(Environment)
    assert sorted(e.id for e in stored) == sorted(e.id for e in bfcl_envs) and all(e.modules and e.tool_turns for e in stored)
    record = tmp_path / "harbor" / bfcl_envs[0].name / "tests" / "environment.json"
    record.write_text(record.read_text().replace('"calls":[', '"calls":[{"tool":"ls","arguments":{}},', 1))
    _, edited = asyncio.run(import_tasks(TaskContainers(), tmp_path / "harbor" / bfcl_envs[0].name, "harbor"))
    assert edited[0].reason == "not_a_task" and "does not match its id" in edited[0].detail
