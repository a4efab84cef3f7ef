"""The GRPO training loop: stream rollout groups, fill batches adaptively, step, log, checkpoint.

Rollouts keep streaming while a batch fills (`stream_groups`), so tool calls and generation
overlap; groups still in flight when a step starts finish under the updated weights, at most
one policy version stale. With the in-process `hf` engine the trainer holds the engine's lock
during the update, so generation never reads half-updated weights. With `vllm` the server
keeps its own weights: reload it from the newest checkpoint (or scale out with verl, which
syncs weights itself) and train with `old_logprobs="engine"`.

Everything a run writes goes to the warehouse at step boundaries: the step's rollouts, one
`TrainStep`, and a `Checkpoint` row per save. Resume = newest checkpoint with optimizer state
(model, optimizer, scheduler, step, environment cursor, RNG).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch

from arenaforge.schemas.kinds_training import Checkpoint, TrainStep
from arenaforge.schemas.models import Environment, Rollout
from arenaforge.services.policy.base import PolicyEngine
from arenaforge.services.run_scope import RunScope
from arenaforge.tracks.train.batching import AdaptiveBatcher
from arenaforge.tracks.train.checkpoints import CheckpointManager
from arenaforge.tracks.train.curriculum import Curriculum
from arenaforge.tracks.train.grpo import GrpoTrainer
from arenaforge.tracks.train.params import GrpoParams, derived_values
from arenaforge.tracks.train.rollout.episodes import (
    Episode,
    RolloutConfig,
    SandboxPool,
    env_failure_rejections,
    stream_groups,
)
from arenaforge.tracks.train.sft import merged, with_lora
from arenaforge.warehouse import Warehouse

EngineFactory = Callable[[Any, Any], PolicyEngine]  # (model, tokenizer) -> engine
log = logging.getLogger("arenaforge.train")


def _update(trainer: GrpoTrainer, batch: list[list[Rollout]], lock: Any) -> dict[str, float]:
    """One optimizer step, in a thread of its own: the event loop keeps reading the sandbox's replies meanwhile (a
    minute-long step on the loop's own thread let calls in flight overrun their deadlines, and the pool replaced a
    worker that had answered long before). Under the engine's lock: generation never reads half-updated weights."""
    with lock if lock is not None else contextlib.nullcontext():
        return trainer.step(batch) if batch else {"loss": 0.0, "skipped": 1.0}


@dataclass(frozen=True)
class GrpoRunConfig:
    """A GRPO run's loop. The settings GrpoParams declares (same names) have no default here: `from_params`."""

    out_dir: str
    trainer: GrpoParams  # the trainer's settings: GrpoTrainer.from_params builds its config from them where it is used
    rollout: RolloutConfig
    steps: int
    batch_groups: int  # groups per optimisation batch (paper: 256 prompts)
    group_size: int  # G
    delta: float  # keep groups whose reward std exceeds this
    roc: bool  # Resample-on-Correct: roll out 2G, keep G
    max_groups_per_step: int  # stop filling after this many groups (all zero-variance => skip step)
    checkpoint_every: int
    keep_optimizer: int
    concurrency: int
    curriculum: bool  # pick environments by measured pass rate (curriculum.py); False: cycle in order
    seed: int
    device: str
    in_flight_groups: int = 4

    @classmethod
    def from_params(cls, params: GrpoParams, out_dir: str, **changes: Any) -> GrpoRunConfig:
        """The run `params` describe (its trainer's too; its episodes sampled from its seed), with `changes`."""
        return cls(**{**derived_values(cls, params), "out_dir": out_dir, "trainer": params,
                      "rollout": params.episode.rollout_config(params.seed), **changes})


@dataclass
class GrpoSummary:
    experiment: str
    first_step: int
    last_step: int
    resumed_from: str | None
    checkpoints: list[str]
    metrics: list[dict[str, float]]


def load_policy(model_path: str | Path, manager: CheckpointManager, device: str = "cpu",
                lora_rank: int = 0) -> tuple[Any, Any, Any, str]:
    """(model, tokenizer, saved-or-None, source path): the newest resumable checkpoint, else `model_path`.

    With `lora_rank` the model is `model_path` with fresh adapters (a resumed run's come from its trainer state:
    its checkpoint's weights have them merged in)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    saved = manager.latest_resumable()
    source = str(saved.path) if saved else str(model_path)
    model = AutoModelForCausalLM.from_pretrained(str(model_path) if lora_rank else source).to(device)
    if lora_rank:
        model = with_lora(model, lora_rank)
    tokenizer = AutoTokenizer.from_pretrained(source)
    return model, tokenizer, saved, source


def _mean(values: Sequence[float]) -> float:
    return float(statistics.fmean(values)) if values else 0.0


def step_metrics(generated: Sequence[Episode], batch: Sequence[Sequence[Rollout]], fill: Any,
                 rollout_s: float) -> dict[str, float]:
    scored = [e.rollout for e in generated if e.rollout.status != "env_failure"]
    used = [r for g in batch for r in g]
    return {
        "reward": _mean([r.reward.f1 for r in scored]),
        "recall": _mean([r.reward.recall for r in scored]),
        "precision": _mean([r.reward.precision for r in scored]),
        "calls": _mean([r.reward.calls for r in scored]),
        "batch_reward": _mean([r.reward.f1 for r in used]),
        "groups_generated": float(fill.generated),
        "groups_used": float(len(batch)),
        "zero_variance_share": fill.zero_variance / fill.generated if fill.generated else 0.0,
        "env_failures": float(fill.env_failed_samples),
        "env_dropped_groups": float(fill.env_dropped),
        "response_len": _mean([len(r.response_ids) for r in scored]),
        "model_tokens": _mean([sum(r.response_mask) for r in scored]),
        "prompt_len": _mean([len(r.prompt_ids) for r in scored]),
        "tool_errors": _mean([r.tool_errors for r in scored]),
        "format_errors": _mean([r.format_errors for r in scored]),
        "rollout_s": rollout_s,
        "generate_s": sum(e.generate_s for e in generated),
        "tools_s": sum(e.tool_s for e in generated),
    }


def step_line(algorithm: str, step: int, total: int, metrics: dict[str, float]) -> str:
    """One log line per step: what a person watching a run needs."""
    if algorithm == "sft":
        return f"sft step {step}/{total}: loss {metrics['loss']:.4f}, lr {metrics.get('lr', 0):.2g}"
    skipped = "SKIPPED (no group with reward variance)" if metrics.get("skipped") else f"loss {metrics.get('loss', 0):.4f}"
    return (f"grpo step {step}/{total}: reward {metrics['reward']:.3f}, F1 {metrics['reward']:.3f} "
            f"(recall {metrics['recall']:.3f}, precision {metrics['precision']:.3f}), zero-variance share "
            f"{metrics['zero_variance_share']:.2f}, groups used {int(metrics['groups_used'])}/"
            f"{int(metrics['groups_generated'])}, {skipped}")


async def train_grpo_in(scope: RunScope, params: GrpoParams, out_dir: str, model_path: str,
                        engine_factory: EngineFactory, envs: Sequence[Environment],
                        structures: dict[str, str]) -> GrpoSummary:
    """The GRPO run `params` describe, as the scope's run on its sandbox pool (`train_grpo`)."""
    return await train_grpo(GrpoRunConfig.from_params(params, out_dir=out_dir), model_path, engine_factory,
                            await scope.sandbox(), envs, scope.wh, scope.run_id, structures)


async def train_grpo(cfg: GrpoRunConfig, model_path: str | Path, engine_factory: EngineFactory,
                     pool: SandboxPool, envs: Sequence[Environment], wh: Warehouse | None = None,
                     run_id: str | None = None, structures: dict[str, str] | None = None) -> GrpoSummary:
    """Run (or resume) GRPO until `cfg.steps` steps exist under `cfg.out_dir`.

    `structures` (env id -> stratum) lets the curriculum share pass rates between environments of one structure.
    """
    out = Path(cfg.out_dir)
    experiment = out.name
    manager = CheckpointManager(out, cfg.checkpoint_every, cfg.keep_optimizer)
    model, tokenizer, saved, source = load_policy(model_path, manager, cfg.device, cfg.trainer.lora_rank)
    trainer = GrpoTrainer.from_params(model, tokenizer, cfg.trainer)
    step, cursor = 0, 0
    if saved is not None:
        state, meta = CheckpointManager.load_state(saved)
        trainer.load_state_dict(state)
        torch.set_rng_state(state["torch_rng"])
        step, cursor = int(meta["step"]), int(meta["groups_launched"])
    else:
        torch.manual_seed(cfg.seed)
    first_step = step + 1
    engine = engine_factory(model, tokenizer)
    lock = getattr(engine, "lock", None)
    batcher = AdaptiveBatcher(delta=cfg.delta, group_size=cfg.group_size, roc=cfg.roc, seed=cfg.seed + step)
    rollout_group = cfg.group_size * (2 if cfg.roc else 1)
    rollout_cfg = cfg.rollout
    if rollout_cfg.seed is None:
        rollout_cfg = RolloutConfig(**{**asdict(rollout_cfg), "seed": cfg.seed})
    summary = GrpoSummary(experiment, first_step, step, str(saved.path) if saved else None, [], [])
    if step >= cfg.steps:
        return summary

    launched = cursor
    curriculum = Curriculum(envs, structures or {}, seed=cfg.seed, adaptive=cfg.curriculum)
    stream = stream_groups(engine, tokenizer, pool, envs, rollout_cfg, rollout_group, concurrency=cfg.concurrency,
                           start=cursor, in_flight_groups=cfg.in_flight_groups, pick=curriculum.pick)
    try:
        while step < cfg.steps:
            step += 1
            started = time.perf_counter()
            generated: list[Episode] = []
            while not batcher.ready(cfg.batch_groups) and batcher.stats.generated < cfg.max_groups_per_step:
                group = await anext(stream)
                launched += 1
                generated += group
                scored = [e.rollout for e in group if e.rollout.status != "env_failure"]
                if scored:
                    curriculum.observe(scored[0].env_id, [r.reward.f1 for r in scored])
                batcher.offer([e.rollout for e in group])
            rollout_s = time.perf_counter() - started
            batch = batcher.take(cfg.batch_groups)
            fill = batcher.reset_stats()
            metrics = step_metrics(generated, batch, fill, rollout_s)
            metrics.update(await asyncio.to_thread(_update, trainer, batch, lock))
            metrics.setdefault("skipped", 0.0)
            log.info(step_line("grpo", step, cfg.steps, metrics))
            rollouts = [e.rollout.model_copy(update={"run_id": run_id}) for e in generated]
            records: list[Any] = [*rollouts, *env_failure_rejections(rollouts, "train-grpo")]
            records.append(TrainStep(experiment=experiment, algorithm="grpo", step=step, policy=source,
                                     metrics=metrics, run_id=run_id))
            if manager.due(step, last=step == cfg.steps):
                state = {**trainer.state_dict(), "torch_rng": torch.get_rng_state()}
                ckpt = manager.save(step, merged(model) if cfg.trainer.lora_rank else model, tokenizer, state,
                                    {"groups_launched": launched, "algorithm": "grpo", "seed": cfg.seed})
                summary.checkpoints.append(str(ckpt.path))
                records.append(Checkpoint(experiment=experiment, algorithm="grpo", step=step, path=str(ckpt.path),
                                          has_optimizer=True, run_id=run_id))
            if wh is not None:
                wh.upsert(records)
            summary.metrics.append(metrics)
            summary.last_step = step
    finally:
        await stream.aclose()
    return summary
