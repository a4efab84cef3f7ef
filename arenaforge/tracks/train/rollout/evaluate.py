"""Evaluate any policy engine on a held-out environment set with the F1 reward.

Runs `samples` episodes per environment through the same rollout loop as training and
reduces them to one `EvalRun`: mean F1, recall, precision and calls per task over scored
episodes, and for an imported suite its own metric (`native`: the share of episodes its native check passed) (environment failures are reported, never scored as 0), episode counts per status,
and why episodes failed.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from arenaforge.schemas.kinds_training import EvalRun
from arenaforge.schemas.models import Environment, Rollout
from arenaforge.services.policy.base import PolicyEngine
from arenaforge.tracks.train.rollout.episodes import RolloutConfig, SandboxPool, run_rollouts


@dataclass(frozen=True)
class EvalConfig:
    rollout: RolloutConfig  # built from the eval's EpisodeParams, which hold the limits' defaults
    samples: int = 1
    concurrency: int = 32


def _reason(r: Rollout) -> str | None:
    if r.status == "env_failure":
        return f"env_failure: {(r.failure_reason or 'unknown').splitlines()[0][:80]}"
    if r.status != "finished":
        return r.status
    return None


def summarise(rollouts: Sequence[Rollout], *, policy: str, engine: str, env_ids: Sequence[str], samples: int,
              started_at: str, run_id: str | None = None, label: str | None = None, suite: str | None = None) -> EvalRun:
    scored = [r for r in rollouts if r.status != "env_failure"]
    judged = [r for r in scored if r.native_passed is not None]  # episodes whose environment has a native check

    def mean(values: list[float]) -> float:
        return float(statistics.fmean(values)) if values else 0.0

    return EvalRun(
        policy=policy, engine=engine, env_ids=list(env_ids), samples=samples, episodes=len(scored),
        f1=mean([r.reward.f1 for r in scored]), recall=mean([r.reward.recall for r in scored]),
        precision=mean([r.reward.precision for r in scored]), calls_per_task=mean([r.reward.calls for r in scored]),
        format_errors_per_task=mean([float(r.format_errors) for r in scored]), label=label,
        statuses=dict(Counter(r.status for r in rollouts)),
        failure_reasons=dict(Counter(reason for r in rollouts if (reason := _reason(r)))),
        started_at=started_at, run_id=run_id, suite=suite,
        native=mean([float(r.native_passed) for r in judged]) if judged else None,
    )


async def evaluate(engine: PolicyEngine, tokenizer: Any, pool: SandboxPool, envs: Sequence[Environment],
                   cfg: EvalConfig, run_id: str | None = None, label: str | None = None,
                   suite: str | None = None) -> tuple[EvalRun, list[Rollout]]:
    """(summary, rollouts) of `engine` on `envs`; rollouts carry `run_id` for storage."""
    started_at = datetime.now(UTC).isoformat(timespec="microseconds")
    episodes = await run_rollouts(engine, tokenizer, pool, envs, cfg.rollout, samples=cfg.samples,
                                  concurrency=cfg.concurrency)
    rollouts = [e.rollout.model_copy(update={"run_id": run_id}) for e in episodes]
    summary = summarise(rollouts, policy=engine.policy, engine=engine.name, env_ids=[e.id for e in envs],
                        samples=cfg.samples, started_at=started_at, run_id=run_id, label=label, suite=suite)
    return summary, rollouts
