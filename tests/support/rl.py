"""Shared pieces for the RL/training tests: a hand-built environment, a test pool, the tiny model.

`InProcessPool` is a test double for `arenaforge.environments.runtime`'s pool (same open/call/close
API): it runs an environment's standard-library tool code in this process with no isolation.
It exists only so rollout and trainer tests need no sandbox; tests that replay tool code for what it
returns use the real pool on the process backend, `process_pool()`.
"""

from __future__ import annotations

import contextlib
import copy
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arenaforge.environments.runtime.errors import WorkerLost
from arenaforge.schemas.models import Environment, FunctionDoc, GoldCall, ToolObservation

CODE = '''
DATA = {}

def get_capital(country):
    """Capital city of a country."""
    return DATA["capitals"][country]

def get_population(city):
    """Population of a city, in people."""
    return DATA["population"][city]
'''


def tiny_env(country: str = "Freedonia", capital: str = "Quaxton", population: int = 81234,
             name: str | None = None) -> Environment:
    """A two-tool functions-style environment with two sub-tasks (capital, then population)."""
    return Environment(
        name=name or f"capital-population-{country.lower()}",
        tools=[
            FunctionDoc(name="get_capital", description="Capital city of a country.",
                        parameters={"type": "object", "properties": {"country": {"type": "string"}},
                                    "required": ["country"]}),
            FunctionDoc(name="get_population", description="Population of a city.",
                        parameters={"type": "object", "properties": {"city": {"type": "string"}},
                                    "required": ["city"]}),
        ],
        code=CODE,
        style="functions",
        data_var="DATA",
        initial_state={"capitals": {country: capital}, "population": {capital: population}},
        calls=[GoldCall(tool="get_capital", arguments={"country": country}, sub_qa=1, answer=capital),
               GoldCall(tool="get_population", arguments={"city": capital}, sub_qa=2, answer=str(population))],
        gold_answers=[capital, str(population)],
        question=f"How many people live in the capital of {country}?",
    )


def call_text(name: str, **arguments: Any) -> str:
    return f'<tool_call>\n{json.dumps({"name": name, "arguments": arguments})}\n</tool_call>'


def solving_policy(env: Environment):
    """respond(prompt, index) for ScriptedEngine: replays the gold calls turn by turn, then answers."""

    def respond(prompt: str, _index: int) -> str:
        done = prompt.count("<tool_response>")
        if done < len(env.calls):
            call = env.calls[done]
            return call_text(call.tool, **call.arguments)
        return f"The answer is {env.gold_answers[-1]}."

    return respond


@contextlib.asynccontextmanager
async def process_pool(size: int = 1) -> AsyncIterator[Any]:
    """The real sandbox pool on the process backend (subprocess workers), shut down on exit."""
    from arenaforge.environments.runtime import create_pool
    from arenaforge.schemas.config import SandboxConfig

    async with await create_pool(SandboxConfig(backend="process", pool_size=size)) as pool:
        yield pool


@dataclass
class InProcessPool:
    """Test double of the sandbox pool; `fail_calls_to` makes a call fail as the runtime does when its worker
    dies (`WorkerLost`, an EnvironmentFailure)."""

    fail_calls_to: set[str] = field(default_factory=set)
    opened: int = 0
    closed: int = 0

    async def open(self, env: Environment) -> dict[str, Any]:
        namespace: dict[str, Any] = {}
        exec(compile(env.code, f"<env {env.name}>", "exec"), namespace)  # test double only: no isolation
        if env.data_var:
            namespace[env.data_var] = copy.deepcopy(env.initial_state or {})
        self.opened += 1
        return namespace

    async def call(self, session: dict[str, Any], tool_name: str, args: dict[str, Any]) -> ToolObservation:
        if tool_name in self.fail_calls_to:
            raise WorkerLost(f"worker for {tool_name} died")
        try:
            value = session[tool_name](**args)
        except Exception as err:  # a tool's own error is an observation, as in the real runtime
            return ToolObservation(outcome="error", error=f"{type(err).__name__}: {err}")
        if value is None:
            return ToolObservation(outcome="no_output")
        return ToolObservation(outcome="ok", output=value if isinstance(value, str) else json.dumps(value))

    async def close(self, session: Any) -> None:
        self.closed += 1

    async def shutdown(self) -> None:
        return None


def tiny_model_path() -> Path:
    from arenaforge.tasks.train.tiny_model import ensure_tiny_model

    return ensure_tiny_model()
