"""Scripted agents behind the scripted OpenAI-compatible server (arenaforge.testing.scripted_openai), for
harnesses that drive a model over HTTP: each chat request is answered from the environment its first user message
asks about, and from how many tool results the conversation already holds. Streamed requests (`"stream": true`,
as verifiers' clients send) get the same reply as server-sent chat.completion.chunk events."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from arenaforge.schemas.models import Environment
from arenaforge.testing.scripted_openai import Reply, chat_completion

ANSWER = "That is all I found."


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content or [] if isinstance(part, dict))


def streamed(request: dict[str, Any], body: dict[str, Any]) -> Reply | dict[str, Any]:
    """`body` (a chat.completion) as the stream of chunks OpenAI sends when the request asked for one."""
    if not request.get("stream"):
        return body
    choice = body["choices"][0]
    message = choice["message"]
    delta: dict[str, Any] = {"role": "assistant", "content": message.get("content")}
    if message.get("tool_calls"):
        delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(message["tool_calls"])]
    base = {"id": body["id"], "created": body["created"], "model": body["model"], "object": "chat.completion.chunk"}
    chunks = [base | {"choices": [{"index": 0, "delta": delta, "finish_reason": None}]},
              base | {"choices": [{"index": 0, "delta": {}, "finish_reason": choice["finish_reason"]}]},
              base | {"choices": [], "usage": body["usage"]}]
    text = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
    return Reply(body=text, headers={"content-type": "text/event-stream"})


def replay_policy(envs: Sequence[Environment], plan: Callable[[Environment], list[dict[str, Any]]],
                  prompt: Callable[[Environment], str]) -> Callable[[dict[str, Any]], Reply | dict[str, Any]]:
    """A responder that makes `plan(env)`'s calls ({"name", "arguments"}), one per turn, then answers `ANSWER`;
    `env` is the one whose `prompt(env)` is the conversation's first user message."""
    by_prompt = {prompt(env): env for env in envs}
    assert len(by_prompt) == len(envs), "two environments share a question: the policy could not tell them apart"

    def respond(request: dict[str, Any]) -> Reply | dict[str, Any]:
        messages = request["messages"]
        env = by_prompt[next(_text(m.get("content")) for m in messages if m["role"] == "user")]
        made = sum(1 for m in messages if m["role"] == "tool")
        calls = plan(env)
        if made < len(calls):
            return streamed(request, chat_completion(tool_calls=[calls[made]]))
        return streamed(request, chat_completion(content=ANSWER))

    return respond
