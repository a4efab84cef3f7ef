"""`arenaforge envs serve` under the real `mcp` client (stdio, and streamable HTTP): every gold call returns the
observation our sandbox returns, on the environments the offline pipeline synthesizes; the episode's F1 resource is
our reward; two MCP sessions over HTTP get sandbox sessions of their own."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from arenaforge.environments.reward import f1_reward
from arenaforge.environments.runtime import create_pool, run_calls
from arenaforge.schemas.models import Environment
from arenaforge.tracks.envs.export import write_jsonl
from arenaforge.tracks.envs.mcp_server import REWARD_URI
from tests.support.envs_fakes import sandbox_cfg
from tests.support.synth_envs import synthesize

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def exported(tmp_path_factory) -> tuple[list[Environment], Path]:
    envs = synthesize(24)
    assert len(envs) >= 20
    return envs, write_jsonl(envs, tmp_path_factory.mktemp("mcp") / "environments.jsonl")


def _server_env() -> dict[str, str]:
    cfg = sandbox_cfg()  # the sandbox the comparison runs in
    return {**os.environ, "ARENAFORGE_SANDBOX__BACKEND": cfg.backend, "NO_COLOR": "1",
            "ARENAFORGE_SANDBOX__PROCESS_ALLOWS_MODEL_CODE": str(cfg.process_allows_model_code).lower()}


def _serve_cmd(jsonl: Path, env: Environment, *extra: str) -> list[str]:
    return [sys.executable, "-m", "arenaforge.flows.cli", "envs", "serve", env.id, "--jsonl", str(jsonl), *extra]


async def _episode(session, env: Environment) -> tuple[list[str], list[bool], dict, list[str]]:
    listed = [t.name for t in (await session.list_tools()).tools]
    texts, errors = [], []
    for call in env.calls:
        result = await session.call_tool(call.tool, call.arguments)
        texts.append("".join(c.text for c in result.content))
        errors.append(result.is_error)
    read = await session.read_resource(REWARD_URI)
    return texts, errors, json.loads(read.contents[0].text), listed


def test_mcp_stdio_gold_calls_match_the_sandbox(exported) -> None:
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    envs, jsonl = exported

    async def sandbox_texts() -> list[list[str]]:
        async with await create_pool(sandbox_cfg()) as pool:
            return [[o.text() for o in await run_calls(pool, env, env.calls)] for env in envs]

    expected = asyncio.run(sandbox_texts())

    async def through_mcp(env: Environment):
        cmd = _serve_cmd(jsonl, env)
        params = StdioServerParameters(command=cmd[0], args=cmd[1:], env=_server_env())
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            empty = json.loads((await session.read_resource(REWARD_URI)).contents[0].text)
            return (empty, *await _episode(session, env))

    for env, texts in zip(envs, expected, strict=True):
        empty, got, errors, reward, listed = asyncio.run(through_mcp(env))
        assert got == texts, env.name
        assert listed == [t.name for t in env.tools] and errors == [t.startswith("Error") for t in texts]
        assert empty["f1"] == 0.0 and empty["calls"] == 0
        assert reward == f1_reward(env.gold_answers, texts, len(texts)).model_dump(), env.name


def test_mcp_http_sessions_get_their_own_sandbox_session(exported, tmp_path: Path) -> None:
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    from tests.support.prefect_server import free_port

    envs, jsonl = exported
    env = envs[0]
    port = free_port()
    proc = subprocess.Popen(_serve_cmd(jsonl, env, "--transport", "http", "--port", str(port)), env=_server_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}/mcp"
    try:
        deadline = time.monotonic() + 120
        while True:  # wait for the port to accept connections (the pool starts first)
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert proc.poll() is None, proc.stderr.read()
                assert time.monotonic() < deadline, "serve --transport http did not listen"
                time.sleep(0.1)  # polling a condition with a deadline

        async def two_sessions():
            async with streamable_http_client(url) as (r1, w1), ClientSession(r1, w1) as one:
                await one.initialize()
                first = await _episode(one, env)
                async with streamable_http_client(url) as (r2, w2), ClientSession(r2, w2) as two:
                    await two.initialize()
                    fresh = json.loads((await two.read_resource(REWARD_URI)).contents[0].text)
                return first, fresh

        (texts, _, reward, _), fresh = asyncio.run(two_sessions())
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    assert reward["calls"] == len(env.calls) and reward == f1_reward(env.gold_answers, texts, len(texts)).model_dump()
    assert fresh["calls"] == 0  # the second MCP session did not see the first one's calls
