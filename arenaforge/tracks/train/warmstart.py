"""Warm start: SFT conversations that replay each environment's gold calls, so a random policy learns the format.

A random-weight policy (the tiny model) never emits a well-formed `<tool_call>`, so every GRPO
group scores 0 and every step is skipped (zero variance). A few SFT steps on these
conversations first teach it the hermes call syntax and the environments' calls, after which
sampled rollouts score some of the time and GRPO groups have reward variance.

One conversation per environment, in the OpenAI messages+tools JSONL format `arenaforge.tracks.train.sft`
consumes: the rollout's own prompt (`arenaforge.tracks.train.rollout.episodes.initial_messages`, same system prompt and
tools, so warm-start prompts and rollout prompts are the same tokens), then one assistant turn
per gold call, each followed by the tool message holding the observation obtained by really
running the gold calls in a sandbox session (`arenaforge.environments.runtime.run_calls`), then a short
final answer. Environments whose gold calls do not all return output are rejected, not dropped.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from arenaforge.environments.reward import gold_call_passes
from arenaforge.schemas.errors import SandboxError
from arenaforge.schemas.models import ChatMessage, Environment, FunctionCall, Rejection, ToolCall, ToolObservation
from arenaforge.tracks.train.rollout.episodes import DEFAULT_SYSTEM, SandboxPool, initial_messages
from arenaforge.warehouse import Warehouse

STAGE = "warmstart"


def call_waves(env: Environment) -> list[list[int]]:
    """Gold call indices grouped into turns: a call waits for the turn after the calls whose answers it uses.

    Independent calls (the parallel branches of a QA) share one assistant turn, as a model would
    issue them: fewer turns, shorter episodes, the same observations.
    """
    depth: list[int] = []
    for index, call in enumerate(env.calls):
        used = {_norm(v) for v in call.arguments.values() if isinstance(v, (str, int, float))}
        parents = [depth[j] for j in range(index) if env.calls[j].answer is not None and _norm(env.calls[j].answer) in used]
        depth.append(1 + max(parents) if parents else 0)
    return [[i for i, d in enumerate(depth) if d == wave] for wave in range(max(depth, default=-1) + 1)]


def _norm(value: object) -> str:
    return str(value).strip().lower()


def conversation(env: Environment, observations: Sequence[ToolObservation],
                 system_prompt: str | None = DEFAULT_SYSTEM) -> dict[str, Any]:
    """The SFT example of `env`: rollout prompt, one turn per wave of gold calls, their observations, the answer."""
    messages = list(initial_messages(env, system_prompt))
    last: list[int] = []
    for turn, wave in enumerate(call_waves(env)):
        ids = [f"call_{turn}_{k}" for k in range(len(wave))]  # the ids run_episode gives
        messages.append(ChatMessage(role="assistant", tool_calls=[
            ToolCall(id=call_id, function=FunctionCall(name=env.calls[i].tool, arguments=json.dumps(env.calls[i].arguments)))
            for call_id, i in zip(ids, wave, strict=True)]))
        messages += [ChatMessage(role="tool", content=observations[i].text(), tool_call_id=call_id, name=env.calls[i].tool)
                     for call_id, i in zip(ids, wave, strict=True)]
        last = wave
    finals = [env.calls[i].answer or observations[i].text() for i in last] or env.gold_answers[-1:]
    messages.append(ChatMessage(role="assistant", content=f"The answer is {', '.join(finals)}."))
    return {"messages": [m.model_dump(exclude_none=True) for m in messages],
            "tools": [t.as_openai_tool() for t in env.tools], "env_id": env.id}


async def _replay(pool: SandboxPool, env: Environment) -> list[ToolObservation]:
    from arenaforge.environments.runtime import run_calls

    return await run_calls(pool, env, env.calls)  # type: ignore[arg-type]  # only open/call/close are used


async def warmstart_examples(pool: SandboxPool, envs: Sequence[Environment], *, concurrency: int = 8,
                             system_prompt: str | None = DEFAULT_SYSTEM) -> tuple[list[dict[str, Any]], list[Rejection]]:
    """(examples in env order, rejections): gold calls replayed in `pool`, one conversation per usable env."""
    limiter = asyncio.Semaphore(concurrency)

    async def one(env: Environment) -> dict[str, Any] | Rejection:
        if not env.calls:
            return Rejection(stage=STAGE, subject=env.id, reason="no_gold_calls", parents=[env.id])
        try:
            async with limiter:
                observations = await _replay(pool, env)
        except (SandboxError, OSError) as err:  # EnvLoadError is a SandboxError
            return Rejection(stage=STAGE, subject=env.id, reason="replay_failed", detail=str(err),
                             environment_failure=True, parents=[env.id])
        bad = [(c.tool, o.outcome) for c, o in zip(env.calls, observations)
               if not gold_call_passes(None, o.outcome, o.output)]  # ran: a None result is a result
        if bad:
            return Rejection(stage=STAGE, subject=env.id, reason="gold_call_failed",
                             detail=", ".join(f"{t}: {o}" for t, o in bad), parents=[env.id])
        return conversation(env, observations, system_prompt)

    results = await asyncio.gather(*(one(e) for e in envs))
    return ([r for r in results if isinstance(r, dict)], [r for r in results if isinstance(r, Rejection)])


def write_jsonl(examples: Sequence[dict[str, Any]], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(e, ensure_ascii=False) + "\n" for e in examples))
    return path


def trajectory_examples(wh: Warehouse, limit: int | None = None) -> list[dict[str, Any]]:
    """Kept SFT-track trajectories (judge `keep`) as warm-start examples, best-scored first.

    They come from the tool documents of the SFT track, never from an environment, so they carry
    no test environment into training.
    """
    from arenaforge.tracks.sft.export import kept_trajectories

    ranked = sorted(kept_trajectories(wh), key=lambda item: (-item[1], item[0].id))[:limit]
    return [{"messages": [m.model_dump(exclude_none=True) for m in t.messages],
             "tools": [f.as_openai_tool() for f in t.tools], "trajectory_id": t.id} for t, _ in ranked]
