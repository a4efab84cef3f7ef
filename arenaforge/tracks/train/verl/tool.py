"""The body of a verl `BaseTool` over sandbox sessions, without verl (CPU-testable).

An instance is one sandbox session of one environment, calling one of its functions (`open`);
`execute` runs it and returns the observation text; `calc_reward` is the F1 reward over what the
instance observed; `release` closes the session. verl's stock `ToolAgentLoop` creates and releases
an instance around every call, so nothing carries over between calls there (our environments'
tools read their initial state; prefer `ArenaAgentLoop`, one session per episode, for tools that
write). `verl_adapter.VerlArenaTool` mixes in verl's BaseTool and its `create`.

A sandbox failure (`EnvironmentFailure`: a worker died, the machine was overloaded) is not the agent's:
the call answers with a note saying so, the instance is marked `env_failure`, and its reward is 0 with
`env_failure` in the step's metrics. verl's stock loop cannot drop such a sample from the batch;
`ArenaAgentLoop` masks it out (see agent_loop.py).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from uuid import uuid4

from arenaforge.environments.reward import f1_reward
from arenaforge.environments.runtime.errors import EnvironmentFailure
from arenaforge.schemas.models import Environment, RewardBreakdown
from arenaforge.tracks.train.rollout.episodes import FAILED_OUTCOMES, SandboxPool


@dataclass
class _Instance:
    env: Environment
    function: str
    session: Any
    observations: list[str] = field(default_factory=list)
    calls: int = 0
    errors: int = 0
    env_failure: str | None = None  # what the sandbox said when it failed this instance


class ArenaTool:
    """Calls of one environment function per instance; `name` is the tool name the model calls."""

    def __init__(self, pool: SandboxPool, name: str) -> None:
        self.pool = pool
        self.name = name
        self._instances: dict[str, _Instance] = {}

    async def open(self, env: Environment, function: str | None = None, instance_id: str | None = None
                   ) -> tuple[str, None]:
        """A new instance: a sandbox session of `env` whose calls run `function` (default: this tool's name)."""
        instance_id = instance_id or uuid4().hex
        self._instances[instance_id] = _Instance(env=env, function=function or self.name,
                                                 session=await self.pool.open(env))
        return instance_id, None

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> tuple[str, float, dict]:
        inst = self._instances[instance_id]
        function = kwargs.get("tool_name") or inst.function
        inst.calls += 1
        if function not in {t.name for t in inst.env.tools}:
            inst.errors += 1
            return f"Error: unknown tool {function!r}", 0.0, {"outcome": "error"}
        try:
            obs = await self.pool.call(inst.session, function, parameters)
        except EnvironmentFailure as err:  # the sandbox failed, not the call: never charged to the agent
            inst.env_failure = str(err)
            return f"Error: the environment failed this call (not your doing): {err.failure}", 0.0, {
                "outcome": "env_failure"}
        text = obs.text()
        inst.observations.append(text)
        if obs.outcome in FAILED_OUTCOMES:
            inst.errors += 1
        return text, 0.0, {"outcome": obs.outcome}

    def breakdown(self, instance_id: str) -> RewardBreakdown:
        inst = self._instances[instance_id]
        return f1_reward(inst.env.gold_answers, inst.observations, inst.calls)

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        if self._instances[instance_id].env_failure:
            return 0.0  # not a judgement of the agent; the failure is in the call's metrics
        return self.breakdown(instance_id).f1

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        inst = self._instances.pop(instance_id, None)
        if inst is not None:
            await self.pool.close(inst.session)
