"""`envs export --format verifiers` under verifiers' own evaluation (PyPI verifiers 0.4.0, `verifiers.v1`, its own
venv: scripts/setup-verifiers.sh): the exported package is pip-installed, and `vf-eval` runs every synthesized
environment with verifiers' built-in `null` chat harness, its MCP tool servers, interception and rubric, against a
scripted agent on loopback (tests/support/scripted_policy.py). Per episode, verifiers' reward equals our F1 over
what our sandbox returns for the same calls (|d| <= 1e-6) and the tool messages are the sandbox's observations,
for a gold replay (reward 1), an agent that answers without tools (0), and one that repeats a call (in between)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from pathlib import Path

import pytest

from arenaforge.environments.reward import f1_reward
from arenaforge.environments.runtime import create_pool, run_calls
from arenaforge.schemas.models import Environment
from arenaforge.testing.scripted_openai import ScriptedOpenAI
from arenaforge.tracks.envs.export import write_verifiers
from arenaforge.tracks.train.rollout.episodes import user_turns
from tests.support.envs_fakes import sandbox_cfg
from tests.support.requirements import require_verifiers
from tests.support.scripted_policy import ANSWER, replay_policy
from tests.support.synth_envs import spread, synthesize

pytestmark = pytest.mark.slow

POLICIES = {  # name -> the calls the scripted agent makes before it answers
    "gold": lambda env: list(env.calls),
    "no_tools": lambda env: [],
    "repeats_a_call": lambda env: [*env.calls, env.calls[0]],
}


def _question(env: Environment) -> str:
    return "\n\n".join(user_turns(env))


def _vf_eval(python: Path, site: Path, url: str, out: Path, n: int) -> list[dict]:
    """verifiers' own eval CLI over the installed package; its traces, one episode per line."""
    bin_dir = python.parent
    done = subprocess.run(
        [str(bin_dir / "vf-eval"), "arenaforge-envs", "-m", "scripted", "--client.base-url", url,
         "--env.agent.harness.id", "null", "--env.agent.runtime.type", "subprocess", "-n", str(n), "-c", "8",
         "--no-push", "--no-rich", "-o", str(out), "--run.dir", "run"],
        capture_output=True, text=True, timeout=1500,
        env={**os.environ, "PYTHONPATH": str(site), "PATH": f"{bin_dir}:{os.environ['PATH']}",
             "PRIME_API_KEY": "scripted"})
    assert done.returncode == 0, done.stderr[-5000:]
    return [json.loads(line) for line in (out / "run" / "traces.jsonl").read_text().splitlines() if line.strip()]


def test_vf_eval_reward_matches_our_f1_per_episode(tmp_path: Path) -> None:
    python = require_verifiers()
    synthesized = synthesize(24)
    assert len(synthesized) >= 20
    envs = spread(synthesized, 8)
    root = write_verifiers(envs, tmp_path / "verifiers")
    site = tmp_path / "site"
    installed = subprocess.run([str(python), "-m", "pip", "install", "-q", "--no-deps", "--target", str(site),
                                str(root)], capture_output=True, text=True, timeout=600)
    assert installed.returncode == 0, installed.stderr[-3000:]
    assert (site / "arenaforge_envs" / "envs" / envs[0].name / "task.json").is_file()
    by_id = {env.id: env for env in envs}

    async def sandbox_texts(plan) -> dict[str, list[str]]:
        async with await create_pool(sandbox_cfg()) as pool:
            out = {}
            for env in envs:
                calls = plan(env)
                out[env.id] = [o.text() for o in await run_calls(pool, env, calls)] if calls else []
            return out

    rewards: dict[str, list[float]] = {}
    for name, plan in POLICIES.items():
        expected = asyncio.run(sandbox_texts(plan))
        server = ScriptedOpenAI()
        server.responder = replay_policy(envs, lambda env, plan=plan: [
            {"name": c.tool, "arguments": c.arguments} for c in plan(env)], _question)
        server.start()
        try:
            episodes = _vf_eval(python, site, server.url, tmp_path / name, len(envs))
        finally:
            server.stop()
        assert sorted(e["task"]["data"]["id"] for e in episodes) == sorted(by_id), name
        rewards[name] = []
        for episode in episodes:
            env = by_id[episode["task"]["data"]["id"]]
            (trace,) = episode["traces"]
            assert trace["ok"] and not trace["errors"], (name, env.name, trace["errors"])
            messages = [node["message"] for node in trace["nodes"]]
            assert [m["content"] for m in messages if m["role"] == "tool"] == expected[env.id], (name, env.name)
            assert messages[-1] == {"role": "assistant", "content": ANSWER} or messages[-1]["content"] == ANSWER
            ours = f1_reward(env.gold_answers, expected[env.id], len(plan(env))).f1
            theirs = trace["rewards"]["f1"]["score"]
            assert abs(theirs - ours) <= 1e-6, (name, env.name, theirs, ours)
            rewards[name].append(theirs)
    assert rewards["gold"] == [1.0] * len(envs)
    assert rewards["no_tools"] == [0.0] * len(envs)
    assert all(0.0 < r < 1.0 for r in rewards["repeats_a_call"])
