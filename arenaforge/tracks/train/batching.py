"""Adaptive batch filling, environment-failure handling and Resample-on-Correct.

Adaptive filling (ASTRA §1c): keep rolling out, buffer only groups whose reward std exceeds
`delta` (a zero-variance group has all-zero advantages: no gradient), and fill each batch
with the first n buffered groups. Environment failures (GLM-5, METHOD.md §4) are not model
failures: failed samples are removed; a group with more than half valid samples is refilled
by repeating valid samples, otherwise dropped. RoC (rStar2-Agent, METHOD.md §2): roll out
2G, keep G — negatives uniformly, positives with the fewest tool errors and format faults.
"""

from __future__ import annotations

import random
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from arenaforge.schemas.models import Rollout


def repair_group(group: Sequence[Rollout]) -> list[Rollout] | None:
    """Group without env failures, refilled to its size; None when half or more failed."""
    valid = [r for r in group if r.status != "env_failure"]
    if len(valid) == len(group):
        return list(group)
    if len(valid) * 2 <= len(group):
        return None
    return [valid[i % len(valid)] for i in range(len(group))]


def reward_std(group: Sequence[Rollout]) -> float:
    return statistics.pstdev([r.reward.f1 for r in group]) if len(group) > 1 else 0.0


def penalty(r: Rollout) -> float:
    """rStar2-Agent's p_err + p_format: share of failing calls (0.5 with no calls) + format faults."""
    calls = r.reward.calls
    p_err = 0.5 if calls == 0 else r.tool_errors / calls
    p_format = min(1.0, r.format_errors / max(calls, 1))
    return p_err + p_format


def resample_on_correct(group: Sequence[Rollout], size: int, rng: random.Random,
                        positive_f1: float = 0.5) -> list[Rollout]:
    """Down-sample an oversampled group (2G) to `size`: half of each class, positives by low penalty."""
    if len(group) <= size:
        return list(group)
    positives = [r for r in group if r.reward.f1 >= positive_f1]
    negatives = [r for r in group if r.reward.f1 < positive_f1]
    keep_neg = min(len(negatives), round(len(negatives) * size / len(group)))
    keep_pos = min(len(positives), size - keep_neg)
    keep_neg = size - keep_pos  # fill from negatives when positives run short
    ranked = sorted(positives, key=lambda r: (penalty(r), rng.random()))
    return ranked[:keep_pos] + rng.sample(negatives, keep_neg)


@dataclass
class FillStats:
    generated: int = 0
    zero_variance: int = 0
    env_dropped: int = 0
    env_failed_samples: int = 0


@dataclass
class AdaptiveBatcher:
    """Buffer of informative groups; `offer` every finished group, `take` a full batch."""

    delta: float = 0.0
    group_size: int = 4
    roc: bool = False
    seed: int = 0
    buffer: deque[list[Rollout]] = field(default_factory=deque)
    stats: FillStats = field(default_factory=FillStats)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)

    def offer(self, group: Sequence[Rollout]) -> bool:
        """Keep `group` if it carries gradient signal; returns whether it was buffered."""
        self.stats.generated += 1
        self.stats.env_failed_samples += sum(r.status == "env_failure" for r in group)
        repaired = repair_group(group)
        if repaired is None:
            self.stats.env_dropped += 1
            return False
        if self.roc:
            repaired = resample_on_correct(repaired, self.group_size, self._rng)
        if reward_std(repaired) <= self.delta:
            self.stats.zero_variance += 1
            return False
        self.buffer.append(repaired)
        return True

    def ready(self, groups: int) -> bool:
        return len(self.buffer) >= groups

    def take(self, groups: int) -> list[list[Rollout]]:
        return [self.buffer.popleft() for _ in range(min(groups, len(self.buffer)))]

    def reset_stats(self) -> FillStats:
        stats, self.stats = self.stats, FillStats()
        return stats
