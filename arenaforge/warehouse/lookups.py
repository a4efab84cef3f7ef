"""Typed reads the stages make by purpose (the SQL lives here, not in the stages)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any, TypeVar

from arenaforge.schemas.base import Record
from arenaforge.schemas.errors import InputError
from arenaforge.schemas.kinds_envs import MergeCandidate
from arenaforge.schemas.models import Run, Server, Tool
from arenaforge.warehouse.db import Warehouse

R = TypeVar("R", bound=Record)


def by_ids(wh: Warehouse, model: type[R], ids: Sequence[str]) -> list[R]:
    """The records of `model` with these ids, ordered by id (missing ids are skipped)."""
    if not ids:
        return []
    _, rows = wh.query(f"SELECT record FROM {model.TABLE} WHERE list_contains(?, id) ORDER BY id", [list(ids)])
    return [model.model_validate_json(r[0]) for r in rows]


def merge_candidates(wh: Warehouse, signatures: Sequence[str]) -> list[MergeCandidate]:
    """Every merge candidate of the groups holding a tool with one of these signatures, each group in arrival
    order (a tool seen by several runs comes once per run: the caller keeps the first)."""
    if not signatures:
        return []
    _, rows = wh.query("SELECT record FROM merge_candidates WHERE record->>'group' IN "
                       "(SELECT record->>'group' FROM merge_candidates WHERE list_contains(?, record->>'signature')) "
                       "ORDER BY record->>'group', CAST(record->>'position' AS INTEGER), created_at, id",
                       [list(signatures)])
    return [MergeCandidate.model_validate_json(r[0]) for r in rows]


def earlier_runs_candidates(wh: Warehouse, run_id: str | None, limit: int | None = None) -> list[MergeCandidate]:
    """The merge candidates other runs wrote before this run's first one, in the order they were written (a run's
    distractor pool; the cut keeps a re-run's pool what it was, whatever runs came since); with `limit`, only the
    most recent `limit` of them. The runs `same_runs` gives count as this run: a re-run, or the run completing a
    crashed one, draws from what came before the first of them, never from their tools (its windows would draw
    other distractors than the first time, so the same QAs would get new environments)."""
    same = same_runs(wh, run_id)
    newest_first = "ORDER BY created_at DESC, id DESC" + (" LIMIT ?" if limit is not None else "")
    _, rows = wh.query("SELECT record FROM merge_candidates WHERE NOT coalesce(list_contains(?, run_id), false) "
                       "AND created_at < coalesce((SELECT min(created_at) FROM merge_candidates "
                       "WHERE list_contains(?, run_id)), 'infinity'::TIMESTAMP) "
                       + newest_first, [same, same, *([limit] if limit is not None else [])])
    return [MergeCandidate.model_validate_json(r[0]) for r in reversed(rows)]


def same_runs(wh: Warehouse, run_id: str | None) -> list[str]:
    """`run_id` and every run of its flow with its parameters (where the warehouse is named aside: it is this one)."""
    this = wh.get(Run, run_id) if run_id else None
    if this is None:
        return [run_id] if run_id else []
    key = _params_key(this.params)
    return sorted({run_id, *(r.id for r in wh.load(Run, where="(record->>'flow') = ?", params=[this.flow])
                             if _params_key(r.params) == key)})


def _params_key(params: dict[str, Any]) -> str:
    overrides = {k: v for k, v in (params.get("overrides") or {}).items() if k != "warehouse.path"}
    return json.dumps({**params, "overrides": overrides}, sort_keys=True)


def servers_with_tools(wh: Warehouse, names: Sequence[str] | None = None) -> tuple[list[Server], dict[str, list[Tool]]]:
    """Servers (latest record per name) and their tools by server, sorted by tool name; unknown names are an error."""
    name_filter = "WHERE list_contains(?, record->>'name')" if names else ""
    _, rows = wh.query(f"SELECT record FROM servers {name_filter} ORDER BY created_at, id", [list(names)] if names else [])
    servers: dict[str, Server] = {}
    for (raw,) in rows:
        server = Server.model_validate_json(raw)
        servers[server.name] = server
    if names:
        missing = sorted(set(names) - set(servers))
        if missing:
            raise InputError(f"unknown server(s): {', '.join(missing)}; see `arenaforge db show v_servers`")
    tool_filter = "WHERE list_contains(?, record->>'server')" if names else ""
    _, rows = wh.query(f"SELECT record FROM tools {tool_filter} ORDER BY created_at, id", [list(names)] if names else [])
    tools: dict[str, dict[str, Tool]] = {n: {} for n in servers}
    for (raw,) in rows:
        tool = Tool.model_validate_json(raw)
        if tool.server in servers and tool.function.name in servers[tool.server].tool_names:
            tools[tool.server][tool.function.name] = tool
    return list(servers.values()), {n: [ts[k] for k in sorted(ts)] for n, ts in tools.items()}


def cached_responses(wh: Warehouse, model: str) -> dict[str, str]:
    """The response cache of one model: request key -> response JSON."""
    _, rows = wh.query("SELECT key, response FROM llm_cache WHERE model = ?", [model])
    return {key: response for key, response in rows}


def kept_trajectory_scores(wh: Warehouse, run_id: str | None = None, min_score: float | None = None) -> dict[str, float]:
    """Trajectory id -> judge score of the trajectories kept for SFT (`v_sft_kept`), optionally of one run's
    judgements and at least `min_score`."""
    sql = "SELECT id, score FROM v_sft_kept"
    params: list[Any] = []
    clauses = []
    if run_id:
        clauses.append("id IN (SELECT (record->>'trajectory_id') FROM judge_scores WHERE run_id = ?)")
        params.append(run_id)
    if min_score is not None:
        clauses.append("score >= ?")
        params.append(min_score)
    if clauses:
        sql += " WHERE " + " AND ".join(clauses)
    _, rows = wh.query(sql, params)
    return {r[0]: float(r[1]) for r in rows}
