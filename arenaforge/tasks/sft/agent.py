"""Multi-turn agent episodes in OpenAI tool-calling form: one `Trajectory` per accepted task (ASTRA §1a.4).

An `Agent` talks to a `ToolExecutor` (live MCP server, sandbox code or simulator, see
`tool_simulator.open_executor`) and returns the conversation. Offline (`PlanAgent`): follows
the task's chain (server-only tasks: the tools whose purpose the query names, in the order
named), fills arguments from earlier outputs first, then from the values the query states,
then from the schema; retries a failed call up to `max_retries_per_call` times, adapts by
skipping a step that keeps failing, and writes its final answer from what it observed.
openai (`ModelAgent`): the model drives the loop through native tool calls.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from arenaforge.schemas.base import Provenance
from arenaforge.schemas.config import Config
from arenaforge.schemas.errors import ParseError, ProviderError
from arenaforge.schemas.models import ChatMessage, FunctionCall, Rejection, Server, Task, Tool, ToolCall, ToolChain, Trajectory
from arenaforge.tasks.models import ChatModel, ChatRequest
from arenaforge.tasks.prompts import load_prompt
from arenaforge.tasks.sft.synthesize_queries import clause
from arenaforge.tasks.sft.tool_graph import humanize, server_rng
from arenaforge.tasks.sft.tool_simulator import SimulatorFactory, ToolExecutor, open_executor, sample_value

_NUM = re.compile(r"^-?\d+(\.\d+)?$")


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


@dataclass
class Episode:
    messages: list[ChatMessage]
    tool_calls: int
    final_answer: str | None
    rejections: list[Rejection] = field(default_factory=list)


class Agent(Protocol):
    async def run(self, server: Server, tools: Sequence[Tool], task: Task, chain: ToolChain | None,
                  executor: ToolExecutor, rng: random.Random) -> Episode: ...


def system_message(server: Server) -> ChatMessage:
    text = load_prompt("sft_agent_system").render(title=server.title or server.name, description=server.description)
    return ChatMessage(role="system", content=text.strip())


def stated_value(query: str, name: str, schema: dict[str, Any]) -> Any:
    """The value the query states for a parameter (`<parameter words> "<value>"`), typed by its schema."""
    match = re.search(re.escape(humanize(name)) + r'\s+"([^"]*)"', query, re.IGNORECASE)
    if match is None:
        return None
    raw = match.group(1)
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


class PlanAgent:
    """Offline: executes the plan, handles faults (retry, then adapt), answers from observations."""

    def __init__(self, max_retries: int, max_turns: int) -> None:
        self.max_retries = max_retries
        self.max_turns = max_turns

    async def run(self, server: Server, tools: Sequence[Tool], task: Task, chain: ToolChain | None,
                  executor: ToolExecutor, rng: random.Random) -> Episode:
        by_name = {t.function.name: t for t in tools}
        plan = [by_name[n] for n in chain.tools if n in by_name] if chain else plan_from_query(task.query, tools)
        messages = [system_message(server), ChatMessage(role="user", content=task.query)]
        memory: dict[str, Any] = {}
        findings: list[tuple[Tool, Any]] = []
        skipped: list[tuple[Tool, str]] = []
        calls = 0
        turns = 0
        for step, tool in enumerate(plan):
            args = self._arguments(tool, task.query, memory, rng)
            attempt = 0
            while True:
                turns += 1
                calls += 1
                call_id = f"call_{calls}"
                thought = self._thought(tool, step, attempt, args, memory)
                messages.append(ChatMessage(role="assistant", content=thought, tool_calls=[ToolCall(
                    id=call_id, function=FunctionCall(name=tool.function.name, arguments=json.dumps(args)))]))
                result = await executor.call(tool.function.name, args)
                obs = result.observation
                messages.append(ChatMessage(role="tool", tool_call_id=call_id, name=tool.function.name, content=obs.text()))
                if obs.outcome in ("ok", "no_output"):
                    value = _parse(obs.output)
                    _remember(memory, value)
                    findings.append((tool, value))
                    break
                attempt += 1
                if attempt > self.max_retries or turns >= self.max_turns or result.environment_failure:
                    skipped.append((tool, obs.error or obs.outcome))
                    break
            if turns >= self.max_turns:
                break
        answer = self._answer(findings, skipped, plan)
        messages.append(ChatMessage(role="assistant", content=answer))
        return Episode(messages, calls, answer)

    def _arguments(self, tool: Tool, query: str, memory: dict[str, Any], rng: random.Random) -> dict[str, Any]:
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

    @staticmethod
    def _thought(tool: Tool, step: int, attempt: int, args: dict[str, Any], memory: dict[str, Any]) -> str:
        if attempt:
            return f"The previous call to {tool.function.name} failed; retrying (attempt {attempt + 1})."
        reused = [k for k, v in args.items() if memory.get(_norm(k)) == v]
        why = f" using {', '.join(humanize(k) for k in reused)} from the earlier result" if reused else ""
        return f"Step {step + 1}: I will {clause(tool)}{why}."

    @staticmethod
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


class ModelAgent:
    """openai: native tool calling; the model decides every call and the final answer."""

    def __init__(self, model: ChatModel, max_turns: int) -> None:
        self.model = model
        self.max_turns = max_turns

    async def run(self, server: Server, tools: Sequence[Tool], task: Task, chain: ToolChain | None,
                  executor: ToolExecutor, rng: random.Random) -> Episode:
        messages = [system_message(server), ChatMessage(role="user", content=task.query)]
        specs = [t.function.as_openai_tool() for t in tools]
        calls = 0
        final = None
        for _ in range(self.max_turns):
            wire = [m.model_dump(mode="json", exclude_none=True) for m in messages]
            response = await self.model.complete(ChatRequest(step="agent", messages=wire, tools=specs))
            reply = response.message
            messages.append(reply)
            if not reply.tool_calls:
                final = reply.content
                break
            for call in reply.tool_calls:
                calls += 1
                try:
                    args = json.loads(call.function.arguments or "{}")
                    if not isinstance(args, dict):
                        raise ValueError("arguments are not a JSON object")
                except ValueError as err:
                    messages.append(ChatMessage(role="tool", tool_call_id=call.id, name=call.function.name,
                                                content=f"Error: invalid arguments ({err})"))
                    continue
                result = await executor.call(call.function.name, args)
                messages.append(ChatMessage(role="tool", tool_call_id=call.id, name=call.function.name,
                                            content=result.observation.text()))
        return Episode(messages, calls, final)


def agent_for(cfg: Config, model: ChatModel | None) -> Agent:
    agents: dict[str, Callable[[], Agent]] = {
        "offline": lambda: PlanAgent(cfg.sft.max_retries_per_call, cfg.sft.max_turns),
        "openai": lambda: ModelAgent(model, cfg.sft.max_turns),  # type: ignore[arg-type]
    }
    return agents[cfg.model.backend]()


@dataclass
class TrajectoryBatch:
    trajectories: list[Trajectory] = field(default_factory=list)
    rejections: list[Rejection] = field(default_factory=list)
    faults: int = 0
    calls: int = 0
    walked: list[tuple[str, str, str]] = field(default_factory=list)  # (server, src, dst) edges used


async def run_episodes(tasks: Sequence[Task], servers: dict[str, Server], tools: dict[str, list[Tool]],
                       chains: dict[str, ToolChain], agent: Agent, make_simulator: SimulatorFactory, cfg: Config,
                       seed: int, run_id: str | None, provenance: Provenance, concurrency: int = 64,
                       sandbox_pool: Any = None) -> TrajectoryBatch:
    """One trajectory per task (bounded concurrency); failures are rejections, never crashes."""
    batch = TrajectoryBatch()
    gate = asyncio.Semaphore(concurrency)

    async def one(task: Task) -> None:
        async with gate:
            server = servers[task.server]
            server_tools = tools[task.server]
            chain = chains.get(task.chain_id) if task.chain_id else None
            rng = server_rng(seed, task.id, "episode")
            async with open_executor(server, server_tools, make_simulator, rng, task.id, cfg, sandbox_pool) as executor:
                try:
                    episode = await agent.run(server, server_tools, task, chain, executor, rng)
                except (ParseError, ProviderError) as err:
                    batch.rejections += executor.log.rejections
                    batch.rejections.append(Rejection(stage="trajectory", subject=task.id, reason="model_failed",
                                                      detail=str(err)[:1000], run_id=run_id))
                    return
            log = executor.log
            batch.rejections += [r.model_copy(update={"run_id": run_id}) for r in log.rejections]
            batch.faults += log.faults
            batch.calls += log.calls
            if len(episode.messages) < 3 or episode.tool_calls == 0:
                batch.rejections.append(Rejection(stage="trajectory", subject=task.id, reason="no_tool_calls",
                                                  detail="the agent answered without calling any tool",
                                                  payload=[m.model_dump(mode="json") for m in episode.messages[-2:]],
                                                  run_id=run_id))
                return
            called = [c.function.name for m in episode.messages if m.tool_calls for c in m.tool_calls]
            distinct = list(dict.fromkeys(called))
            batch.walked += [(task.server, a, b) for a, b in zip(distinct, distinct[1:], strict=False)]
            batch.trajectories.append(Trajectory(
                task_id=task.id, server=task.server, messages=episode.messages,
                tools=[t.function for t in server_tools], executor=executor.kind,  # type: ignore[arg-type]
                fault_rate=cfg.sft.fault_rate if executor.kind == "simulator" else 0.0,
                faults_injected=log.faults, tool_calls=episode.tool_calls, final_answer=episode.final_answer,
                parents=[task.id], run_id=run_id, provenance=provenance))

    await asyncio.gather(*[one(t) for t in tasks])
    batch.trajectories.sort(key=lambda t: t.id)
    return batch
