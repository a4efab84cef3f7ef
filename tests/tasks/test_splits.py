"""Splits are data: near-duplicate groups stay together, strata are held out by share, assignments are
append-only, and no test environment reaches any training input (warm start, GRPO rollouts)."""

from __future__ import annotations

import asyncio
import json
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from arenaforge.schemas.config import load_config
from arenaforge.schemas.kinds_training import EnvSplit
from arenaforge.schemas.models import Environment, QAInstance, Rollout, Run
from arenaforge.tracks.train.splits import assign_splits, ensure_splits, near_duplicate_group, question_template
from arenaforge.warehouse.splits import read_splits, split_env_ids
from tests.support.rl import tiny_env


@pytest.fixture(scope="module")
def synthesized(tmp_path_factory) -> Path:
    """A warehouse with 32 offline environments from the bundled sample source (process sandbox)."""
    from arenaforge.services.run_scope import open_run_scope
    from arenaforge.tracks.envs.pipeline import EnvsSpec, build_environments, synthesize_qas
    from arenaforge.warehouse import Warehouse

    db = tmp_path_factory.mktemp("splits") / "wh.duckdb"
    cfg = load_config(None, overrides={"warehouse.path": str(db), "sandbox.backend": "process",
                                       "model.backend": "offline"})
    wh = Warehouse(db)
    spec = EnvsSpec(sources=["sample"], n=32, seed=0)

    async def build() -> None:
        async with open_run_scope(cfg, wh, "test") as run:
            qa_ids, _ = await synthesize_qas(run, spec)
            await build_environments(run, spec, qa_ids)

    asyncio.run(build())
    return db


def test_question_template_masks_the_envs_own_values():
    a, b = tiny_env(), tiny_env(country="Sylvania", capital="Ostia", population=5150)
    assert question_template(a) == question_template(b) == "how many people live in the capital of <v>?"
    assert near_duplicate_group(a) == near_duplicate_group(b)


def test_groups_never_straddle_and_each_stratum_holds_out_its_share(synthesized):
    from arenaforge.warehouse import Warehouse

    wh = Warehouse(synthesized)
    envs, qas = wh.load(Environment), {q.id: q for q in wh.load(QAInstance)}
    rows = assign_splits(envs, qas, {}, test_share=0.25, seed=0)
    assert len(rows) == len(envs) and {r.split for r in rows} == {"train", "test"}
    by_group = defaultdict(set)
    for r in rows:
        by_group[r.group].add(r.split)
    assert all(len(splits) == 1 for splits in by_group.values())
    groups = defaultdict(lambda: defaultdict(set))
    for r in rows:
        groups[r.stratum][r.split].add(r.group)
    for stratum, split_groups in groups.items():
        total = len(split_groups["train"] | split_groups["test"])
        assert len(split_groups["test"]) == round(0.25 * total), stratum
    assert {r.stratum.split("/")[1] for r in rows} == {q.structure for q in qas.values()}
    again = assign_splits(envs, qas, {}, test_share=0.25, seed=0)
    assert [(r.env_id, r.split) for r in again] == [(r.env_id, r.split) for r in rows]  # deterministic


def test_assignments_are_append_only(tmp_warehouse):
    first = tiny_env()
    tmp_warehouse.upsert([first])
    rows = ensure_splits(tmp_warehouse, test_share=1.0)
    assert rows[first.id].split == "test"
    # a near-duplicate synthesized later joins its group's split, whatever the share now is
    later = tiny_env(country="Sylvania", capital="Ostia", population=5150)
    tmp_warehouse.upsert([later])
    rows = ensure_splits(tmp_warehouse, test_share=0.0)
    assert rows[later.id].split == "test" and rows[first.id].split == "test"
    assert split_env_ids(tmp_warehouse, "test") == {first.id, later.id}
    assert len(tmp_warehouse.load(EnvSplit)) == 2 and set(read_splits(tmp_warehouse)) == {first.id, later.id}


@pytest.mark.slow
def test_no_test_environment_reaches_any_training_input(synthesized, tmp_path, monkeypatch):
    """Warm start (gold replays + kept trajectories) and GRPO read train only; eval reads test only."""
    from arenaforge.tracks.train.grpo_job import grpo_job
    from arenaforge.tracks.train.job_config import open_job_scope
    from arenaforge.tracks.train.params import EnvSelection, EpisodeParams, GrpoParams
    from arenaforge.warehouse import Warehouse

    monkeypatch.setenv("ARENAFORGE_SANDBOX__BACKEND", "process")
    params = GrpoParams(db=str(synthesized), model_path="tiny", out_dir=str(tmp_path), experiment="leak",
                        steps=1, group_size=2, batch_groups=1, max_groups_per_step=3, warmstart_steps=2,
                        warmstart_batch_size=2, eval_limit=3, envs=EnvSelection(split="train"),
                        episode=EpisodeParams(max_turns=1, max_length=24, max_tokens_per_turn=8))
    eval_rollouts: dict = {}

    async def train() -> dict:
        async with open_job_scope(params, "train-grpo") as scope:
            return await grpo_job(scope, params, eval_rollouts)

    result = asyncio.run(train())
    wh = Warehouse(synthesized)
    train, test = split_env_ids(wh, "train"), split_env_ids(wh, "test")
    assert train and test and not train & test
    warm = [json.loads(line) for line in (tmp_path / "leak-warmstart" / "warmstart.jsonl").read_text().splitlines()]
    replayed = {row["env_id"] for row in warm if "env_id" in row}
    assert replayed and replayed <= train
    questions = {e.question for e in wh.load(Environment) if e.id in test}
    assert not any(m.get("content") in questions for row in warm for m in row["messages"])
    trained = wh.load(Rollout, where="run_id = ?", params=[result["run_id"]])
    assert trained and {r.env_id for r in trained} <= train
    assert set(result["eval"]) == {"untrained", "warm start", "warm start + GRPO"}
    assert set(eval_rollouts) == set(result["eval"])
    for label, row in result["eval"].items():
        evaluated = wh.load(Rollout, where="run_id = ?", params=[row["run_id"]])
        assert len(evaluated) == 3 and {r.env_id for r in evaluated} <= test
        assert {r.id for r in eval_rollouts[label]} == {r.id for r in evaluated}  # what `bench learning` pairs on
    flows = Counter(r.flow for r in wh.load(Run))
    assert flows["eval"] == 3 and flows["train-grpo"] == 1 and flows["train-warmstart"] == 1
