"""The GRPO environment sampler: weight p(1 - p) by measured pass rate, per environment before per structure."""

from __future__ import annotations

from collections import Counter

from arenaforge.tracks.train.curriculum import FLOOR, PRIOR, Curriculum
from tests.support.rl import tiny_env


def _envs():
    return [tiny_env(country=c, name=f"env-{c}") for c in ("A", "B", "C", "D")]


def test_weights_follow_measured_pass_rates():
    envs = _envs()
    cur = Curriculum(envs, {envs[0].id: "easy", envs[1].id: "easy", envs[2].id: "hard", envs[3].id: "hard"})
    assert cur.pass_rate(envs[0]) == PRIOR
    cur.observe(envs[0].id, [1.0, 1.0, 1.0, 1.0])  # always solved: no variance to learn from
    cur.observe(envs[2].id, [0.0, 0.0, 0.0, 0.0])  # never solved
    cur.observe(envs[1].id, [1.0, 0.0, 1.0, 0.0])  # half: the most informative
    assert cur.weight(envs[0]) == FLOOR and cur.weight(envs[2]) == FLOOR and cur.weight(envs[1]) == 0.25
    assert cur.pass_rate(envs[3]) == 0.0  # unseen: its structure's estimate ("hard": 0 of 4)
    assert cur.structure_pass_rates() == {"easy": 0.75, "hard": 0.0}
    picks = Counter(cur.pick(k).id for k in range(400))
    assert picks.most_common(1)[0][0] == envs[1].id and picks[envs[1].id] > 300


def test_picks_are_seeded_and_cycling_is_available():
    envs = _envs()
    a, b = Curriculum(envs, seed=3), Curriculum(envs, seed=3)
    assert [a.pick(k).id for k in range(20)] == [b.pick(k).id for k in range(20)]
    plain = Curriculum(envs, adaptive=False)
    assert [plain.pick(k).name for k in range(5)] == ["env-A", "env-B", "env-C", "env-D", "env-A"]
