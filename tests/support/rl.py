"""Shared pieces for the RL/training tests: a hand-built environment, the real sandbox pool, the tiny model.

Tests run tool code in the real pool on the process backend (`process_pool`, `with_pool`); a sandbox
failure is a real one: the pool's worker processes are SIGKILLed (`dying_before`, `lose_sandbox_workers`)
and the pool reports it as it would in production (WorkerLost / SessionLost).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import psutil

from arenaforge.schemas.models import Environment, FunctionDoc, GoldCall

T = TypeVar("T")

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


def kill_sandbox_workers() -> int:
    """A real infrastructure failure: SIGKILL this process's sandbox workers (process backend); how many died."""
    from arenaforge.environments.runtime.image import worker_argv

    boot = worker_argv(sys.executable)[1:]  # the worker's own interpreter may differ (the launcher picks it)
    workers = []
    for child in psutil.Process().children():
        with contextlib.suppress(psutil.Error):  # a child that exits meanwhile is no worker to kill
            if child.cmdline()[1:] == boot:
                workers.append(child)
    for worker in workers:
        worker.kill()
    psutil.wait_procs(workers)
    return len(workers)


async def lose_sandbox_workers(pool: Any) -> None:
    """Kill the pool's workers and wait until the pool has seen them die: the session's next call then raises
    SessionLost (a call in flight at the kill would raise WorkerLost)."""
    assert kill_sandbox_workers(), "no sandbox worker to kill"
    deadline = time.monotonic() + 60
    while pool.stats()["workers"]:  # polling the condition (the pool's reader sees EOF) with a deadline
        assert time.monotonic() < deadline, "the pool did not notice its workers died"
        await asyncio.sleep(0.01)


def dying_before(respond: Callable[[str, int], str], tools: set[str]) -> Callable[[str, int], str]:
    """`respond`, but the sandbox workers are SIGKILLed (once) as the agent emits its first call to one of `tools`:
    that call then fails as the real pool reports a dead worker (WorkerLost or SessionLost)."""
    killed = False

    def wrapped(prompt: str, index: int) -> str:
        nonlocal killed
        text = respond(prompt, index)
        if not killed and any(f'"name": "{tool}"' in text for tool in tools):
            killed = bool(kill_sandbox_workers())
            assert killed, "no sandbox worker to kill"
        return text

    return wrapped


def with_pool(work: Callable[[Any], Awaitable[T]], size: int = 1) -> T:
    """asyncio.run(work(pool)) with a fresh real pool on the process backend, shut down after."""

    async def main() -> T:
        async with process_pool(size) as pool:
            return await work(pool)

    return asyncio.run(main())


def tiny_model_path() -> Path:
    from arenaforge.tracks.train.tiny_model import ensure_tiny_model

    return ensure_tiny_model()
