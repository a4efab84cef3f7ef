"""BFCL multi-turn import (issue 15): every imported task's gold replay, turn by turn in one sandbox session,
reproduces BFCL's own executor (`execute_multi_turn_func_call`, run here in-process) call for call and its
classes' state after every turn; environments read back from the warehouse replay the same; miss_func tools
appear at their turn. Needs bfcl-eval (scripts/setup.sh installs it without its dependencies)."""

from __future__ import annotations

import asyncio
import itertools

import pytest

from arenaforge.environments.runtime import create_pool
from arenaforge.environments.state import namespace_state, state_hash
from arenaforge.schemas.config import SandboxConfig
from arenaforge.schemas.models import Environment, Rejection
from arenaforge.warehouse import Warehouse
from tests.support.requirements import require_bfcl, require_docker

CATEGORIES = ["base", "miss_param", "miss_func", "long_context"]
_runs = itertools.count()


def sandbox(backend: str) -> SandboxConfig:
    return SandboxConfig(backend=backend, pool_size=2, output_limit_bytes=8 << 20, call_timeout_s=30.0)


def bfcl_reference(entry: dict, answer: dict, category: str) -> tuple[list[list[str]], list[str]]:
    """BFCL's executor on the ground truth, turn by turn: each call's result and the classes' state hash."""
    from bfcl_eval.eval_checker.multi_turn_eval.multi_turn_utils import execute_multi_turn_func_call

    model = f"arenaforge_reference_{next(_runs)}"  # BFCL keeps instances in its module globals under this name
    results, hashes = [], []
    for turn in answer["ground_truth"]:
        out, instances = execute_multi_turn_func_call(turn, entry["initial_config"], entry["involved_classes"], model,
                                                      entry["id"], long_context=category == "long_context")
        results.append(out)
        hashes.append(state_hash({c: namespace_state(i) for c, i in instances.items()}))  # as BFCL compares: every class
    return results, hashes


@pytest.fixture(scope="module")
def bfcl():
    require_bfcl()
    from arenaforge.tracks.envs.import_bfcl import locate

    return locate()


# Every task on the process backend; on Docker (the same worker code, a container around it) the first 50 of each
# category, which include MathAPI tasks and their derived image: the whole suite twice cost CI ~5 minutes.
@pytest.mark.parametrize("backend, per_category", [("process", None),
                                                   pytest.param("docker", 50, marks=pytest.mark.docker)])
def test_every_gold_replay_reproduces_bfcl_s_executor(bfcl, backend: str, per_category: int | None) -> None:
    from arenaforge.tracks.envs.import_bfcl import import_suite

    if backend == "docker":
        require_docker()

    async def scenario() -> tuple:
        async with await create_pool(sandbox(backend)) as pool:
            return await import_suite(pool, bfcl, CATEGORIES, per_category)

    envs, rejections = asyncio.run(scenario())
    by_task = {e.native.source.rsplit(": ", 1)[1]: e for e in envs}
    entries = {e["id"]: (c, e, a) for c in CATEGORIES for e, a in bfcl.entries(c)[:per_category]}
    # every task imports: MathAPI's declare mpmath, installed from local wheels into the session's import path
    assert len(entries) == len(envs) == (per_category or 200) * 4 and rejections == []
    math_tasks = {e["id"] for _, e, _ in entries.values() if "MathAPI" in e["involved_classes"]}
    assert len(math_tasks) == (100 if per_category is None else len(math_tasks)) > 0
    assert all(by_task[t].requirements == ["mpmath==1.3.0"] for t in math_tasks)
    mismatched = []
    for task_id, env in by_task.items():
        category, entry, answer = entries[task_id]
        results, hashes = bfcl_reference(entry, answer, category)
        ours = env.native.turns
        if [t["gold_results"] for t in ours] != results or [t["state_sha256"] for t in ours] != hashes:
            mismatched.append(task_id)
    assert mismatched == [] and len(by_task) == len(envs)


def test_warehouse_copies_replay_the_same_and_missed_tools_wait_for_their_turn(bfcl, tmp_path) -> None:
    from arenaforge.tracks.envs.import_bfcl import import_suite, replay_task, task_environment

    async def imported() -> tuple:
        async with await create_pool(sandbox("process")) as pool:
            return await import_suite(pool, bfcl, ["miss_func", "long_context"], limit=12)

    envs, rejections = asyncio.run(imported())
    wh = Warehouse(tmp_path / "wh.duckdb")
    wh.upsert([*envs, *rejections])
    loaded = {e.id: e for e in wh.load(Environment)}
    assert set(loaded) == {e.id for e in envs} and len(wh.load(Rejection)) == len(rejections)
    entries = {e["id"]: (c, e, a) for c in ("miss_func", "long_context") for e, a in bfcl.entries(c)}

    async def replay_loaded() -> list:
        async with await create_pool(sandbox("process")) as pool:
            out = []
            for env in loaded.values():
                category, entry, answer = entries[env.native.source.rsplit(": ", 1)[1]]
                task = task_environment(bfcl, category, entry, answer)
                task.env = env  # the warehouse's copy: its state's key order must have survived
                out.append((env, await replay_task(pool, task)))
            missed = next(e for e in loaded.values() if e.tool_turns)
            session = await pool.open(missed)
            tool, turn = next(iter(missed.tool_turns.items()))
            early = await pool.call(session, tool, {})
            await pool.close(session)
            return out, missed, tool, turn, early

    replays, missed, tool, turn, early = asyncio.run(replay_loaded())
    for env, replayed in replays:
        assert replayed["state_sha256"] == [t["state_sha256"] for t in env.native.turns], env.name
        assert replayed["results"] == [t["gold_results"] for t in env.native.turns], env.name
    assert turn > 0 and early.outcome == "error" and f"unknown tool {tool!r}" in (early.error or "")
    assert tool not in [t.name for t in missed.visible_tools(turn - 1)] and tool in [t.name for t in missed.visible_tools(turn)]
