"""Sandbox calls/s spread over several Docker engines beside one engine, in the same run (`bench sandbox --engines`).

The same total of workers (`pool_size`) either all on the first engine or spread over every engine listed,
the same sessions and calls; the two set-ups alternate `rounds` times so a drift in the machine's load hits
both alike. On one host, engines share its cores: more engines add no CPU, only daemons and their overhead;
the gain comes when the engines run on different hosts (docs/SCALE.md).
"""

from __future__ import annotations

import asyncio
import statistics
from typing import Any

from arenaforge.environments.runtime import create_pool
from arenaforge.schemas.config import SandboxConfig
from arenaforge.schemas.models import Environment


async def compare_engines(
    cfg: SandboxConfig, env: Environment, tool: str, args: dict[str, Any], engines: list[str],
    calls: int, concurrency: int, rounds: int,
) -> dict[str, Any]:
    """calls/s (median of `rounds`) of `calls` calls in `concurrency` sessions, one engine vs all `engines`."""
    set_ups = {
        "one_engine": cfg.model_copy(update={"backend": "docker", "engines": engines[:1]}),
        "all_engines": cfg.model_copy(update={"backend": "docker", "engines": engines}),
    }
    runs: dict[str, list[dict[str, Any]]] = {label: [] for label in set_ups}
    for _ in range(rounds):
        for label, set_up in set_ups.items():
            runs[label].append(await _measure(set_up, env, tool, args, calls, concurrency))
    medians = {label: statistics.median(r["calls_per_s"] for r in rs) for label, rs in runs.items()}
    return {
        "engines": engines,
        "pool_size": cfg.pool_size,
        "concurrency": concurrency,
        "calls": calls,
        "runs": runs,
        "calls_per_s_median": medians,
        "all_over_one": round(medians["all_engines"] / max(medians["one_engine"], 1e-9), 2),
    }


async def _measure(cfg: SandboxConfig, env: Environment, tool: str, args: dict[str, Any], calls: int,
                   concurrency: int) -> dict[str, Any]:
    from arenaforge.benchmarks.sandbox import drive_sessions

    async with await create_pool(cfg) as pool:  # started before the clock: the workers are warm
        sessions = list(await asyncio.gather(*(pool.open(env) for _ in range(concurrency))))
        await asyncio.gather(*(pool.call(s, tool, args) for s in sessions))
        spread: dict[str, int] = {}
        for session in sessions:
            engine = getattr(session.worker.transport, "engine", "") or "default"
            spread[engine] = spread.get(engine, 0) + 1
        measured = await drive_sessions(pool, sessions, tool, args, max(1, calls // concurrency))
        await asyncio.gather(*(pool.close(s) for s in sessions))
    return {**measured, "sessions_per_engine": spread}
