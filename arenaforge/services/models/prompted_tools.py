"""Tool calling for endpoints that have none: the tools go into the prompt and the turn comes back as JSON.

Some servers people run cannot do native tool calls: vLLM started without `--enable-auto-tool-choice
--tool-call-parser` refuses every request that carries `tools` (it defaults `tool_choice` to "auto"),
and `transformers serve` or a small model's chat template silently ignores them. In `prompt` mode the
client renders the conversation without the native fields and asks for one JSON object per turn:

    {"tool_calls": [{"name": "get_order", "arguments": {"order_id": "W1"}}]}   or   {"answer": "..."}

The answer is validated like every structured answer (negotiated response_format, repair, bounded
re-asks) and turned back into an assistant message with tool calls, so a step never knows which way its
tools were called.
"""

from __future__ import annotations

import json
from typing import Any

from arenaforge.schemas.models import ChatMessage


def turn_schema(tools: list[dict[str, Any]], tool_choice: str | None, max_calls: int = 8) -> dict[str, Any]:
    """The JSON Schema of one turn: tool calls (names from `tools`, at most `max_calls`) or a final answer, as
    `tool_choice` allows."""
    # one branch per tool, its name a const and its arguments the tool's own parameters: an endpoint that decodes
    # under the schema (llama.cpp, vLLM) can only call a real tool with arguments of the right shape
    calls = {"type": "array", "minItems": 1, "maxItems": max_calls, "items": {"anyOf": [
        {"type": "object", "required": ["name", "arguments"], "additionalProperties": False,
         "properties": {"name": {"const": t["function"]["name"]}, "arguments": _arguments_schema(t)}}
        for t in tools]}}
    answer = {"type": "string", "maxLength": 2000}
    if tool_choice == "none":
        return {"type": "object", "required": ["answer"], "properties": {"answer": answer}}
    if tool_choice == "required":
        return {"type": "object", "required": ["tool_calls"], "properties": {"tool_calls": calls}}
    return {"type": "object", "minProperties": 1, "properties": {"tool_calls": calls, "answer": answer}}


def _arguments_schema(tool: dict[str, Any]) -> dict[str, Any]:
    params = tool["function"].get("parameters") or {}
    if not isinstance(params, dict) or params.get("type", "object") != "object":
        return {"type": "object"}
    return {"type": "object", **{k: v for k, v in params.items() if k != "type"}}


def render(messages: list[dict[str, Any]], tools: list[dict[str, Any]], tool_choice: str | None
           ) -> list[dict[str, Any]]:
    """The conversation without native tool fields: the tools in a system message, earlier calls as the
    assistant's JSON and their results as user messages (every chat template knows these three roles)."""
    specs = [{"name": t["function"]["name"], "description": t["function"].get("description", ""),
              "parameters": t["function"].get("parameters", {})} for t in tools]
    what = {"none": 'Give your final answer now as {"answer": "..."}.',
            "required": 'Call at least one tool: {"tool_calls": [{"name": ..., "arguments": {...}}]}.'}.get(
        tool_choice or "", 'Either call tools with {"tool_calls": [{"name": ..., "arguments": {...}}]} '
                           'or give your final answer with {"answer": "..."}.')
    guide = ("You can call these tools:\n" + json.dumps(specs, ensure_ascii=False)
             + "\nReply with one JSON object and nothing else. " + what)
    out: list[dict[str, Any]] = []
    for m in messages:
        role = m.get("role")
        if role == "assistant" and m.get("tool_calls"):
            calls = [{"name": c["function"]["name"], "arguments": _arguments(c["function"].get("arguments"))}
                     for c in m["tool_calls"]]
            out.append({"role": "assistant", "content": json.dumps({"tool_calls": calls}, ensure_ascii=False)})
        elif role == "assistant":
            out.append({"role": "assistant",
                        "content": json.dumps({"answer": m.get("content") or ""}, ensure_ascii=False)})
        elif role == "tool":
            out.append({"role": "user", "content": f"Result of {m.get('name') or 'the tool'}: {m.get('content', '')}"})
        else:
            out.append({"role": role, "content": m.get("content") or ""})
    return add_instruction(out, guide)


def add_instruction(messages: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    """`messages` with `text` in its system message: one system message, first, is what every chat template takes."""
    if messages and messages[0].get("role") == "system":
        return [{**messages[0], "content": f"{messages[0].get('content') or ''}\n\n{text}"}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


def to_message(parsed: dict[str, Any], position: int) -> ChatMessage:
    """The assistant message a validated turn stands for; `position` (its index in the conversation) makes
    call ids unique within the conversation and the same on every run."""
    calls = parsed.get("tool_calls") or []
    if calls:
        return ChatMessage(role="assistant", content=None, tool_calls=[
            {"id": f"call_{position}_{i}", "type": "function",
             "function": {"name": c["name"], "arguments": json.dumps(c["arguments"], ensure_ascii=False)}}
            for i, c in enumerate(calls)])
    return ChatMessage(role="assistant", content=str(parsed.get("answer", "")))


def _arguments(raw: Any) -> Any:
    if isinstance(raw, str):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw or {}
