"""A scripted OpenAI-compatible HTTP server on loopback: the test double for a language model.

Real HTTP (aiohttp.web on its own event loop in a background thread), real OpenAI wire format for
`POST /v1/chat/completions` and `GET /v1/models`. What it answers is programmable:

    server.responder = lambda req: Reply(body=chat_completion(content='{"a": 1}'))
    server.script([Reply(status=429), Reply(body=chat_completion(content="hi"))])  # in order

A responder may return a `Reply` or a plain dict (treated as a 200 JSON body). Every request
body is recorded in `server.requests`; `server.max_in_flight` tracks peak concurrency and
`server.in_flight_log` every change of the in-flight count as (time.perf_counter(), count), so a
benchmark can integrate the endpoint's busy share over any window (perf_counter is the system's
monotonic clock, comparable across processes on Linux).

aiohttp rather than the stdlib's ThreadingHTTPServer: the stdlib server costs ~4 ms of CPU per
request and topped out near 250 requests/s, below what the benchmarks ask of it (128 in flight
answered after 300 ms is ~430/s). Responders run on the server's loop, so they must not block.

`capacity` makes it a server that works on at most that many requests at once (the rest wait their
turn, as a vLLM replica's batch does), so its throughput is capacity / delay. `kill()` ends it the
way a crashed replica ends: the listening socket closes and every open connection is cut, requests
in flight included; `start(port)` brings a server back on a port that was used before.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

_ids = itertools.count()


@dataclass
class Reply:
    status: int = 200
    body: Any = None  # dict -> JSON; str -> sent verbatim (for invalid-JSON tests)
    delay_s: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)


def chat_completion(
    content: str | None = None,
    tool_calls: list[dict[str, Any]] | None = None,
    model: str = "scripted",
    prompt_tokens: int = 10,
    completion_tokens: int = 5,
) -> dict[str, Any]:
    """A chat.completion body in OpenAI's format."""
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if tool_calls:
        message["tool_calls"] = [
            {
                "id": call.get("id", f"call_{next(_ids)}"),
                "type": "function",
                "function": {"name": call["name"], "arguments": json.dumps(call.get("arguments", {}))},
            }
            for call in tool_calls
        ]
    return {
        "id": f"chatcmpl-{next(_ids)}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": message, "finish_reason": "tool_calls" if tool_calls else "stop"}],
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def error_body(status: int, message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "scripted_error", "code": status}}


class ScriptedOpenAI:
    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.responder: Callable[[dict[str, Any]], Reply | dict[str, Any]] = lambda req: Reply(
            body=chat_completion(content="ok")
        )
        self._script: deque[Reply | dict[str, Any]] = deque()
        self._lock = threading.Lock()
        self.in_flight = 0
        self.max_in_flight = 0
        self.in_flight_log: list[tuple[float, int]] = []
        self._port: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self.capacity: int | None = None
        self._working: asyncio.Semaphore | None = None
        self._runner: web.AppRunner | None = None
        self._site: web.SockSite | None = None

    # ------------------------------------------------------------------ control
    @property
    def url(self) -> str:
        assert self._port is not None
        return f"http://127.0.0.1:{self._port}/v1"

    def script(self, replies: list[Reply | dict[str, Any]]) -> None:
        """Answer the next requests with these replies, in order, before falling back to `responder`."""
        with self._lock:
            self._script.extend(replies)

    def chat_requests(self) -> list[dict[str, Any]]:
        return [r for r in self.requests if "messages" in r]

    def start(self, port: int = 0) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", port))
        self._port = sock.getsockname()[1]
        loop = asyncio.new_event_loop()
        app = web.Application(client_max_size=64 * 2**20)
        app.router.add_get("/{path:.*}", self._get)
        app.router.add_post("/{path:.*}", self._post)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        loop.run_until_complete(runner.setup())
        site = web.SockSite(runner, sock, backlog=512)
        loop.run_until_complete(site.start())
        self._loop, self._runner, self._site = loop, runner, site
        if self.capacity:
            self._working = asyncio.Semaphore(self.capacity)  # Python 3.10+: binds to the loop on first use

        def serve() -> None:
            asyncio.set_event_loop(loop)
            loop.run_forever()
            loop.run_until_complete(runner.cleanup())
            loop.close()

        self._thread = threading.Thread(target=serve, name="scripted-openai", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._loop is not None and self._thread is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=10)
            self._loop = None

    def kill(self) -> None:
        """Stop listening and cut every open connection at once, then stop (a crashed replica)."""
        loop = self._loop
        if loop is None or self._thread is None:
            return

        async def crash() -> None:
            assert self._site is not None and self._runner is not None and self._runner.server is not None
            await self._site.stop()
            for handler in self._runner.server.connections:
                if handler.transport is not None:
                    handler.transport.abort()
            for task in asyncio.all_tasks():  # requests being answered end with their connections
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(crash(), loop).result(timeout=30)
        self.stop()

    # ------------------------------------------------------------------ HTTP
    async def _get(self, request: web.Request) -> web.Response:
        if request.path.rstrip("/").endswith("/models"):
            return self._response(Reply(body={"object": "list", "data": [{"id": "scripted", "object": "model"}]}))
        return self._response(Reply(status=404, body=error_body(404, "not found")))

    async def _post(self, request: web.Request) -> web.Response:
        body = json.loads(await request.read() or b"{}")
        with self._lock:
            self.requests.append(body)
            self._count(+1)
            scripted = self._script.popleft() if self._script else None
        try:
            reply = scripted if scripted is not None else self.responder(body)
            if isinstance(reply, dict):
                reply = Reply(body=reply)
            if self._working is not None:
                async with self._working:
                    await asyncio.sleep(reply.delay_s)
            elif reply.delay_s:
                await asyncio.sleep(reply.delay_s)
            return self._response(reply)
        finally:
            with self._lock:
                self._count(-1)

    def _count(self, step: int) -> None:
        self.in_flight += step
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        self.in_flight_log.append((time.perf_counter(), self.in_flight))

    @staticmethod
    def _response(reply: Reply) -> web.Response:
        payload = reply.body
        if payload is None and reply.status >= 400:
            payload = error_body(reply.status, f"scripted HTTP {reply.status}")
        data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
        headers = {"content-type": "application/json", **reply.headers}
        return web.Response(body=data, status=reply.status, headers=headers)

