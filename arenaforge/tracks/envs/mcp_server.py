"""One environment's tools as an MCP server (`arenaforge envs serve ENV`), over stdio or streamable HTTP.

Each MCP session (the stdio connection; an `Mcp-Session-Id` over HTTP) gets its own sandbox session of the
environment, opened at its first tool call, so sessions never share state; all are closed at shutdown (an HTTP
session that ends earlier keeps its sandbox session until then: the SDK tells the handlers nothing of its end). A call's result is the sandbox's observation text, as `eval` and training show it (`is_error` for the
error, timeout and limit outcomes); a failure of the sandbox itself is an MCP error, never an observation.
MCP has no turns: every tool of a format-2 environment is listed and callable from the start, as in a gold replay.
The episode's F1 (`environments.reward.f1_reward` over the session's calls so far) is the resource REWARD_URI,
read by whoever scores the episode; no tool reveals it. This module owns the MCP mapping; the sandbox is `Pool`'s.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

from arenaforge.environments.reward import f1_reward
from arenaforge.environments.runtime import create_pool
from arenaforge.environments.runtime.pool import Pool, Session
from arenaforge.schemas.config import SandboxConfig
from arenaforge.schemas.models import Environment

REWARD_URI = "arenaforge://episode/reward"
ERROR_OUTCOMES = ("error", "timeout", "limit")


@dataclass
class Episode:
    """One MCP session's sandbox session and the observations it has received."""

    session: Session
    observations: list[str] = field(default_factory=list)


class EnvironmentServer:
    """The MCP handlers for one environment over one sandbox pool (see the module docstring)."""

    def __init__(self, env: Environment, pool: Pool) -> None:
        self.env, self.pool = env, pool
        self._episodes: dict[str, Episode] = {}
        self._lock = asyncio.Lock()

    def tools(self) -> list[Any]:
        import mcp_types as types

        return [types.Tool(name=t.name, description=t.description,
                           input_schema=t.parameters or {"type": "object", "properties": {}}) for t in self.env.tools]

    async def episode(self, key: str) -> Episode:
        async with self._lock:
            if key not in self._episodes:
                session = await self.pool.open(self.env)
                if self.env.tool_turns:
                    session.turn = max(self.env.tool_turns.values())
                self._episodes[key] = Episode(session)
            return self._episodes[key]

    async def call(self, key: str, name: str, arguments: dict[str, Any]) -> Any:
        import mcp_types as types

        episode = await self.episode(key)
        observation = await self.pool.call(episode.session, name, arguments)
        text = observation.text()
        episode.observations.append(text)
        return types.CallToolResult(content=[types.TextContent(text=text)],
                                    is_error=observation.outcome in ERROR_OUTCOMES)

    def reward(self, key: str) -> dict[str, Any]:
        episode = self._episodes.get(key)
        observations = episode.observations if episode else []
        return f1_reward(self.env.gold_answers, observations, len(observations)).model_dump()

    async def close(self) -> None:
        episodes, self._episodes = list(self._episodes.values()), {}
        for episode in episodes:
            await self.pool.close(episode.session)

    def server(self) -> Any:
        """The lowlevel MCP server with this environment's handlers."""
        import mcp_types as types
        from mcp.server.lowlevel import Server

        async def list_tools(ctx, params):
            return types.ListToolsResult(tools=self.tools())

        async def call_tool(ctx, params):
            return await self.call(_session_key(ctx), params.name, dict(params.arguments or {}))

        async def list_resources(ctx, params):
            return types.ListResourcesResult(resources=[types.Resource(
                uri=REWARD_URI, name="episode-reward", mime_type="application/json",
                description="F1 reward of this session's tool calls so far (recall, precision, solved, calls).")])

        async def read_resource(ctx, params):
            if str(params.uri) != REWARD_URI:
                raise ValueError(f"unknown resource {params.uri}; this server has {REWARD_URI}")
            return types.ReadResourceResult(contents=[types.TextResourceContents(
                uri=REWARD_URI, mime_type="application/json", text=json.dumps(self.reward(_session_key(ctx))))])

        return Server(f"arenaforge-{self.env.name}", instructions=self.env.question, on_list_tools=list_tools,
                      on_call_tool=call_tool, on_list_resources=list_resources, on_read_resource=read_resource)


def _session_key(ctx: Any) -> str:
    """The MCP session a request belongs to: its HTTP session id, or the one stdio connection."""
    request = getattr(ctx, "request", None)
    headers = getattr(request, "headers", None)
    return (headers.get("mcp-session-id") if headers is not None else None) or "stdio"


@asynccontextmanager
async def environment_server(env: Environment, cfg: SandboxConfig | None = None) -> AsyncIterator[EnvironmentServer]:
    """An EnvironmentServer on a started sandbox pool; every session and the pool closed at exit."""
    async with await create_pool(cfg) as pool:
        served = EnvironmentServer(env, pool)
        try:
            yield served
        finally:
            await served.close()


async def serve_stdio(env: Environment, cfg: SandboxConfig | None = None) -> None:
    """Serve `env` over this process's stdin/stdout until the client disconnects."""
    from mcp.server.stdio import stdio_server

    async with environment_server(env, cfg) as served, stdio_server() as (read, write):
        server = served.server()
        await server.run(read, write, server.create_initialization_options())


async def serve_http(env: Environment, cfg: SandboxConfig | None = None, host: str = "127.0.0.1",
                     port: int = 8765) -> None:
    """Serve `env` over streamable HTTP at http://HOST:PORT/mcp (one sandbox session per MCP session)."""
    import uvicorn

    async with environment_server(env, cfg) as served:
        app = served.server().streamable_http_app(host=host)
        await uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning")).serve()
