"""Multi-turn agent episodes in OpenAI tool-calling form: one `Trajectory` per accepted task (ASTRA §1a.4).

The run's model drives the loop through native tool calls (the offline provider plays an agent that
executes the task's plan: `tracks/sft/offline_agent.py`); each call goes to a `ToolExecutor` (live MCP
server, sandbox code or simulator, see `tool_simulator.open_executor`) and its result comes back as a
tool message. After `max_turns` tool-calling turns the model is asked for its final answer without
tools. A call whose infrastructure failed (the MCP server died, the sandbox worker was lost) ends the
episode as an environment failure: such a conversation is not training data.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from arenaforge.environments.runtime.errors import EnvironmentFailure
from arenaforge.schemas.base import Provenance
from arenaforge.schemas.config import Config
from arenaforge.schemas.errors import ProviderError
from arenaforge.schemas.models import ChatMessage, Rejection, Server, Task, Tool, ToolChain, Trajectory
from arenaforge.schemas.reasons import RejectReason
from arenaforge.services.models import ChatModel, ChatRequest, Step, reads_prompts
from arenaforge.tracks.sft.grounded_arguments import grounded_tools
from arenaforge.tracks.sft.prompts import load_prompt
from arenaforge.tracks.sft.tool_graph import server_rng
from arenaforge.tracks.sft.tool_simulator import SimulatorFactory, ToolExecutor, open_executor


def _offline_rules() -> ModuleType:
    from arenaforge.tracks.sft import offline_agent  # its rules read this module's types: loaded after it

    return offline_agent


@dataclass
class Episode:
    messages: list[ChatMessage]
    tool_calls: int
    final_answer: str | None
    rejections: list[Rejection] = field(default_factory=list)


@dataclass(frozen=True)
class AgentInputs:
    """What an agent turn is rendered from (the offline provider's agent reads the plan from these)."""

    episode: str  # one key per episode: the offline agent keeps its place in the plan under it
    server: Server
    tools: tuple[Tool, ...]
    task: Task
    chain: ToolChain | None
    rng: random.Random = field(compare=False)
    max_turns: int = 12
    max_retries: int = 2


# a turn is a chat message (tool calls or the final answer), not a JSON answer; its prompt is the system message
AGENT = Step("sft.agent", prompt="sft_agent_system", schema=None, max_tokens=400,
             offline=lambda: _offline_rules().agent)


def system_message(server: Server) -> ChatMessage:
    text = load_prompt(AGENT.prompt).render(title=server.title or server.name, description=server.description)
    return ChatMessage(role="system", content=text.strip())


class Agent:
    """The run's model drives the episode: native tool calls, then a final answer."""

    def __init__(self, model: ChatModel, max_turns: int, max_retries: int = 2, first_turn: str = "auto",
                 grounded_arguments: bool = False) -> None:
        self.model = model
        self.grounded_arguments = grounded_arguments  # identifier and number arguments: the conversation's values
        self.first_turn = None if first_turn == "auto" else first_turn  # the first turn's tool_choice
        self.max_turns = max_turns
        self.max_retries = max_retries

    async def run(self, server: Server, tools: Sequence[Tool], task: Task, chain: ToolChain | None,
                  executor: ToolExecutor, rng: random.Random) -> Episode:
        messages = [system_message(server), ChatMessage(role="user", content=task.query)]
        # A model reads the whole conversation and the tool specs; rules (the offline agent) read only the
        # newest message, a tool's result, and keep the rest in their plan.
        reads = reads_prompts(self.model)
        specs = [t.function.as_openai_tool() for t in tools] if reads else None
        wire = [m.model_dump(mode="json", exclude_none=True) for m in messages]  # grows with `messages`
        inputs = AgentInputs(task.id, server, tuple(tools), task, chain, rng, self.max_turns, self.max_retries)
        calls = 0
        final = None
        for turn in range(self.max_turns + 1):
            last = turn == self.max_turns  # out of tool turns: ask for the answer
            choice = "none" if last else self.first_turn if turn == 0 else None
            if reads and self.grounded_arguments:
                specs = grounded_tools(tools, messages)
            response = await self.model.complete(ChatRequest(step=AGENT.name, messages=wire if reads else wire[-1:],
                                                             tools=specs, tool_choice=choice,
                                                             max_tokens=AGENT.max_tokens, inputs=inputs))
            reply = response.message
            messages.append(reply)
            wire.append(reply.model_dump(mode="json", exclude_none=True))
            if not reply.tool_calls:
                final = reply.content
                break
            if last:
                break  # it kept calling tools when told to answer: no final answer
            for call in reply.tool_calls:
                calls += 1
                try:
                    args = json.loads(call.function.arguments or "{}")
                    if not isinstance(args, dict):
                        raise ValueError("arguments are not a JSON object")  # noqa: TRY004 (caught below with bad JSON)
                except ValueError as err:
                    messages.append(ChatMessage(role="tool", tool_call_id=call.id, name=call.function.name,
                                                content=f"Error: invalid arguments ({err})"))
                    wire.append(messages[-1].model_dump(mode="json", exclude_none=True))
                    continue
                result = await executor.call(call.function.name, args)
                if result.environment_failure:  # the MCP server or the sandbox failed, not the tool nor the agent
                    raise EnvironmentFailure(f"{call.function.name}: {result.observation.error or result.observation.outcome}")
                messages.append(ChatMessage(role="tool", tool_call_id=call.id, name=call.function.name,
                                            content=result.observation.text()))
                wire.append(messages[-1].model_dump(mode="json", exclude_none=True))
        return Episode(messages, calls, final)


@dataclass
class TrajectoryBatch:
    trajectories: list[Trajectory] = field(default_factory=list)
    rejections: list[Rejection] = field(default_factory=list)
    faults: int = 0
    calls: int = 0


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
                except ProviderError as err:
                    batch.rejections += executor.log.rejections
                    batch.rejections.append(Rejection.of_error("trajectory", task.id, err, run_id=run_id))
                    return
                except EnvironmentFailure as err:  # the tools' infrastructure failed, not the agent: not SFT data
                    batch.rejections += executor.log.rejections
                    batch.rejections.append(Rejection.of_error("trajectory", task.id, err, run_id=run_id,
                                                               reason=RejectReason.ENVIRONMENT_FAILURE))
                    return
            log = executor.log
            batch.rejections += [r.model_copy(update={"run_id": run_id}) for r in log.rejections]
            batch.faults += log.faults
            batch.calls += log.calls
            if not (episode.final_answer or "").strip():  # it never answered: not a finished conversation
                batch.rejections.append(Rejection(stage="trajectory", subject=task.id, reason="no_final_answer",
                                                  detail=f"no final answer after {episode.tool_calls} tool call(s)",
                                                  payload=[m.model_dump(mode="json") for m in episode.messages[-2:]],
                                                  run_id=run_id))
                return
            if len(episode.messages) < 3 or episode.tool_calls == 0:
                batch.rejections.append(Rejection(stage="trajectory", subject=task.id, reason="no_tool_calls",
                                                  detail="the agent answered without calling any tool",
                                                  payload=[m.model_dump(mode="json") for m in episode.messages[-2:]],
                                                  run_id=run_id))
                return
            batch.trajectories.append(Trajectory(
                task_id=task.id, server=task.server, messages=episode.messages,
                tools=[t.function for t in server_tools], executor=executor.kind,  # type: ignore[arg-type]
                fault_rate=executor.fault_rate,
                faults_injected=log.faults, tool_calls=episode.tool_calls, final_answer=episode.final_answer,
                parents=[task.id], run_id=run_id, provenance=provenance))

    await asyncio.gather(*[one(t) for t in tasks])
    batch.trajectories.sort(key=lambda t: t.id)
    return batch
