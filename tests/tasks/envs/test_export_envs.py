"""Exports: verl Parquet (loads with polars), Harbor task dirs whose test.sh writes reward.json, JSON-lines."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest

from arenaforge.environments.runtime import create_pool
from arenaforge.schemas.models import Environment
from arenaforge.tasks.envs.build_tools import ToolBuilder
from arenaforge.tasks.envs.decompose_qa import QASpec, QASynthesizer
from arenaforge.tasks.envs.distractors import DistractorMix, choose_distractors
from arenaforge.tasks.envs.export import grade_source, write_harbor, write_jsonl, write_verl
from arenaforge.tasks.envs.knowledge import load_sample
from arenaforge.tasks.envs.synthesize_env import synthesize_environments
from arenaforge.tasks.envs.tool_impl import assemble
from tests.support.envs_fakes import fake_embed, sandbox_cfg
from tests.support.models import offline_model


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
    chosen = choose_distractors(drafts, DistractorMix(), fake_embed)
    return [assemble(d.qa, d.tools, c.tools, [t.name for t in c.tools], None) for d, c in zip(drafts, chosen, strict=True)]


def test_verl_parquet_loads_with_polars(envs, tmp_path: Path) -> None:
    path = write_verl(envs, tmp_path / "verl.parquet")
    df = pl.read_parquet(path)
    assert df.height == len(envs)
    assert {"prompt", "agent_name", "reward_model", "extra_info", "tools", "data_source"} <= set(df.columns)
    row = df.row(0, named=True)
    assert row["prompt"][-1]["role"] == "user" and row["prompt"][-1]["content"] == envs[0].question
    assert json.loads(row["reward_model"]["ground_truth"]) == envs[0].gold_answers
    assert row["extra_info"]["env_id"] == envs[0].id
    env_json = json.loads(row["extra_info"]["tools_kwargs"]["arena"]["create_kwargs"]["env_json"])
    assert Environment.model_validate(env_json).id == envs[0].id
    assert [t["function"]["name"] for t in json.loads(row["tools"])] == [t.name for t in envs[0].tools]


def test_jsonl_round_trips(envs, tmp_path: Path) -> None:
    path = write_jsonl(envs, tmp_path / "envs.jsonl")
    back = [Environment.model_validate_json(line) for line in path.read_text().splitlines()]
    assert [e.id for e in back] == [e.id for e in envs]


def _run(script: Path, env_dir: Path, logs: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "ENV_DIR": str(env_dir), "LOGS_DIR": str(logs), "PATH": f"{Path(sys.executable).parent}:/usr/bin:/bin"}
    return subprocess.run(["sh", str(script)], env=env, capture_output=True, text=True, timeout=60)


def test_harbor_task_dirs_solve_and_grade(envs, tmp_path: Path) -> None:
    dirs = write_harbor(envs, tmp_path / "harbor", image="arenaforge-sandbox:test")
    assert len(dirs) == len(envs)
    d, env = dirs[0], envs[0]
    for rel in ("instruction.md", "task.toml", "environment/Dockerfile", "solution/solve.sh", "tests/test.sh"):
        assert (d / rel).is_file(), rel
    assert (d / "environment" / "Dockerfile").read_text().startswith("FROM arenaforge-sandbox:test")
    import tomllib

    assert tomllib.loads((d / "task.toml").read_text())["metadata"]["id"] == env.id
    env_dir = d / "environment" / "env"
    # no calls yet: reward 0
    logs = tmp_path / "logs-empty"
    assert _run(d / "tests" / "test.sh", env_dir, logs).returncode == 0
    assert json.loads((logs / "verifier" / "reward.json").read_text())["reward"] == 0.0
    # the gold solution: reward 1
    logs = tmp_path / "logs-gold"
    solved = _run(d / "solution" / "solve.sh", env_dir, logs)
    assert solved.returncode == 0, solved.stderr
    graded = _run(d / "tests" / "test.sh", env_dir, logs)
    assert graded.returncode == 0, graded.stderr
    reward = json.loads((logs / "verifier" / "reward.json").read_text())
    assert reward["reward"] == 1.0 and reward["subtasks"] == len(env.gold_answers)
    # a distractor call costs precision
    distractor = env.distractors[0]
    logs = tmp_path / "logs-extra"
    _run(d / "solution" / "solve.sh", env_dir, logs)
    subprocess.run([sys.executable, str(env_dir / "call.py"), distractor, "{}"], env={**os.environ, "ENV_DIR": str(env_dir),
                   "LOGS_DIR": str(logs)}, capture_output=True, text=True, timeout=30)
    _run(d / "tests" / "test.sh", env_dir, logs)
    assert 0 < json.loads((logs / "verifier" / "reward.json").read_text())["reward"] < 1.0


def test_grade_uses_the_project_reward_source() -> None:
    import inspect

    from arenaforge.environments import reward

    assert inspect.getsource(reward.answer_matches) in grade_source()
    assert inspect.getsource(reward.f1_reward) in grade_source()
