"""`envs export --format openenv` under OpenEnv's own server and client (PyPI openenv 0.10.0, its own venv:
scripts/setup-openenv.sh): on the environments the offline pipeline synthesizes, reset and a step per gold call
return the sandbox's observations and end with our F1 (1 for the gold calls), and an episode with no call ends
with 0."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest

from arenaforge.environments.reward import f1_reward
from arenaforge.environments.runtime import create_pool, run_calls
from arenaforge.tracks.envs.export import write_openenv
from tests.support.envs_fakes import sandbox_cfg
from tests.support.prefect_server import free_port
from tests.support.requirements import require_openenv
from tests.support.synth_envs import spread, synthesize

pytestmark = pytest.mark.slow
EPISODE = Path(__file__).resolve().parents[2] / "support" / "openenv_episode.py"


def _episode(python: Path, url: str, calls: list[dict]) -> dict:
    done = subprocess.run([str(python), str(EPISODE), url, json.dumps(calls)], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "PYTHONPATH": ""})
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_openenv_client_replays_gold_calls_to_reward_one(tmp_path: Path) -> None:
    python = require_openenv()
    synthesized = synthesize(24)
    assert len(synthesized) >= 20
    envs = spread(synthesized, 8)
    dirs = write_openenv(envs, tmp_path / "openenv")

    async def sandbox_texts() -> list[list[str]]:
        async with await create_pool(sandbox_cfg()) as pool:
            return [[o.text() for o in await run_calls(pool, env, env.calls)] for env in envs]

    expected = asyncio.run(sandbox_texts())
    for env, d, texts in zip(envs, dirs, expected, strict=True):
        port = free_port()
        server = subprocess.Popen([str(python), str(d / "server.py"), "--port", str(port)], cwd=d,
                                  env={**os.environ, "PYTHONPATH": ""}, stdout=subprocess.DEVNULL,
                                  stderr=subprocess.PIPE, text=True)
        try:
            deadline = time.monotonic() + 120
            while True:  # wait for the server to listen
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=1).close()
                    break
                except OSError:
                    assert server.poll() is None, server.stderr.read()
                    assert time.monotonic() < deadline, "the OpenEnv server did not listen"
                    time.sleep(0.1)  # polling a condition with a deadline
            url = f"http://127.0.0.1:{port}"
            gold = _episode(python, url, [{"tool": c.tool, "arguments": c.arguments} for c in env.calls])
            empty = _episode(python, url, [])
        finally:
            server.terminate()
            server.wait(timeout=60)
        assert gold["prompt"] == env.question and [s["observation"] for s in gold["steps"]] == texts, env.name
        assert gold["final_reward"] == f1_reward(env.gold_answers, texts, len(texts)).f1 == 1.0 and gold["done"]
        assert empty["final_reward"] == 0.0 and empty["steps"] == [] and empty["done"]
