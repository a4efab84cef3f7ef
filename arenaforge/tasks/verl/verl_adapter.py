"""verl's side of the agent loop: import only where verl is installed (its workers load this
module through `agent_loop_config_path`, entry `_target_: arenaforge.tasks.verl.verl_adapter.ArenaAgentLoop`).

Each verl AgentLoopWorker process opens one sandbox pool on first use (config from the
`ARENAFORGE_SANDBOX__*` environment the Ray job sets) and reuses it for every sample.
"""

from __future__ import annotations

import asyncio
from typing import Any
from uuid import uuid4

from verl.experimental.agent_loop.agent_loop import AgentLoopBase, AgentLoopMetrics, AgentLoopOutput, register

from arenaforge.schemas.config import load_config
from arenaforge.tasks.rollout.episodes import RolloutConfig
from arenaforge.tasks.verl.agent_loop import ArenaAgentCore

_POOL: Any = None
_POOL_LOCK = asyncio.Lock()


async def _pool() -> Any:
    global _POOL
    async with _POOL_LOCK:
        if _POOL is None:
            from arenaforge.environments.runtime import create_pool

            _POOL = await create_pool(load_config().sandbox)
    return _POOL


@register("arena_agent")
class ArenaAgentLoop(AgentLoopBase):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        rollout = self.config.actor_rollout_ref.rollout
        multi = rollout.multi_turn
        self.rollout_cfg = RolloutConfig(
            max_turns=int(multi.max_assistant_turns or 8),
            max_length=int(rollout.response_length),
            max_tokens_per_turn=int(rollout.response_length),
        )

    async def run(self, sampling_params: dict[str, Any], **kwargs: Any) -> AgentLoopOutput:
        core = ArenaAgentCore(self.server_manager, self.tokenizer, await _pool(), self.rollout_cfg)
        out = await core.run(sampling_params, request_id=uuid4().hex, **kwargs)
        return AgentLoopOutput(
            prompt_ids=out["prompt_ids"],
            response_ids=out["response_ids"][: self.rollout_cfg.max_length],
            response_mask=out["response_mask"][: self.rollout_cfg.max_length],
            response_logprobs=out["response_logprobs"][: self.rollout_cfg.max_length],
            reward_score=out["reward_score"],
            num_turns=out["num_turns"],
            metrics=AgentLoopMetrics(**out["metrics"]),
            extra_fields=out["extra_fields"],
        )
