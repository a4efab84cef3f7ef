"""τ²-bench retail's own database and gold actions, many sessions at once (issue 35's state-read check).

The state is τ²-bench's retail `db.json` (2.8 MB) and each episode is one of its `tasks.json` tasks' gold
`actions`, both from `shared/data/tau2_retail` (MIT). The tools are the tau2-style retail tools of `retail_state`
plus the three its tasks also call, with their arguments validated by pydantic as τ²-bench's are: the environment
declares `pydantic`, so its sessions run in the derived-image workers. (τ²-bench's own tool sources are not on this
machine; its airline domain is not in the shared data either.)

Each task first runs alone, one after another: the reference outcome of each call and the hash of its final state.
Then `sessions` tasks run at once, `rounds` times, each in a fresh session: printed per round, the calls whose
outcome and output equal the task's alone run, the final states read back (`pool.state`) and equal to the alone
run's, how many workers served the sessions, the wall time, and the first few failures. Goal (issue 35): every
call and every final state, in every round.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import time
from pathlib import Path
from typing import Any

from arenaforge.benchmarks.retail_state import TOOLS, TOOLS_CODE
from arenaforge.environments.runtime import EnvironmentFailure, create_pool
from arenaforge.schemas.config import SandboxConfig
from arenaforge.schemas.errors import InputError
from arenaforge.schemas.models import Environment, FunctionDoc
from arenaforge.tracks.envs.knowledge import default_shared_data

PYDANTIC = "pydantic==2.14.3"
MORE_TOOLS_CODE = '''

from pydantic import validate_call


def get_item_details(item_id: str) -> dict:
    for product in DB["products"].values():
        if item_id in product["variants"]:
            return product["variants"][item_id]
    raise ValueError("Item not found")


def modify_pending_order_items(order_id: str, item_ids: list[str], new_item_ids: list[str],
                               payment_method_id: str) -> dict:
    order = _order(order_id)
    if order["status"] != "pending":
        raise ValueError("Non-pending order cannot be modified")
    if payment_method_id not in _user(order["user_id"])["payment_methods"]:
        raise ValueError("Payment method not found")
    swaps, diff = _swaps(order, item_ids, new_item_ids)
    for item, variant in swaps:
        item.update(item_id=variant["item_id"], price=variant["price"], options=variant["options"])
    order["payment_history"].append({"transaction_type": "payment" if diff > 0 else "refund",
                                     "amount": round(abs(diff), 2), "payment_method_id": payment_method_id})
    order["status"] = "pending (item modified)"
    return order


def transfer_to_human_agents(summary: str) -> str:
    return "Transfer successful"


for _tool in TOOL_NAMES:  # τ²-bench's tools take their arguments through pydantic
    globals()[_tool] = validate_call(globals()[_tool])
'''
MORE_TOOLS = ("get_item_details", "modify_pending_order_items", "transfer_to_human_agents")


def tau2_environment(db: dict[str, Any]) -> Environment:
    names = (*TOOLS, *MORE_TOOLS)
    code = f"TOOL_NAMES = {names!r}\n{TOOLS_CODE}{MORE_TOOLS_CODE}"
    return Environment(name="tau2-retail", tools=[FunctionDoc(name=n) for n in names], code=code, data_var="DB",
                       initial_state=db, requirements=[PYDANTIC])


def tau2_episodes(tasks: list[dict[str, Any]]) -> list[list[tuple[str, dict[str, Any]]]]:
    """Each task's gold actions as (tool, arguments), tasks without any left out."""
    episodes = []
    for task in tasks:
        actions = (task.get("evaluation_criteria") or {}).get("actions") or []
        if actions:
            episodes.append([(a["name"], a.get("arguments") or {}) for a in actions])
    return episodes


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()


async def _episode(pool: Any, env: Environment, calls: list[tuple[str, dict[str, Any]]]) -> dict[str, Any]:
    """One task in a fresh session: each call's (outcome, output) digest (None: the sandbox failed), how many calls
    were `ok`, the final state's digest (None: unread), the worker that served it, and the first failure's text."""
    seen: list[str | None] = []
    state, worker, failure, ok = None, None, None, 0
    try:
        session = await pool.open(env)
    except EnvironmentFailure as err:
        return {"calls": [None] * len(calls), "ok": 0, "state": None, "worker": None, "failure": f"open: {err}"}
    try:
        worker = session.worker.name if session.worker else None
        for tool, args in calls:
            try:
                obs = await pool.call(session, tool, args)
                seen.append(_digest([obs.outcome, obs.output, obs.error]))
                ok += obs.outcome == "ok"
            except EnvironmentFailure as err:
                seen.append(None)
                failure = failure or f"{tool}: {type(err).__name__}: {err}"
        try:
            state = _digest(await pool.state(session))
        except EnvironmentFailure as err:
            failure = failure or f"state: {type(err).__name__}: {err}"
    finally:
        await pool.close(session)
    return {"calls": seen, "ok": ok, "state": state, "worker": worker, "failure": failure}


async def main(backend: str = "docker", sessions: int = 50, rounds: int = 3, shared_data: str = "") -> dict[str, Any]:
    """τ²-bench retail tasks, `sessions` at once, `rounds` times, against each task alone.

    Args:
        backend: Sandbox backend: process or docker (default limits otherwise).
        sessions: Tasks run at once per round (the first tasks with gold actions).
        rounds: Rounds in a row.
        shared_data: Path of ../shared/data (default: beside the checkout).
    """
    root = Path(shared_data) if shared_data else default_shared_data()
    source = root / "tau2_retail"
    if not (source / "db.json").is_file() or not (source / "tasks.json").is_file():
        raise InputError(f"no τ²-bench retail data at {source} (db.json, tasks.json): pass --shared-data")
    db = json.loads((source / "db.json").read_text())
    episodes = tau2_episodes(json.loads((source / "tasks.json").read_text()))[:sessions]
    env = tau2_environment(db)
    pool = await create_pool(SandboxConfig(backend=backend))
    try:
        alone = [await _episode(pool, env, calls) for calls in episodes]
        per_round = []
        for _ in range(rounds):
            started = time.monotonic()
            runs = await asyncio.gather(*(_episode(pool, env, calls) for calls in episodes))
            per_round.append({
                "calls_matching": sum(a == b and a is not None for run, ref in zip(runs, alone)
                                      for a, b in zip(run["calls"], ref["calls"])),
                "states_read": sum(run["state"] is not None for run in runs),
                "states_equal": sum(run["state"] == ref["state"] and run["state"] is not None
                                    for run, ref in zip(runs, alone)),
                "workers": len({run["worker"] for run in runs if run["worker"]}),
                "wall_s": round(time.monotonic() - started, 2),
                "failures": [run["failure"][:200] for run in runs if run["failure"]][:5],
            })
    finally:
        await pool.shutdown()
    calls = sum(len(e) for e in episodes)
    return {
        "backend": backend, "sessions": len(episodes), "calls": calls, "state_mb": round(len(json.dumps(db)) / 1e6, 2),
        "alone": {"calls_answered": sum(c is not None for run in alone for c in run["calls"]),
                  "calls_ok": sum(run["ok"] for run in alone),
                  "states_read": sum(run["state"] is not None for run in alone),
                  "failures": [run["failure"][:200] for run in alone if run["failure"]][:5]},
        "rounds": per_round,
        "every_call_and_state": all(r["calls_matching"] == calls and r["states_equal"] == len(episodes)
                                    for r in per_round),
    }
