"""Live MCP servers over stdio, through the `mcp` SDK: list their tools, call them in a session.

One `McpSession` is one server process: `async with McpSession(cmd) as s:` starts it, runs the
MCP handshake and keeps it for a whole agent episode (state stays consistent within it).
Failures of the server are observations, not crashes: a call that outlives its deadline is a
`timeout` outcome, a server that died or broke the protocol is an `error` outcome with
`environment_failure` set, and the session refuses further calls once the process is gone.
Starting a server that never answers the handshake raises `McpServerError` (ingest records it
as a rejection).

mcp 2.x names the schemas `input_schema` / `output_schema` on its pydantic models (1.x used
`inputSchema`); `_tool_dict` reads either.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shlex
import time
from dataclasses import dataclass
from typing import Any

import anyio

from arenaforge.schemas.errors import InputError
from arenaforge.schemas.models import ToolObservation


class McpServerError(InputError):
    """A live MCP server could not be started or listed."""


@dataclass(frozen=True)
class McpTool:
    name: str
    description: str
    input_schema: dict[str, Any]
    output_schema: dict[str, Any] | None


def parse_command(command: str | list[str]) -> list[str]:
    argv = shlex.split(command) if isinstance(command, str) else list(command)
    if not argv:
        raise InputError("empty MCP server command")
    return argv


def _tool_dict(tool: Any) -> McpTool:
    get = tool.get if isinstance(tool, dict) else (lambda k, d=None: getattr(tool, k, d))
    schema = get("input_schema") or get("inputSchema") or {"type": "object", "properties": {}}
    output = get("output_schema") or get("outputSchema")
    return McpTool(name=get("name"), description=get("description") or "", input_schema=dict(schema),
                   output_schema=dict(output) if output else None)


def _result_observation(result: Any, started: float) -> ToolObservation:
    texts = [getattr(c, "text", None) for c in (getattr(result, "content", None) or [])]
    text = "\n".join(t for t in texts if t)
    structured = getattr(result, "structured_content", None) or getattr(result, "structuredContent", None)
    if not text and structured is not None:
        text = json.dumps(structured, ensure_ascii=False)
    duration = time.perf_counter() - started
    if getattr(result, "is_error", False) or getattr(result, "isError", False):
        return ToolObservation(outcome="error", error=text or "the tool reported an error", duration_s=duration)
    if not text:
        return ToolObservation(outcome="no_output", duration_s=duration)
    return ToolObservation(outcome="ok", output=text, duration_s=duration)


class McpSession:
    """One live MCP server process with an initialised client session."""

    def __init__(self, command: str | list[str], start_timeout_s: float = 30.0, call_timeout_s: float = 10.0,
                 cwd: str | None = None) -> None:
        self.argv = parse_command(command)
        self.start_timeout_s = start_timeout_s
        self.call_timeout_s = call_timeout_s
        self.cwd = cwd
        self.server_name: str | None = None
        self.dead: str | None = None  # why the session can no longer be used
        self._stack: contextlib.AsyncExitStack | None = None
        self._session: Any = None
        self._errlog: Any = None

    async def __aenter__(self) -> "McpSession":
        from mcp import ClientSession
        from mcp.client.stdio import StdioServerParameters, stdio_client

        self._stack = contextlib.AsyncExitStack()
        self._errlog = self._stack.enter_context(open(os.devnull, "w"))  # servers log to stderr
        params = StdioServerParameters(command=self.argv[0], args=self.argv[1:], cwd=self.cwd)
        try:
            streams = await self._stack.enter_async_context(stdio_client(params, errlog=self._errlog))
            self._session = await self._stack.enter_async_context(ClientSession(streams[0], streams[1]))
            with anyio.fail_after(self.start_timeout_s):
                init = await self._session.initialize()
        except BaseException as err:
            await self._close_quietly()
            if isinstance(err, (asyncio.CancelledError, KeyboardInterrupt)):
                raise
            reason = "did not answer the MCP handshake in time" if isinstance(err, TimeoutError) else _describe(err)
            raise McpServerError(f"MCP server {shlex.join(self.argv)!r}: {reason}") from None
        info = getattr(init, "server_info", None) or getattr(init, "serverInfo", None)
        self.server_name = getattr(info, "name", None)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self._close_quietly()

    async def _close_quietly(self) -> None:
        stack, self._stack = self._stack, None
        if stack is not None:
            # A dead or hung server can make the SDK's shutdown raise; the process is gone either way.
            with contextlib.suppress(Exception):
                await stack.aclose()

    async def list_tools(self) -> list[McpTool]:
        try:
            with anyio.fail_after(self.start_timeout_s):
                result = await self._session.list_tools()
        except TimeoutError:
            raise McpServerError(f"MCP server {shlex.join(self.argv)!r} did not list its tools in time") from None
        except Exception as err:  # the SDK raises several types for a dead server
            raise McpServerError(f"MCP server {shlex.join(self.argv)!r}: {_describe(err)}") from None
        return [_tool_dict(t) for t in result.tools]

    async def call(self, name: str, arguments: dict[str, Any]) -> tuple[ToolObservation, bool]:
        """(observation, environment_failure) of one tool call."""
        if self.dead:
            return ToolObservation(outcome="error", error=f"MCP server unavailable: {self.dead}"), True
        started = time.perf_counter()
        try:
            with anyio.fail_after(self.call_timeout_s):
                result = await self._session.call_tool(name, arguments)
        except TimeoutError:
            self.dead = f"call to {name} hung for {self.call_timeout_s:g}s"
            return ToolObservation(outcome="timeout", error=self.dead, duration_s=time.perf_counter() - started), True
        except Exception as err:  # dead process, closed stream, protocol error: an environment failure
            self.dead = _describe(err)
            return ToolObservation(outcome="error", error=f"MCP server failed: {self.dead}",
                                   duration_s=time.perf_counter() - started), True
        return _result_observation(result, started), False


def _describe(err: BaseException) -> str:
    if isinstance(err, BaseExceptionGroup):
        return "; ".join(_describe(e) for e in err.exceptions)
    text = str(err).splitlines()[0][:200] if str(err) else ""
    return f"{type(err).__name__}: {text}" if text else type(err).__name__


async def list_server_tools(command: str | list[str], timeout_s: float = 30.0) -> tuple[str | None, list[McpTool]]:
    """(server name from its handshake, tools) of a live server, which is stopped afterwards."""
    async with McpSession(command, start_timeout_s=timeout_s) as session:
        return session.server_name, await session.list_tools()
