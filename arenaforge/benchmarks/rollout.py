"""Rollout scheduling and trainer throughput benchmark (`arenaforge bench rollout`).

Part 1 — engine utilisation. A simulated engine (fixed seconds per generated token, requests
served in parallel like a continuously batching server) drives multi-turn episodes whose
tool calls run in the real sandbox (process backend by default) with realistic, uneven
latencies. Two schedulers run the same episodes:
  async   every episode proceeds on its own (`run_rollouts`): while some wait on tools, others generate;
  static  turn-synchronous batches: each generation round waits until every episode's tool calls
          of the previous round have returned (what a static `generate(batch)` loop does).
Both keep at most `slots` episodes in flight; `rollouts` episodes in all, so the async
scheduler's end-of-run tail (last tool calls, nothing left to generate) is amortised as in
training, where `stream_groups` keeps launching groups. Reported: share of wall time the
engine had work (busy share) for each, and their ratio.

Part 2 — training tokens/s on the tiny model: our `GrpoTrainer.step` vs TRL's GRPOTrainer loss
(`compute_loss`, loss_type="dapo", beta=0, same clip-higher) + backward + the same AdamW step,
on identical fixed batches; plus the largest loss difference between the two.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from arenaforge.schemas.config import SandboxConfig
from arenaforge.schemas.models import Environment, FunctionDoc, RewardBreakdown, Rollout
from arenaforge.testing.scripted_policy import ScriptedEngine
from arenaforge.tracks.train.params import EpisodeParams
from arenaforge.tracks.train.rollout.episodes import Episode, RolloutConfig, run_episode, run_rollouts

_CODE = '''
import time
DATA = {}

def lookup(key):
    """Value stored under key (a slow backend)."""
    time.sleep(DATA["delay"][key])
    return DATA["value"][key]
'''


def _envs(n: int, calls: int, seed: int, min_s: float, max_s: float) -> list[Environment]:
    rng = random.Random(seed)
    envs = []
    for i in range(n):
        keys = [f"k{i}_{j}" for j in range(calls)]
        envs.append(Environment(
            name=f"bench-{i}", code=_CODE, data_var="DATA", question=f"Collect values for task {i}.",
            tools=[FunctionDoc(name="lookup", description="Value under a key.",
                               parameters={"type": "object", "properties": {"key": {"type": "string"}}})],
            initial_state={"delay": {k: rng.uniform(min_s, max_s) for k in keys},
                           "value": {k: f"v{i}x{j}" for j, k in enumerate(keys)}},
            gold_answers=[f"v{i}x{j}" for j in range(calls)],
        ))
    return envs


def _policy(calls: int, seed: int, min_tokens: int, max_tokens: int):
    def respond(prompt: str, _index: int) -> str:
        task = prompt.split("Collect values for task ", 1)[1].split(".", 1)[0]
        done = prompt.count("<tool_response>")
        rng = random.Random(f"{seed}-{task}-{done}")
        filler = " ".join("step" for _ in range(rng.randint(min_tokens, max_tokens)))
        if done < calls:
            return f'{filler}<tool_call>{{"name": "lookup", "arguments": {{"key": "k{task}_{done}"}}}}</tool_call>'
        return f"{filler} done"
    return respond


class _RoundBarrier:
    """Generation rounds for a static batch: nobody generates turn t+1 before all finished turn t."""

    def __init__(self, parties: int) -> None:
        self.parties = parties
        self.waiting = 0
        self.event = asyncio.Event()

    async def wait(self) -> None:
        self.waiting += 1
        event = self.event
        if self.waiting >= self.parties:
            self._release()
        else:
            await event.wait()

    def leave(self) -> None:
        self.parties -= 1
        if self.parties and self.waiting >= self.parties:
            self._release()

    def _release(self) -> None:
        self.waiting = 0
        self.event.set()
        self.event = asyncio.Event()


class _StaticEngine:
    def __init__(self, inner: ScriptedEngine, barrier: _RoundBarrier) -> None:
        self.inner, self.barrier = inner, barrier
        self.name, self.policy = inner.name, inner.policy

    async def generate(self, prompt_ids, params):
        await self.barrier.wait()
        return await self.inner.generate(prompt_ids, params)


async def _static(engine: ScriptedEngine, tok: Any, pool: Any, envs: Sequence[Environment],
                  cfg: RolloutConfig) -> list[Episode]:
    barrier = _RoundBarrier(len(envs))
    wrapped = _StaticEngine(engine, barrier)

    async def one(env: Environment) -> Episode:
        try:
            return await run_episode(wrapped, tok, pool, env, cfg)
        finally:
            barrier.leave()

    return list(await asyncio.gather(*(one(e) for e in envs)))


async def _utilisation(tok: Any, rollouts: int, slots: int, calls: int, seconds_per_token: float, tool_min_s: float,
                       tool_max_s: float, pool_size: int, backend: str, seed: int) -> dict[str, Any]:
    from arenaforge.environments.runtime import create_pool

    envs = _envs(rollouts, calls, seed, tool_min_s, tool_max_s)
    cfg = EpisodeParams(max_turns=calls + 2, max_length=8192, max_tokens_per_turn=512).rollout_config()
    out: dict[str, Any] = {}
    pool = await create_pool(SandboxConfig(backend=backend, pool_size=pool_size, max_concurrency=slots * 2))
    try:
        for name in ("async", "static"):
            engine = ScriptedEngine(tok, _policy(calls, seed, 20, 80), seconds_per_token=seconds_per_token)
            started = time.perf_counter()
            if name == "async":
                episodes = await run_rollouts(engine, tok, pool, envs, cfg, samples=1, concurrency=slots)
            else:  # the same number of slots, filled one static batch at a time
                episodes = []
                for start in range(0, len(envs), slots):
                    episodes += await _static(engine, tok, pool, envs[start : start + slots], cfg)
            wall = time.perf_counter() - started
            f1 = statistics.fmean(e.rollout.reward.f1 for e in episodes)
            out[name] = {"wall_s": round(wall, 3), "engine_busy_s": round(engine.clock.busy_s, 3),
                         "busy_share": round(engine.clock.busy_s / wall, 4), "mean_f1": round(f1, 3),
                         "tool_s_total": round(sum(e.tool_s for e in episodes), 3)}
    finally:
        await pool.shutdown()
    out["busy_share_ratio_async_over_static"] = round(out["async"]["busy_share"] / out["static"]["busy_share"], 2)
    out["speedup_wall"] = round(out["static"]["wall_s"] / out["async"]["wall_s"], 2)
    out["goal_async_busy_share_ge_0_9"] = out["async"]["busy_share"] >= 0.9
    return out


def _fixed_batches(tok: Any, n_batches: int, groups: int, group_size: int, prompt_len: int, response_len: int,
                   seed: int) -> list[list[list[Rollout]]]:
    rng = random.Random(seed)
    vocab = len(tok)
    batches = []
    for _ in range(n_batches):
        batch = []
        for g in range(groups):
            prompt = [rng.randrange(10, vocab) for _ in range(prompt_len)]
            group = []
            for s in range(group_size):
                length = rng.randint(response_len // 2, response_len)
                mask = [0 if (i // 16) % 3 == 2 else 1 for i in range(length)]  # every third 16-token span: tool
                f1 = rng.choice([0.0, 0.5, 1.0])
                group.append(Rollout(
                    env_id=f"bench{g}", engine="bench", policy="tiny", group=str(g), sample=s, prompt_ids=prompt,
                    response_ids=[rng.randrange(10, vocab) for _ in range(length)], response_mask=mask,
                    logprobs=[0.0] * length, status="finished",
                    reward=RewardBreakdown(recall=f1, precision=f1, f1=f1, solved=0, subtasks=1, calls=1)))
            batch.append(group)
        batches.append(batch)
    return batches


def _trl_inputs(batch: list[list[Rollout]], pad_id: int) -> dict[str, Any]:
    import torch

    from arenaforge.tracks.train.grpo import batch_advantages

    rollouts = [r for g in batch for r in g]
    p = max(len(r.prompt_ids) for r in rollouts)
    c = max(len(r.response_ids) for r in rollouts)
    b = len(rollouts)
    prompt_ids = torch.full((b, p), pad_id, dtype=torch.long)
    prompt_mask = torch.zeros((b, p), dtype=torch.long)
    completion_ids = torch.full((b, c), pad_id, dtype=torch.long)
    completion_mask = torch.zeros((b, c), dtype=torch.long)
    tool_mask = torch.zeros((b, c), dtype=torch.long)
    for i, r in enumerate(rollouts):  # TRL: prompts left-padded, completions right-padded
        prompt_ids[i, p - len(r.prompt_ids):] = torch.tensor(r.prompt_ids)
        prompt_mask[i, p - len(r.prompt_ids):] = 1
        completion_ids[i, : len(r.response_ids)] = torch.tensor(r.response_ids)
        completion_mask[i, : len(r.response_ids)] = 1
        tool_mask[i, : len(r.response_ids)] = torch.tensor(r.response_mask)
    mask = completion_mask * tool_mask
    return {"prompt_ids": prompt_ids, "prompt_mask": prompt_mask, "completion_ids": completion_ids,
            "completion_mask": completion_mask, "tool_mask": tool_mask,
            "advantages": torch.tensor(batch_advantages(batch)), "num_items_in_batch": mask.sum().float()}


def _throughput(model_path: str, batches: list[list[list[Rollout]]], lr: float) -> dict[str, Any]:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig, GRPOTrainer

    from arenaforge.tracks.train.grpo import GrpoConfig, GrpoTrainer
    from arenaforge.tracks.train.params import GrpoParams

    tok = AutoTokenizer.from_pretrained(model_path)
    n_seq = sum(len(g) for g in batches[0])
    tokens = sum(len(r.prompt_ids) + len(r.response_ids) for b in batches for g in b for r in g)

    ours_model = AutoModelForCausalLM.from_pretrained(model_path)
    # every token in TRL's loss, as in TRL's (no constrained-decoding mask)
    ours = GrpoTrainer(ours_model, tok, GrpoConfig.from_params(GrpoParams(lr=lr, micro_batch_size=n_seq,
                                                                          skip_forced_tokens=False)))
    ours_losses = []
    started = time.perf_counter()
    for batch in batches:
        ours_losses.append(ours.step(batch)["loss"])
    ours_s = time.perf_counter() - started

    trl_model = AutoModelForCausalLM.from_pretrained(model_path)
    args = GRPOConfig(output_dir=tempfile.mkdtemp(), use_cpu=True, per_device_train_batch_size=n_seq,
                      num_generations=len(batches[0][0]), loss_type="dapo", beta=0.0, epsilon=0.2, epsilon_high=0.28,
                      report_to=[], learning_rate=lr, logging_steps=10_000)
    trainer = GRPOTrainer(model=trl_model, reward_funcs=lambda completions, **_: [0.0] * len(completions), args=args,
                          train_dataset=Dataset.from_list([{"prompt": "x"}] * n_seq), processing_class=tok)
    trainer.current_gradient_accumulation_steps = 1  # set by Trainer.training_step in a normal run
    optimizer = torch.optim.AdamW(trl_model.parameters(), lr=lr)
    trl_model.train()
    trl_losses = []
    started = time.perf_counter()
    for batch in batches:
        inputs = _trl_inputs(batch, tok.pad_token_id)
        optimizer.zero_grad(set_to_none=True)
        loss = trainer.compute_loss(trl_model, inputs)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trl_model.parameters(), 1.0)
        optimizer.step()
        trl_losses.append(float(loss.detach()))
    trl_s = time.perf_counter() - started
    return {
        "batches": len(batches), "sequences_per_batch": n_seq, "tokens": tokens,
        "ours_tokens_per_s": round(tokens / ours_s, 1), "trl_tokens_per_s": round(tokens / trl_s, 1),
        "ours_over_trl": round(trl_s / ours_s, 2),
        "max_abs_loss_diff": max(abs(a - b) for a, b in zip(ours_losses, trl_losses, strict=True)),
    }


async def main(rollouts: int = 256, slots: int = 32, calls: int = 3, seconds_per_token: float = 0.001, tool_min_s: float = 0.05,
         tool_max_s: float = 0.4, pool_size: int = 8, backend: str = "process", train_batches: int = 3,
         groups: int = 4, group_size: int = 4, prompt_len: int = 256, response_len: int = 256,
         seed: int = 0) -> dict:
    """Engine busy share (async vs static batch) and trainer tokens/s (ours vs TRL) on the tiny model.

    Args:
        rollouts: Episodes rolled out in each scheduler's run.
        slots: Episodes the simulated engine holds at once.
        calls: Tool calls per episode.
        seconds_per_token: The simulated engine's seconds per generated token.
        tool_min_s: Shortest tool call, in seconds (each call sleeps a seeded time between min and max).
        tool_max_s: Longest tool call, in seconds.
        pool_size: Sandbox workers.
        backend: Sandbox backend: process, docker or auto.
        train_batches: Training batches timed, for ours and TRL's.
        groups: Groups per training batch.
        group_size: Rollouts per group.
        prompt_len: Prompt tokens per training example.
        response_len: Response tokens per training example.
        seed: Seed of the episodes, tool times and batches.
    """
    from transformers import AutoTokenizer

    from arenaforge.tracks.train.tiny_model import ensure_tiny_model

    path = str(ensure_tiny_model())
    tok = AutoTokenizer.from_pretrained(path)
    utilisation = await _utilisation(tok, rollouts, slots, calls, seconds_per_token, tool_min_s, tool_max_s,
                                     pool_size, backend, seed)
    batches = _fixed_batches(tok, train_batches, groups, group_size, prompt_len, response_len, seed)
    return {"engine_utilisation": utilisation, "training_throughput": _throughput(path, batches, 1e-5)}
