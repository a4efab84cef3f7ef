"""Which environment the next GRPO group rolls out: a curriculum by measured pass rate.

A group carries gradient only when its rewards differ. An environment the policy always solves
(pass rate 1) or never solves (0) yields zero-variance groups that adaptive filling throws away,
so the sampler weights each environment by p(1 - p), p its measured mean reward: the estimate
of the environment once it has been rolled out, before that of its structure (single-hop,
multi-hop, ...), before that a prior of 0.5. Early on this favours the structures the warm-started
policy half-solves (the easy ones); as they saturate their weight falls and the harder ones,
whose pass rate has risen meanwhile, take over. A floor keeps every environment reachable.
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from arenaforge.schemas.models import Environment

FLOOR = 0.02  # weight of an environment measured as always or never solved
PRIOR = 0.5


@dataclass
class _Mean:
    total: float = 0.0
    count: int = 0

    def add(self, values: Sequence[float]) -> None:
        self.total += sum(values)
        self.count += len(values)

    @property
    def value(self) -> float | None:
        return self.total / self.count if self.count else None


@dataclass
class Curriculum:
    """`pick(k)` the environment of group k; `observe` each finished group's rewards."""

    envs: Sequence[Environment]
    structure_of: Mapping[str, str] = field(default_factory=dict)  # env id -> structure (stratum)
    seed: int = 0
    adaptive: bool = True  # False: cycle through envs in order (the pre-curriculum behaviour)
    _by_env: dict[str, _Mean] = field(default_factory=dict)
    _by_structure: dict[str, _Mean] = field(default_factory=dict)

    def pick(self, k: int) -> Environment:
        if not self.adaptive:
            return self.envs[k % len(self.envs)]
        weights = [self.weight(e) for e in self.envs]
        return random.Random(self.seed * 1_000_003 + k).choices(self.envs, weights)[0]

    def pass_rate(self, env: Environment) -> float:
        for estimate in (self._by_env.get(env.id), self._by_structure.get(self.structure_of.get(env.id, ""))):
            if estimate is not None and estimate.value is not None:
                return estimate.value
        return PRIOR

    def weight(self, env: Environment) -> float:
        p = self.pass_rate(env)
        return max(p * (1 - p), FLOOR)

    def observe(self, env_id: str, rewards: Sequence[float]) -> None:
        self._by_env.setdefault(env_id, _Mean()).add(rewards)
        self._by_structure.setdefault(self.structure_of.get(env_id, ""), _Mean()).add(rewards)

    def structure_pass_rates(self) -> dict[str, float]:
        return {s: round(m.value, 4) for s, m in sorted(self._by_structure.items()) if m.value is not None}
