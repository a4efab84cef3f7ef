"""Merging against everything already merged: a run's later windows and a later run join earlier groups.

Offline provider, process sandbox, a real DuckDB warehouse per test. The merge groups are read back from
`env_merges`: a group that grew has one row per size.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from arenaforge.schemas.config import load_config
from arenaforge.schemas.kinds_envs import DistractorPick, DistractorSet, EnvMerge, MergeCandidate
from arenaforge.schemas.models import Environment
from arenaforge.services.run_scope import open_run_scope
from arenaforge.tracks.envs.pipeline import EnvsSpec, build_environments, chunks, synthesize_qas
from arenaforge.tracks.envs.stream import run_envs
from arenaforge.warehouse import Warehouse, lookups

TABLES = ["qa_instances", "qa_verifications", "environments", "env_merges", "merge_candidates", "distractor_sets",
          "rejections"]


def _run(db: Path, run_id: str, **spec: object) -> dict[str, int]:
    cfg = load_config(None, overrides={"warehouse.path": str(db), "sandbox.backend": "process",
                                       "model.backend": "offline"})

    async def go() -> dict[str, int]:
        async with open_run_scope(cfg, Warehouse(db), run_id) as run:
            return await run_envs(run, EnvsSpec(sources=["sample"], **{"merge_across": True, **spec}))

    return asyncio.run(go())


def _groups(db: Path) -> set[tuple[str, frozenset[str]]]:
    """Each merged tool and the QA ids it serves (the largest row of a group that grew)."""
    return _final(Warehouse(db).load(EnvMerge))


def _final(merges: list[EnvMerge]) -> set[tuple[str, frozenset[str]]]:
    """A group is its merged tool and first member; a group that grew keeps its largest row."""
    largest: dict[tuple[str, str | None], EnvMerge] = {}
    for row in merges:
        key = (row.merged_tool, row.members[0].qa_id)
        if row.merged and (key not in largest or len(row.members) > len(largest[key].members)):
            largest[key] = row
    return {(row.merged_tool, frozenset(m.qa_id for m in row.members)) for row in largest.values()}


def _ids(db: Path) -> dict[str, list[str]]:
    wh = Warehouse(db)
    return {t: [r[0] for r in wh.query(f"SELECT id FROM {t} ORDER BY id")[1]] for t in TABLES}


def test_windows_merge_as_one_window_and_a_rerun_adds_nothing(tmp_path: Path) -> None:
    whole = _run(tmp_path / "one.duckdb", "r", n=24, seed=0, batch_size=400, pipeline="stream")
    windows = _run(tmp_path / "windows.duckdb", "r", n=24, seed=0, batch_size=5, pipeline="stream")
    apart = _run(tmp_path / "apart.duckdb", "r", n=24, seed=0, batch_size=5, pipeline="stream", merge_across=False)
    assert whole["merges"] > apart["merges"], "windows of 5 merged apart miss merges the one window makes"
    assert windows["merges"] == whole["merges"] and windows.get("merges_grown", 0) > 0
    assert _groups(tmp_path / "windows.duckdb") == _groups(tmp_path / "one.duckdb")
    # a later window's member serves its QA with the merged tool: the first member's tool, over more data
    wh = Warehouse(tmp_path / "windows.duckdb")
    envs = {e.qa_id: e for e in wh.load(Environment)}
    grown = max((r for r in wh.load(EnvMerge) if r.merged), key=lambda r: len(r.members))
    last = envs[grown.members[-1].qa_id]
    assert grown.merged_tool in last.initial_state and len(last.initial_state[grown.merged_tool]) == grown.rows

    before = _ids(tmp_path / "windows.duckdb")
    again = _run(tmp_path / "windows.duckdb", "r", n=24, seed=0, batch_size=5, pipeline="stream")
    assert _ids(tmp_path / "windows.duckdb") == before, "a re-run writes nothing new"
    assert again["environments"] == windows["environments"]


def test_a_second_runs_equivalent_tool_joins_the_first_runs_group(tmp_path: Path) -> None:
    db = tmp_path / "wh.duckdb"
    _run(db, "first", n=8, seed=0, batch_size=400)
    first_qas = {e.qa_id for e in Warehouse(db).load(Environment)}
    _run(db, "second", n=8, seed=1, batch_size=400)
    second = [r for r in Warehouse(db).load(EnvMerge) if r.run_id == "second" and r.merged]
    across = [r for r in second if {m.qa_id for m in r.members} & first_qas
              and {m.qa_id for m in r.members} - first_qas]
    assert across, "a tool of the second run merged with the first run's equivalent tools"
    # the same two runs with merging inside each run only make fewer merges
    apart = tmp_path / "apart.duckdb"
    _run(apart, "first", n=8, seed=0, batch_size=400, merge_across=False)
    _run(apart, "second", n=8, seed=1, batch_size=400, merge_across=False)
    assert len(_groups(apart)) < len(_groups(db))



def _windows(db: Path, run_id: str, n: int, seed: int, size: int) -> list[list[str]]:
    """The batch pipeline by hand, to know its windows: QAs synthesized, then environments per `size` QA ids."""
    cfg = load_config(None, overrides={"warehouse.path": str(db), "sandbox.backend": "process",
                                       "model.backend": "offline"})
    spec = EnvsSpec(sources=["sample"], merge_across=True, n=n, seed=seed, batch_size=size)

    async def go() -> list[list[str]]:
        async with open_run_scope(cfg, Warehouse(db), run_id) as run:
            ids, _ = await synthesize_qas(run, spec)
            windows = chunks(ids, size)
            for window in windows:
                await build_environments(run, spec, window)
            return windows

    return asyncio.run(go())


def _picks(db: Path, run_id: str) -> dict[str, list[DistractorPick]]:
    """QA id -> the distractor picks of its environment (written by `run_id`); checks none is one of its own tools."""
    wh = Warehouse(db)
    envs = {e.id: e for e in wh.load(Environment)}
    cands = wh.load(MergeCandidate)
    sig = {(c.qa_id, c.doc.name): c.signature for c in cands}
    out = {}
    for s in wh.load(DistractorSet):
        if s.run_id != run_id:
            continue
        env = envs[s.env_id]
        own = {t.name for t in env.tools} - {p.name for p in s.picks}
        own_sigs = {c.signature for c in cands if c.qa_id == env.qa_id}
        assert own_sigs, "every tool was a merge candidate"
        for p in s.picks:
            assert p.name not in own and p.source_env != env.qa_id
            assert (p.source_env, p.name) in sig and sig[(p.source_env, p.name)] not in own_sigs
        out[env.qa_id] = s.picks
    return out


def test_distractors_come_from_earlier_windows_and_earlier_runs(tmp_path: Path) -> None:
    db = tmp_path / "wh.duckdb"
    windows = _windows(db, "first", n=24, seed=0, size=5)
    assert len(windows) >= 3
    where = {qa: k for k, w in enumerate(windows) for qa in w}
    picks = _picks(db, "first")
    earlier = [(qa, p) for qa, ps in picks.items() for p in ps if where[p.source_env] < where[qa]]
    assert earlier, "a later window's environment drew a distractor from an earlier window's tools"
    assert all(where[p.source_env] <= where[qa] for qa, ps in picks.items() for p in ps), "never a later window's"

    before = _ids(db)
    assert _windows(db, "first", n=24, seed=0, size=5) == windows
    assert _ids(db) == before, "same inputs, same seed: same picks, nothing new written"

    _windows(db, "second", n=8, seed=1, size=400)
    second = _picks(db, "second")
    own_qas = set(second)
    assert any(p.source_env in where and p.source_env not in own_qas for ps in second.values() for p in ps), \
        "the second run drew from the first run's tools"
    after = _ids(db)
    _windows(db, "first", n=24, seed=0, size=5)
    assert _ids(db) == after, "a re-run of the first run does not draw from the later run's tools"


def test_earlier_runs_join_the_distractor_pool_up_to_its_cap(tmp_path: Path) -> None:
    """`distractor_pool_max`: a run loads only the most recent tools of earlier runs (in arrival order); 0: none."""
    db = tmp_path / "wh.duckdb"
    first = {qa for w in _windows(db, "first", n=24, seed=0, size=5) for qa in w}
    wh = Warehouse(db)
    every = lookups.earlier_runs_candidates(wh, "second")
    assert len(every) > 6
    assert lookups.earlier_runs_candidates(wh, "second", 6) == every[-6:]
    assert lookups.earlier_runs_candidates(wh, "second", 0) == []

    _run(db, "second", n=8, seed=1, batch_size=400, distractor_pool_max=0)
    picks = _picks(db, "second")
    assert picks and not any(p.source_env in first and p.source_env not in picks for ps in picks.values() for p in ps), \
        "with the cap at 0 no earlier run's tool is drawn"


def test_runs_with_the_same_parameters_are_one_run_for_the_distractor_pool(tmp_path: Path) -> None:
    """A re-run, or the run completing a crashed one, has the first run's parameters (the warehouse may be named
    otherwise): it draws nothing from that run's tools, or its environments would get other distractors (new rows
    for the same QAs; tests/flows/test_crash_resume.py runs it through the CLI). A run with other parameters does."""
    from arenaforge.warehouse.runs import start_run

    db = tmp_path / "wh.duckdb"
    wh = Warehouse(db)
    params = {"n": 24, "merge_across": True, "overrides": {"warehouse.path": "wh.duckdb"}}
    first = start_run(wh, "envs", params)
    _windows(db, first.id, n=24, seed=0, size=5)
    again = start_run(wh, "envs", {**params, "overrides": {"warehouse.path": str(db)}})
    other = start_run(wh, "envs", {**params, "n": 8})
    assert lookups.same_runs(wh, again.id) == sorted([first.id, again.id])
    assert lookups.earlier_runs_candidates(wh, again.id) == []
    drawn = lookups.earlier_runs_candidates(wh, other.id)
    assert drawn and {c.run_id for c in drawn} == {first.id}
