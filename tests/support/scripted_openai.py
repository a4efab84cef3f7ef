"""A scripted OpenAI-compatible HTTP server on loopback: the test double for a language model.

Real HTTP (stdlib ThreadingHTTPServer, one thread per request), real OpenAI wire format for
`POST /v1/chat/completions` and `GET /v1/models`. What it answers is programmable:

    server.responder = lambda req: Reply(body=chat_completion(content='{"a": 1}'))
    server.script([Reply(status=429), Reply(body=chat_completion(content="hi"))])  # in order

A responder may return a `Reply` or a plain dict (treated as a 200 JSON body). Every request
body is recorded in `server.requests`; `server.max_in_flight` tracks peak concurrency.
"""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

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
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------------ control
    @property
    def url(self) -> str:
        assert self._server is not None
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def script(self, replies: list[Reply | dict[str, Any]]) -> None:
        """Answer the next requests with these replies, in order, before falling back to `responder`."""
        with self._lock:
            self._script.extend(replies)

    def chat_requests(self) -> list[dict[str, Any]]:
        return [r for r in self.requests if "messages" in r]

    def start(self) -> None:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def do_GET(self) -> None:
                if self.path.rstrip("/").endswith("/models"):
                    self._send(Reply(body={"object": "list", "data": [{"id": "scripted", "object": "model"}]}))
                else:
                    self._send(Reply(status=404, body=error_body(404, "not found")))

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                with owner._lock:
                    owner.requests.append(body)
                    owner.in_flight += 1
                    owner.max_in_flight = max(owner.max_in_flight, owner.in_flight)
                    scripted = owner._script.popleft() if owner._script else None
                try:
                    reply = scripted if scripted is not None else owner.responder(body)
                    if isinstance(reply, dict):
                        reply = Reply(body=reply)
                    if reply.delay_s:
                        time.sleep(reply.delay_s)
                    self._send(reply)
                finally:
                    with owner._lock:
                        owner.in_flight -= 1

            def _send(self, reply: Reply) -> None:
                payload = reply.body
                if payload is None and reply.status >= 400:
                    payload = error_body(reply.status, f"scripted HTTP {reply.status}")
                data = payload.encode() if isinstance(payload, str) else json.dumps(payload).encode()
                self.send_response(reply.status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for k, v in reply.headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._server.request_queue_size = 512
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
