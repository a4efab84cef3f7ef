"""Offline answer of `sft.agent`: an agent that executes the task's plan and answers from what it observed.

The plan is the task's chain (server-only tasks: the tools whose purpose the query names, in the order
named). Arguments come from earlier outputs first, then from the values the query states
(`<parameter words> "<value>"`), then from the schema; a failed call is retried up to
`max_retries` times, then the step is skipped; the final answer reports what was found. One episode is
one Python generator kept in the provider's state between the agent's turns.
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Iterator, Sequence
from typing import Any

from arenaforge.schemas.models import ChatMessage, FunctionCall, Tool, ToolCall
from arenaforge.services.models import ChatRequest
from arenaforge.services.models.providers.offline import OfflineModel
from arenaforge.tracks.sft.agent import AgentInputs
from arenaforge.tracks.sft.synthesize_queries import clause
from arenaforge.tracks.sft.tool_graph import humanize
from arenaforge.tracks.sft.tool_simulator import sample_value

NO_OUTPUT = "(no output)"  # ToolObservation.text() of a call that returned nothing
_NUM = re.compile(r"^-?\d+(\.\d+)?$")


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def agent(request: ChatRequest, model: OfflineModel) -> ChatMessage:
    inputs: AgentInputs = request.inputs
    key = ("sft.agent", inputs.episode)
    episode = model.state.get(key)
    if episode is None:
        episode = model.state[key] = _plan_episode(inputs)
        turn = next(episode)
    else:
        last = request.messages[-1]
        turn = episode.send(last.get("content") or "")
    if not turn.tool_calls:
        del model.state[key]  # the episode is over
    return turn


def _plan_episode(inputs: AgentInputs) -> Iterator[ChatMessage]:
    """The episode as a generator: yields assistant turns, receives the text of each call's result."""
    by_name = {t.function.name: t for t in inputs.tools}
    task, chain, rng = inputs.task, inputs.chain, inputs.rng
    plan = [by_name[n] for n in chain.tools if n in by_name] if chain else plan_from_query(task.query, inputs.tools)
    memory: dict[str, Any] = {}
    findings: list[tuple[Tool, Any]] = []
    skipped: list[tuple[Tool, str]] = []
    calls = 0
    turns = 0
    for step, tool in enumerate(plan):
        args = _arguments(tool, task.query, memory, rng)
        attempt = 0
        while True:
            turns += 1
            calls += 1
            thought = _thought(tool, step, attempt, args, memory)
            result: str = yield ChatMessage(role="assistant", content=thought, tool_calls=[ToolCall(
                id=f"call_{calls}", function=FunctionCall(name=tool.function.name, arguments=json.dumps(args)))])
            if not result.startswith(("Error:", "Timeout:")):  # ok, or "(no output)"
                value = _parse("" if result == NO_OUTPUT else result)
                _remember(memory, value)
                findings.append((tool, value))
                break
            attempt += 1
            if attempt > inputs.max_retries or turns >= inputs.max_turns:
                skipped.append((tool, result.split(": ", 1)[-1]))
                break
        if turns >= inputs.max_turns:
            break
    yield ChatMessage(role="assistant", content=_answer(findings, skipped, plan))


def stated_value(query: str, name: str, schema: dict[str, Any]) -> Any:
    """The value the query states for a parameter (`<parameter words> "<value>"`, or `'<value>'` where the query's
    schema bars `"`), typed by its schema."""
    match = re.search(re.escape(humanize(name)) + r"""\s+(?:"([^"]*)"|'([^']*)')""", query, re.IGNORECASE)
    if match is None:
        return None
    raw = match.group(1) if match.group(1) is not None else match.group(2)
    t = schema.get("type") if isinstance(schema, dict) else None
    if t in ("integer", "number") and _NUM.match(raw):
        return int(float(raw)) if t == "integer" else float(raw)
    if t == "boolean" and raw.lower() in ("true", "false"):
        return raw.lower() == "true"
    if t in ("array", "object") or raw[:1] in "[{":
        try:
            return json.loads(raw)
        except json.JSONDecodeError:
            return None
    return raw


def plan_from_query(query: str, tools: Sequence[Tool]) -> list[Tool]:
    """Tools whose purpose clause the query contains, in order of appearance (server-only tasks)."""
    ql = query.lower()
    found = [(ql.find(clause(t).lower()), t) for t in tools]
    named = sorted((pos, t.function.name, t) for pos, t in found if pos >= 0)
    if named:
        return [t for _, _, t in named]
    words = set(re.findall(r"[a-z]{4,}", ql))
    best = max(tools, key=lambda t: (len(words & set(re.findall(r"[a-z]{4,}", t.function.description.lower()))),
                                     t.function.name))
    return [best]


def _remember(memory: dict[str, Any], value: Any, depth: int = 0) -> None:
    if isinstance(value, dict) and depth < 4:
        for k, v in value.items():
            if isinstance(v, (str, int, float)) and not isinstance(v, bool):
                memory[_norm(k)] = v
            else:
                _remember(memory, v, depth + 1)
    elif isinstance(value, list) and value and depth < 4:
        _remember(memory, value[0], depth + 1)


def _summary(value: Any, limit: int = 4) -> str:
    if isinstance(value, dict):
        parts = []
        for k, v in list(value.items())[:limit]:
            if isinstance(v, list):
                parts.append(f"{humanize(k)}: {len(v)} item(s)" + (f" (first: {_summary(v[0], 2)})" if v else ""))
            elif isinstance(v, dict):
                parts.append(f"{humanize(k)}: {_summary(v, 2)}")
            else:
                parts.append(f"{humanize(k)} {v}")
        return ", ".join(parts)
    if isinstance(value, list):
        return f"{len(value)} item(s)" + (f", first: {_summary(value[0], 2)}" if value else "")
    return str(value)[:200]


def _arguments(tool: Tool, query: str, memory: dict[str, Any], rng: random.Random) -> dict[str, Any]:
    props = tool.function.parameters.get("properties") or {}
    required = set(tool.function.parameters.get("required") or [])
    args: dict[str, Any] = {}
    for name, schema in props.items():
        stated = stated_value(query, name, schema if isinstance(schema, dict) else {})
        if _norm(name) in memory and stated is None:
            args[name] = memory[_norm(name)]
        elif stated is not None:
            args[name] = stated
        elif name in required:
            args[name] = sample_value(schema, name, rng, hint=tool.function.description)
    return args


def _thought(tool: Tool, step: int, attempt: int, args: dict[str, Any], memory: dict[str, Any]) -> str:
    if attempt:
        return f"The previous call to {tool.function.name} failed; retrying (attempt {attempt + 1})."
    reused = [k for k, v in args.items() if memory.get(_norm(k)) == v]
    why = f" using {', '.join(humanize(k) for k in reused)} from the earlier result" if reused else ""
    return f"Step {step + 1}: I will {clause(tool)}{why}."


def _answer(findings: list[tuple[Tool, Any]], skipped: list[tuple[Tool, str]], plan: Sequence[Tool]) -> str:
    lines = []
    for tool, value in findings:
        lines.append(f"- {clause(tool)[0].upper() + clause(tool)[1:]}: {_summary(value)}.")
    for tool, why in skipped:
        lines.append(f"- I could not {clause(tool)}: the service kept failing ({why[:120]}).")
    if not findings:
        return "I could not complete the request: every tool call failed.\n" + "\n".join(lines)
    head = "Here is what I found." if not skipped else "I completed part of the request."
    return head + "\n" + "\n".join(lines)


def _parse(text: str) -> Any:
    try:
        return json.loads(text)
    except (json.JSONDecodeError, TypeError):
        return text
