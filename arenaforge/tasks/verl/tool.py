"""A verl `BaseTool`-style tool over sandbox sessions (create / execute / calc_reward / release).

For verl's own `ToolAgentLoop`: each instance is one sandbox session of one environment
(`create_kwargs.env_json`, the dataset's tools_kwargs); `execute` runs a named tool of that
environment and returns the observation text; `calc_reward` is the F1 reward over what the
instance observed. Note verl's ToolAgentLoop creates and releases an instance around every
call, so state does not carry across calls there: prefer `ArenaAgentLoop` (one session per
episode). The verl base class is mixed in by `as_verl_tool()` only when verl imports.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any
from uuid import uuid4

from arenaforge.environments.reward import f1_reward
from arenaforge.schemas.models import Environment, RewardBreakdown
from arenaforge.tasks.rollout.episodes import FAILED_OUTCOMES, SandboxPool


@dataclass
class _Instance:
    env: Environment
    session: Any
    observations: list[str] = field(default_factory=list)
    calls: int = 0
    errors: int = 0


class ArenaTool:
    """Tool calls against one environment per instance; `name` is the tool the model calls."""

    def __init__(self, pool: SandboxPool, name: str = "arena") -> None:
        self.pool = pool
        self.name = name
        self._instances: dict[str, _Instance] = {}

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, Any]:
        create_kwargs = kwargs.get("create_kwargs", kwargs)
        env = Environment.model_validate_json(create_kwargs["env_json"])
        instance_id = instance_id or uuid4().hex
        self._instances[instance_id] = _Instance(env=env, session=await self.pool.open(env))
        return instance_id, None

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> tuple[str, float, dict]:
        inst = self._instances[instance_id]
        tool = kwargs.get("tool_name") or parameters.pop("tool_name", None) or self.name
        inst.calls += 1
        if tool not in {t.name for t in inst.env.tools}:
            inst.errors += 1
            return f"Error: unknown tool {tool!r}", 0.0, {"outcome": "error"}
        obs = await self.pool.call(inst.session, tool, parameters)
        text = obs.text()
        inst.observations.append(text)
        if obs.outcome in FAILED_OUTCOMES:
            inst.errors += 1
        return text, 0.0, {"outcome": obs.outcome}

    def breakdown(self, instance_id: str) -> RewardBreakdown:
        inst = self._instances[instance_id]
        return f1_reward(inst.env.gold_answers, inst.observations, inst.calls)

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        return self.breakdown(instance_id).f1

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        inst = self._instances.pop(instance_id, None)
        if inst is not None:
            await self.pool.close(inst.session)


def as_verl_tool() -> type:
    """ArenaTool with verl's BaseTool mixed in (needs verl); verl 0.9 wraps results in ToolResponse."""
    from verl.tools.base_tool import BaseTool
    from verl.tools.schemas import ToolResponse

    from arenaforge.tasks.verl.verl_adapter import _pool

    class VerlArenaTool(ArenaTool, BaseTool):  # type: ignore[misc]
        def __init__(self, config: dict, tool_schema: Any) -> None:
            BaseTool.__init__(self, config, tool_schema)
            ArenaTool.__init__(self, pool=None, name=tool_schema.function.name)  # type: ignore[arg-type]

        async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, Any]:
            if self.pool is None:
                self.pool = await _pool()  # one sandbox pool per verl worker process
            instance_id, _ = await ArenaTool.create(self, instance_id, **kwargs)
            return instance_id, ToolResponse()

        async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> tuple[Any, float, dict]:
            text, reward, info = await ArenaTool.execute(self, instance_id, parameters, **kwargs)
            return ToolResponse(text=text), reward, info

    return VerlArenaTool


def tool_schema_json(env: Environment) -> str:
    return json.dumps([t.as_openai_tool() for t in env.tools])
