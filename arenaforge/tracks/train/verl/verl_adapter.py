"""verl's side of the hand-off: import only where verl is installed. verl's workers load it by name:

    ArenaAgentLoop   `_target_` of `arena_agent` in agent_loops.yaml (agent_loop_config_path): one sandbox
                     session per episode, our tokens/masks/F1 reward (`agent_loop.ArenaAgentCore`)
    VerlArenaTool    `class_name` of every tool in tool_config.yaml (multi_turn.tool_config_path), for verl's
                     stock `tool_agent` loop: a BaseTool that runs one environment function per call

Both read the environments from the `environments.jsonl` the config files name. Each verl worker process
opens one sandbox pool on first use (config from the `ARENAFORGE_SANDBOX__*` environment the job sets)
and reuses it for every sample.
"""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register
from verl.tools.base_tool import BaseTool
from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse

from arenaforge.schemas.config import load_config
from arenaforge.tracks.train.params import EpisodeParams
from arenaforge.tracks.train.verl.agent_loop import ArenaAgentCore
from arenaforge.tracks.train.verl.dataset import AGENT_NAME, load_environment
from arenaforge.tracks.train.verl.tool import ArenaTool

_POOL: Any = None
_POOL_LOCK = asyncio.Lock()


async def _pool() -> Any:
    global _POOL
    async with _POOL_LOCK:
        if _POOL is None:
            from arenaforge.environments.runtime import create_pool

            _POOL = await create_pool(load_config().sandbox)
    return _POOL


@register(AGENT_NAME)
class ArenaAgentLoop(AgentLoopBase):
    def __init__(self, *args: Any, environments: str, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.environments = environments
        rollout = self.config.actor_rollout_ref.rollout
        self.rollout_cfg = EpisodeParams(
            max_turns=int(rollout.multi_turn.max_assistant_turns or EpisodeParams().max_turns),
            max_length=int(rollout.response_length),
            max_tokens_per_turn=int(rollout.response_length),
        ).rollout_config()

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        core = ArenaAgentCore(self.server_manager, self.tokenizer, await _pool(), self.rollout_cfg, self.environments)
        out = await core.run(sampling_params, request_id=uuid4().hex, **kwargs)
        limit = self.rollout_cfg.max_length
        return AgentLoopOutput(
            prompt_ids=out["prompt_ids"],
            response_ids=out["response_ids"][:limit],
            response_mask=out["response_mask"][:limit],
            response_logprobs=out["response_logprobs"][:limit],
            reward_score=out["reward_score"],
            num_turns=out["num_turns"],
            metrics=AgentLoopMetrics(**out["metrics"]),
            extra_fields=out["extra_fields"],
        )


class VerlArenaTool(ArenaTool, BaseTool):  # type: ignore[misc]
    """One verl tool name; each instance runs `create_kwargs.function` of environment `create_kwargs.env_id`."""

    def __init__(self, config: dict, tool_schema: OpenAIFunctionToolSchema) -> None:
        BaseTool.__init__(self, config, tool_schema)
        ArenaTool.__init__(self, pool=None, name=tool_schema.function.name)  # type: ignore[arg-type]
        self.environments = config["environments"]

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, ToolResponse]:
        if self.pool is None:
            self.pool = await _pool()  # one sandbox pool per verl worker process
        create_kwargs = kwargs.get("create_kwargs") or {}
        env = load_environment(self.environments, create_kwargs["env_id"])
        instance_id, _ = await self.open(env, create_kwargs.get("function", self.name), instance_id)
        return instance_id, ToolResponse()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> tuple[ToolResponse, float,
                                                                                                  dict]:
        text, reward, info = await ArenaTool.execute(self, instance_id, parameters)
        return ToolResponse(text=text), reward, info
