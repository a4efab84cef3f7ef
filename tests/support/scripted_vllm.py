"""A scripted stand-in for `vllm serve`: real HTTP on loopback, vLLM's completions wire format.

`POST /v1/completions` accepts a token-id prompt and answers with `choices[0].token_ids`
(newer vLLM, `return_token_ids`) and/or `logprobs.tokens` as "token_id:N" strings
(`return_tokens_as_token_ids`) plus `token_logprobs`. What to generate comes from
`responder(prompt_ids, body) -> list[int]`; every request body is kept in `requests`.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

Responder = Callable[[list[int], dict[str, Any]], list[int]]


class ScriptedVllm:
    def __init__(self, responder: Responder, *, legacy: bool = False, logprob: float = -0.25) -> None:
        self.responder = responder
        self.legacy = legacy  # old servers: ids only as "token_id:N" strings
        self.logprob = logprob
        self.requests: list[dict[str, Any]] = []
        self.senders: list[str] = []  # each request's User-Agent, beside `requests` (who sent an unexpected one)
        self.fail_next = 0  # answer this many requests with 503 first
        self._server: ThreadingHTTPServer | None = None

    @property
    def base_url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/v1"

    def start(self) -> "ScriptedVllm":
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                return None

            def do_POST(self) -> None:  # noqa: N802 (http.server API)
                length = int(self.headers.get("Content-Length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                if self.path != "/v1/completions":
                    return self._send(404, {"error": {"message": f"no route {self.path}"}})
                outer.requests.append(body)
                outer.senders.append(self.headers.get("User-Agent", ""))
                if outer.fail_next > 0:
                    outer.fail_next -= 1
                    return self._send(503, {"error": {"message": "overloaded"}})
                prompt = body.get("prompt")
                if not (isinstance(prompt, list) and all(isinstance(t, int) for t in prompt)):
                    return self._send(400, {"error": {"message": "this server only takes token-id prompts"}})
                ids = list(outer.responder(prompt, body))
                finish = "stop"
                if len(ids) > body.get("max_tokens", 16):
                    ids, finish = ids[: body["max_tokens"]], "length"
                choice: dict[str, Any] = {
                    "index": 0,
                    "text": "",
                    "finish_reason": finish,
                    "stop_reason": None,
                    "logprobs": {
                        "tokens": [f"token_id:{t}" for t in ids],
                        "token_logprobs": [outer.logprob] * len(ids),
                        "top_logprobs": [{f"token_id:{t}": outer.logprob} for t in ids],
                        "text_offset": list(range(len(ids))),
                    },
                }
                if not outer.legacy and body.get("return_token_ids"):
                    choice["token_ids"] = ids
                    choice["prompt_token_ids"] = prompt
                self._send(200, {
                    "id": f"cmpl-{len(outer.requests)}", "object": "text_completion", "model": body.get("model"),
                    "choices": [choice],
                    "usage": {"prompt_tokens": len(prompt), "completion_tokens": len(ids),
                              "total_tokens": len(prompt) + len(ids)},
                })

            def _send(self, status: int, payload: dict[str, Any]) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


def text_responder(tokenizer: Any, respond: Callable[[str, int], str]) -> Responder:
    """A responder that writes text from the decoded prompt (like ScriptedEngine) and ends the turn."""
    counter = {"n": 0}
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")

    def responder(prompt_ids: list[int], _body: dict[str, Any]) -> list[int]:
        index = counter["n"]
        counter["n"] += 1
        text = respond(tokenizer.decode(prompt_ids), index)
        return tokenizer.encode(text, add_special_tokens=False) + [eos]

    return responder
