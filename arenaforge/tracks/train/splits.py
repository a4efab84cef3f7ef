"""Train/test splits of environments, stored in the warehouse (`env_splits`).

Held-out means held out as a kind of task, not only as an instance: environments are grouped
into near-duplicate groups (same set of gold tools and the same question once its own entity
values are masked), and a whole group goes to one split. Groups are stratified by
`<source>/<QA structure>`: in each stratum a `test_share` of the groups, in a seeded hash
order, is held out. Assignments are append-only: an environment keeps its split, environments
synthesized later join their group's split or, for a new group, fill their stratum up to the
share. Warm start, SFT and GRPO read `train`; eval defaults to `test`.
"""

from __future__ import annotations

import hashlib
import re
from collections import defaultdict
from collections.abc import Mapping, Sequence

from arenaforge.schemas.kinds_training import EnvSplit
from arenaforge.schemas.models import Environment, QAInstance
from arenaforge.warehouse import Warehouse
from arenaforge.warehouse.splits import read_splits, write_splits

DEFAULT_SCHEME = "default"
DEFAULT_TEST_SHARE = 0.2


def question_template(env: Environment) -> str:
    """The question with the environment's own values (gold arguments and answers) masked, lowercased."""
    text = (env.question or "").lower()
    values = {str(v).lower() for c in env.calls for v in c.arguments.values() if isinstance(v, (str, int, float))}
    values |= {a.lower() for a in env.gold_answers}
    for value in sorted((v for v in values if v.strip()), key=len, reverse=True):  # longest first: no partial masks
        text = re.sub(rf"(?<![\w]){re.escape(value)}(?![\w])", "<v>", text)
    return re.sub(r"\s+", " ", text).strip()


def near_duplicate_group(env: Environment) -> str:
    """Group key: hash of (sorted set of gold tool names, question template)."""
    tools = ",".join(sorted({c.tool for c in env.calls}))
    return hashlib.sha256(f"{tools}\n{question_template(env)}".encode()).hexdigest()[:16]


def stratum(qa: QAInstance | None) -> str:
    return f"{qa.source}/{qa.structure}" if qa else "unknown/unknown"


def _order(seed: int, group: str) -> str:
    return hashlib.sha256(f"{seed}:{group}".encode()).hexdigest()


def assign_splits(envs: Sequence[Environment], qas: Mapping[str, QAInstance], existing: Mapping[str, EnvSplit],
                  *, scheme: str = DEFAULT_SCHEME, test_share: float = DEFAULT_TEST_SHARE, seed: int = 0
                  ) -> list[EnvSplit]:
    """Split rows for the environments of `envs` not yet in `existing` (env id -> row)."""
    info = {e.id: (near_duplicate_group(e), stratum(qas.get(e.qa_id or ""))) for e in envs}
    group_split = {row.group: row.split for row in existing.values()}
    group_stratum: dict[str, str] = {}
    for env_id, (group, cell) in sorted(info.items()):
        group_stratum.setdefault(group, cell)
    for row in existing.values():
        group_stratum.setdefault(row.group, row.stratum)
    by_stratum: dict[str, list[str]] = defaultdict(list)
    for group, cell in group_stratum.items():
        by_stratum[cell].append(group)
    for cell, groups in by_stratum.items():
        fresh = sorted((g for g in groups if g not in group_split), key=lambda g: _order(seed, g))
        held = sum(1 for g in groups if group_split.get(g) == "test")
        need = max(0, round(test_share * len(groups)) - held)
        for index, group in enumerate(fresh):
            group_split[group] = "test" if index < need else "train"
    return [
        EnvSplit(scheme=scheme, env_id=env_id, split=group_split[group], stratum=cell, group=group,  # type: ignore[arg-type]
                 test_share=test_share, seed=seed, parents=[env_id])
        for env_id, (group, cell) in sorted(info.items()) if env_id not in existing
    ]


def ensure_splits(wh: Warehouse, *, scheme: str = DEFAULT_SCHEME, test_share: float = DEFAULT_TEST_SHARE,
                  seed: int = 0, run_id: str | None = None) -> dict[str, EnvSplit]:
    """Every warehouse environment's split in `scheme`, assigning (and storing) the ones not assigned yet."""
    existing = read_splits(wh, scheme)
    envs = wh.load(Environment)
    missing = [e for e in envs if e.id not in existing]
    if missing:
        qas = {q.id: q for q in wh.load(QAInstance)}
        rows = [r.model_copy(update={"run_id": run_id}) for r in
                assign_splits(envs, qas, existing, scheme=scheme, test_share=test_share, seed=seed)]
        write_splits(wh, rows)
        existing = {**existing, **{r.env_id: r for r in rows}}
    return existing


def held_out_ids(wh: Warehouse, scheme: str = DEFAULT_SCHEME) -> set[str]:
    """Ids of the environments in the test split (assigned now where they are not yet): what exports hold out."""
    return {env_id for env_id, row in ensure_splits(wh, scheme=scheme).items() if row.split == "test"}
