"""Multi-turn RL rollouts over sandbox sessions, token-in/token-out, with the F1 reward.

What this module owns: the episode loop (generate -> parse hermes `<tool_call>` blocks ->
run them in the episode's sandbox session -> append `<tool_response>` tokens -> repeat), the
token bookkeeping the trainer relies on, and running many episodes concurrently.
What it leaves to others: sampling (`arenaforge.services.policy` engines), tool execution and isolation
(`arenaforge.environments.runtime` pools, reached only through the `SandboxPool` protocol below), and
the reward definition (`arenaforge.environments.reward.f1_reward`).

Token discipline (METHOD.md §4, GLM-5/slime): the prompt is templated once; after that the
engine's exact ids are kept, and each turn's observations are rendered and tokenized once
and appended. History is never re-tokenized, so `prompt_ids + response_ids` is exactly the
sequence the engine conditioned on. `response_mask` is 1 on engine tokens, 0 on observation
tokens; `logprobs` are the engine's (0.0 on observation tokens).

Episode end: a turn with no tool call is the final answer (`finished`); `max_turns` turns
(`max_turns`); the response budget is spent or a turn was cut by its token limit
(`max_length`). A malformed call (bad JSON, no name, unknown tool) gets an error observation
and counts as a call (c in the F1 reward) and a format error. A `SandboxError` — the sandbox,
not the tool, failed — ends the episode as `env_failure`, which training excludes.
"""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from arenaforge.environments.reward import f1_reward
from arenaforge.schemas.errors import SandboxError
from arenaforge.schemas.models import (
    ChatMessage,
    Environment,
    FunctionCall,
    Rejection,
    Rollout,
    ToolCall,
    ToolObservation,
)
from arenaforge.services.policy.base import PolicyEngine, SamplingParams
from arenaforge.services.policy.constrained import tool_specs
from arenaforge.tracks.envs.graders import grader_for

IM_END = "<|im_end|>"
_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)
_OPEN = "<tool_call>"
FAILED_OUTCOMES = ("error", "timeout", "limit")
GROUP_SEED_STRIDE = 1_000_000  # stream_groups: group k samples with seed + k * stride (keeps seed // 1000 % 2)
DEFAULT_SYSTEM = (
    "You are a careful assistant with tools. Call tools to find every fact the question needs, "
    "then answer briefly without calling a tool."
)


class SandboxPool(Protocol):
    """The slice of `arenaforge.environments.runtime`'s pool that rollouts use."""

    async def open(self, env: Environment) -> Any: ...

    async def call(self, session: Any, tool_name: str, args: dict[str, Any]) -> ToolObservation: ...

    async def close(self, session: Any) -> None: ...

    # and, for environments with a native check (Environment.native): `async def state(self, session) -> Any`;
    # for container tasks (Environment.container, `environments.containers.RoutedPool`): `async def verdict(session)`


@dataclass(frozen=True)
class RolloutConfig:
    """One episode's limits and sampling, built from `EpisodeParams` (`rollout_config`), which holds the defaults."""

    max_turns: int
    max_length: int  # response tokens (model + observations), the paper's "max length"
    max_tokens_per_turn: int
    temperature: float
    top_p: float
    constrain_tool_calls: bool  # engines that support it decode calls to this env's tools/keys only
    ground_arguments: bool  # ... and copy top-level argument values from the conversation
    system_prompt: str | None = DEFAULT_SYSTEM
    seed: int | None = None


@dataclass(frozen=True)
class ParsedCall:
    name: str | None
    arguments: dict[str, Any]
    error: str | None = None  # set for a malformed call


@dataclass
class Episode:
    """A finished rollout plus its timing split (generation vs tool execution)."""

    rollout: Rollout
    generate_s: float = 0.0
    tool_s: float = 0.0
    turns: int = 0
    timings: dict[str, float] = field(default_factory=dict)


def parse_tool_calls(text: str, tool_names: Sequence[str]) -> list[ParsedCall]:
    """Hermes-style calls in one assistant turn; malformed ones carry an error."""
    calls: list[ParsedCall] = []
    for body in _CALL.findall(text):
        calls.append(_parse_one(body, tool_names))
    tail = text.rsplit("</tool_call>", 1)[-1]
    if _OPEN in tail:
        calls.append(ParsedCall(None, {}, "unterminated <tool_call> block"))
    return calls


def _parse_one(body: str, tool_names: Sequence[str]) -> ParsedCall:
    try:
        payload = json.loads(body.strip())
    except json.JSONDecodeError as err:
        return ParsedCall(None, {}, f"tool call is not valid JSON: {err.msg}")
    if not isinstance(payload, dict) or not isinstance(payload.get("name"), str):
        return ParsedCall(None, {}, 'tool call must be {"name": ..., "arguments": {...}}')
    name, args = payload["name"], payload.get("arguments", {})
    if isinstance(args, str):
        try:
            args = json.loads(args) if args.strip() else {}
        except json.JSONDecodeError:
            return ParsedCall(name, {}, "arguments are not a JSON object")
    if not isinstance(args, dict):
        return ParsedCall(name, {}, "arguments are not a JSON object")
    if name not in tool_names:
        return ParsedCall(name, args, f"unknown tool {name!r}; available: {', '.join(tool_names)}")
    return ParsedCall(name, args)


def render_observations(texts: Sequence[str]) -> str:
    """The tokens that follow an assistant turn's end token, up to the next generation prompt.

    Mirrors the chat template: a user turn holding one `<tool_response>` block per call.
    """
    blocks = "".join(f"\n<tool_response>\n{t}\n</tool_response>" for t in texts)
    return f"\n<|im_start|>user{blocks}{IM_END}\n<|im_start|>assistant\n"


def initial_messages(env: Environment, system_prompt: str | None) -> list[ChatMessage]:
    question = env.question or "Answer the question using the tools."
    head = [ChatMessage(role="system", content=system_prompt)] if system_prompt else []
    return [*head, ChatMessage(role="user", content=question)]


def prompt_token_ids(tokenizer: Any, env: Environment, messages: Sequence[ChatMessage]) -> list[int]:
    tools = [t.as_openai_tool() for t in env.visible_tools(0)]  # a tool revealed later is announced at its turn
    rendered = tokenizer.apply_chat_template(
        [m.model_dump(exclude_none=True) for m in messages], tools=tools, add_generation_prompt=True, tokenize=False
    )
    return tokenizer.encode(rendered, add_special_tokens=False)


def user_turns(env: Environment) -> list[str]:
    """The user's messages, one per user turn: the question, or an imported multi-turn suite's turns (its grader's)."""
    return grader_for(env).user_turns(env)


def render_user_turn(text: str) -> str:
    """The tokens of a further user turn after the assistant's end token, up to the next generation prompt."""
    return f"\n<|im_start|>user\n{text}{IM_END}\n<|im_start|>assistant\n"


async def run_episode(engine: PolicyEngine, tokenizer: Any, pool: SandboxPool, env: Environment,
                      cfg: RolloutConfig, *, group: str | None = None, sample: int = 0) -> Episode:
    """One episode of `env` under `engine`; never raises for sandbox failures (status env_failure).

    An imported multi-turn suite's later user turns follow the assistant's final answer of the turn before (or its
    last allowed step: `max_turns` assistant turns per user turn); its tools appear at their turn. With a native
    check, the suite's own verdict is taken from the session (`Pool.state`) before it closes."""
    from arenaforge.environments.native import result_text

    grader = grader_for(env)
    prompts = grader.user_turns(env)
    messages = initial_messages(env, cfg.system_prompt)
    if len(prompts) > 1:
        messages[-1] = ChatMessage(role="user", content=prompts[0])
    prompt_ids = prompt_token_ids(tokenizer, env, messages)
    response_ids: list[int] = []
    mask: list[int] = []
    logprobs: list[float] = []
    received: list[str] = []
    results: list[str] = []  # every call's result as the suite compares it
    calls = tool_errors = format_errors = turns = 0
    gen_s = tool_s = 0.0
    status, failure = "max_turns", None
    verdict = None
    stop_id = tokenizer.convert_tokens_to_ids(IM_END)

    try:
        session = await pool.open(env)
    except SandboxError as err:
        return _episode(env, engine, group, sample, messages, prompt_ids, [], [], [], received, 0, 0, 0,
                        "env_failure", f"open: {err}", 0.0, 0.0, 0)
    try:
        ended = False  # the response budget is spent: no further user turn
        for user_turn, prompt in enumerate(prompts):
            if user_turn > 0:
                ids = tokenizer.encode(render_user_turn(prompt), add_special_tokens=False)
                if len(response_ids) + len(ids) >= cfg.max_length:
                    status = "max_length"
                    break
                response_ids += ids
                mask += [0] * len(ids)
                logprobs += [0.0] * len(ids)
                messages.append(ChatMessage(role="user", content=prompt))
            if hasattr(session, "turn"):
                session.turn = user_turn
            visible = env.visible_tools(user_turn)
            tool_names = [t.name for t in visible]
            specs = tool_specs(visible) if cfg.constrain_tool_calls else None
            turn_results: list[str] = []
            status = "max_turns"
            for step in range(cfg.max_turns):
                budget = cfg.max_length - len(response_ids)
                if budget <= 0:
                    status, ended = "max_length", True
                    break
                params = SamplingParams(
                    max_tokens=min(cfg.max_tokens_per_turn, budget), temperature=cfg.temperature, top_p=cfg.top_p,
                    stop_token_ids=(stop_id,), seed=None if cfg.seed is None else cfg.seed + 1000 * sample + turns,
                    tools=specs, ground_arguments=cfg.ground_arguments,
                )
                started = time.perf_counter()
                gen = await engine.generate(prompt_ids + response_ids, params)
                gen_s += time.perf_counter() - started
                turn = turns
                turns += 1
                response_ids += gen.token_ids
                mask += [1] * len(gen.token_ids)
                logprobs += gen.logprobs
                text = tokenizer.decode(gen.token_ids, skip_special_tokens=False)
                if text.endswith(IM_END):
                    text = text[: -len(IM_END)]
                parsed = parse_tool_calls(text, tool_names)
                messages.append(_assistant_message(text, parsed, turn))
                if gen.finish_reason == "length":
                    status, ended = "max_length", True
                    break
                if not parsed:
                    status = "finished"
                    break
                observations: list[str] = []
                started = time.perf_counter()
                for index, call in enumerate(parsed):
                    calls += 1
                    if call.error is not None:
                        format_errors += 1
                        observation = f"Error: {call.error}"
                    else:
                        result = await pool.call(session, call.name or "", call.arguments)
                        if result.outcome in FAILED_OUTCOMES:
                            tool_errors += 1
                        observation = result.text()
                        received.append(observation)
                        turn_results.append(result_text(result))
                    observations.append(observation)
                    messages.append(ChatMessage(role="tool", content=observation, tool_call_id=f"call_{turn}_{index}",
                                                name=call.name))
                tool_s += time.perf_counter() - started
                obs_ids = tokenizer.encode(render_observations(observations), add_special_tokens=False)
                if len(response_ids) + len(obs_ids) >= cfg.max_length:
                    status, ended = "max_length", True
                    break
                response_ids += obs_ids
                mask += [0] * len(obs_ids)
                logprobs += [0.0] * len(obs_ids)
            results += turn_results
            verdict = await grader.after_turn(env, pool, session, user_turn, turn_results, results, verdict)
            if ended:
                break
        verdict = await grader.after_episode(env, pool, session, user_turn, results, verdict)
    except SandboxError as err:
        status, failure, verdict = "env_failure", f"call: {err}", None
    finally:
        try:
            await pool.close(session)
        except SandboxError as err:  # a failed close loses nothing the episode produced
            failure = failure or f"close: {err}"
    episode = _episode(env, engine, group, sample, messages, prompt_ids, response_ids, mask, logprobs, received,
                       calls, tool_errors, format_errors, status, failure, gen_s, tool_s, turns)
    if verdict is not None:
        episode.rollout = Rollout.model_validate({**episode.rollout.model_dump(), "id": "", "native_passed": verdict.passed,
                                                  "native_reason": verdict.reason})
    return episode


def _assistant_message(text: str, parsed: Sequence[ParsedCall], turn: int) -> ChatMessage:
    good = [c for c in parsed if c.error is None]
    content = text
    if good and all(c.error is None for c in parsed):
        content = _CALL.sub("", text).strip()
    tool_calls = [
        ToolCall(id=f"call_{turn}_{i}", function=FunctionCall(name=c.name or "", arguments=json.dumps(c.arguments)))
        for i, c in enumerate(parsed) if c.error is None
    ]
    return ChatMessage(role="assistant", content=content or None, tool_calls=tool_calls or None)


def _episode(env: Environment, engine: PolicyEngine, group: str | None, sample: int, messages: list[ChatMessage],
             prompt_ids: list[int], response_ids: list[int], mask: list[int], logprobs: list[float],
             received: list[str], calls: int, tool_errors: int, format_errors: int, status: str,
             failure: str | None, gen_s: float, tool_s: float, turns: int) -> Episode:
    reward = f1_reward(env.gold_answers, received, calls)
    rollout = Rollout(
        env_id=env.id, engine=engine.name, policy=engine.policy, group=group, sample=sample, messages=messages,
        prompt_ids=prompt_ids, response_ids=response_ids, response_mask=mask, logprobs=logprobs, reward=reward,
        status=status, failure_reason=failure, tool_errors=tool_errors, format_errors=format_errors,
        parents=[env.id],
    )
    return Episode(rollout=rollout, generate_s=gen_s, tool_s=tool_s, turns=turns)


async def run_group(engine: PolicyEngine, tokenizer: Any, pool: SandboxPool, env: Environment, cfg: RolloutConfig,
                    size: int, group: str, limiter: asyncio.Semaphore | None = None) -> list[Episode]:
    """`size` concurrent episodes of one environment (a GRPO group)."""

    async def one(sample: int) -> Episode:
        if limiter is None:
            return await run_episode(engine, tokenizer, pool, env, cfg, group=group, sample=sample)
        async with limiter:
            return await run_episode(engine, tokenizer, pool, env, cfg, group=group, sample=sample)

    return list(await asyncio.gather(*(one(i) for i in range(size))))


async def stream_groups(engine: PolicyEngine, tokenizer: Any, pool: SandboxPool, envs: Sequence[Environment],
                        cfg: RolloutConfig, group_size: int, *, concurrency: int = 64, start: int = 0,
                        in_flight_groups: int = 8, pick: Callable[[int], Environment] | None = None
                        ) -> AsyncIterator[list[Episode]]:
    """Groups in completion order, forever from group number `start`: group k rolls out `pick(k)`
    (default: cycle through `envs`).

    Up to `in_flight_groups` groups run at once (episodes capped by `concurrency`), so while
    one episode waits on a tool call others are generating. The caller stops by breaking out.
    With a seed, group k samples with `seed + k * GROUP_SEED_STRIDE`: repeated groups of one
    environment draw new samples instead of replaying the same ones.
    """
    if not envs:
        return
    limiter = asyncio.Semaphore(concurrency)
    pending: set[asyncio.Task[list[Episode]]] = set()
    counter = start

    def launch() -> None:
        nonlocal counter
        env = pick(counter) if pick is not None else envs[counter % len(envs)]
        group_cfg = cfg if cfg.seed is None else replace(cfg, seed=cfg.seed + GROUP_SEED_STRIDE * counter)
        pending.add(asyncio.create_task(
            run_group(engine, tokenizer, pool, env, group_cfg, group_size, f"{env.id}:{counter}", limiter)))
        counter += 1

    try:
        for _ in range(in_flight_groups):
            launch()
        while pending:
            done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                pending.discard(task)
                launch()
                yield task.result()
    finally:
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.gather(*pending, return_exceptions=True)


async def run_rollouts(engine: PolicyEngine, tokenizer: Any, pool: SandboxPool, envs: Sequence[Environment],
                       cfg: RolloutConfig, samples: int = 1, concurrency: int = 64) -> list[Episode]:
    """`samples` episodes per environment, all concurrent (bounded), in input order."""
    limiter = asyncio.Semaphore(concurrency)
    groups = await asyncio.gather(*(
        run_group(engine, tokenizer, pool, env, cfg, samples, f"{env.id}:{i}", limiter) for i, env in enumerate(envs)
    ))
    return [ep for group in groups for ep in group]


def env_failure_rejections(rollouts: Sequence[Rollout], stage: str = "rollout") -> list[Rejection]:
    """One `Rejection` (environment_failure=True) per env-failed rollout, so the ledger shows them."""
    return [
        Rejection(stage=stage, subject=r.id, reason="env_failure", detail=r.failure_reason or "",
                  environment_failure=True, parents=[r.id, r.env_id], run_id=r.run_id)
        for r in rollouts if r.status == "env_failure"
    ]
