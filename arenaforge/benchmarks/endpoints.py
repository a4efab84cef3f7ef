"""`arenaforge bench endpoints`: throughput over an endpoint pool, and what a replica crash costs.

Each scripted replica (its own process, real HTTP) works on at most `capacity` requests at once and
answers each after `latency_s`, so one replica serves at most capacity / latency_s requests/s and is
the bottleneck. The same `n` structured requests are sent by the same `workers` client tasks (each
asks, waits, asks again) through `model.endpoints` with 1 replica, then with `replicas`, then with
`replicas` again where one is SIGKILLed once `kill_at` of the requests are answered.

Counts come from the warehouse usage rows (one per request): completed = requests answered,
lost = requests that never got an answer, duplicated = usage rows beyond one per request.
The three runs are measured one after another in one process on a shared, loaded machine.
"""

from __future__ import annotations

import asyncio
import os
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from arenaforge.testing.scripted_endpoint import ScriptedEndpoint

_ANSWER = ("import json\n"
           "answer = lambda req: chat_completion(content=json.dumps({'echo': req['messages'][-1]['content']}))")
SCHEMA = {"type": "object", "properties": {"echo": {"type": "string"}}, "required": ["echo"]}


async def _run(replicas: int, n: int, workers: int, capacity: int, latency_s: float, tmp: Path,
               kill_at: float | None = None) -> dict[str, Any]:
    from arenaforge.schemas.config import ModelConfig
    from arenaforge.schemas.errors import ProviderError
    from arenaforge.services.models import ChatRequest, open_chat_model
    from arenaforge.warehouse import Warehouse

    with ExitStack() as stack:
        servers = [stack.enter_context(ScriptedEndpoint(_ANSWER, latency_s, capacity)) for _ in range(replicas)]
        cfg = ModelConfig(backend="openai", endpoints=[s.url for s in servers], model="scripted", cache=False,
                          concurrency_initial=2 * capacity, concurrency_max=2 * capacity, max_retries=2,
                          backoff_base_s=0.05, backoff_max_s=1.0, timeout_s=60, health_interval_s=1.0)
        wh = Warehouse(tmp / f"bench-{replicas}-{kill_at}.duckdb")
        queue = list(range(n))
        answered, wrong, failed = 0, 0, 0
        half = asyncio.Event()
        pool_stats: Any = None

        async with open_chat_model(cfg, wh, f"bench-{replicas}") as model:
            async def worker() -> None:
                nonlocal answered, wrong, failed
                while queue:
                    i = queue.pop()
                    q = f"request {i}"
                    try:
                        resp = await model.complete(ChatRequest(step="bench", response_schema=SCHEMA,
                                                                messages=[{"role": "user", "content": q}]))
                    except ProviderError:
                        failed += 1
                        continue
                    answered += 1
                    wrong += resp.parsed["echo"] != q
                    if kill_at is not None and answered >= kill_at * n:
                        half.set()

            async def killer() -> None:
                await half.wait()
                await asyncio.to_thread(servers[-1].kill)

            t0 = time.perf_counter()
            kill = asyncio.create_task(killer()) if kill_at is not None else None
            await asyncio.gather(*(worker() for _ in range(workers)))
            wall = time.perf_counter() - t0
            if kill is not None:
                kill.cancel()
            if hasattr(model, "stats"):
                pool_stats = model.stats()
    _, rows = wh.query("SELECT count(*), count(DISTINCT key), count(*) FILTER (WHERE cost_class = 'sent') "
                       "FROM llm_calls")
    rows_total, distinct, sent = rows[0]
    result: dict[str, Any] = {
        "replicas": replicas, "wall_s": round(wall, 2), "requests_per_s": round(n / wall, 1),
        "completed": sent, "lost": n - sent, "duplicated": rows_total - distinct,
        "failed_requests": failed, "wrong_answers": wrong}
    if pool_stats is not None:
        result["resent"] = pool_stats.resent
        result["per_replica"] = [{k: e[k] for k in ("answered", "ejections", "peak_in_flight")}
                                 for e in pool_stats.per_endpoint]
    return result


async def main(n: int = 2048, replicas: int = 4, capacity: int = 16, latency_s: float = 0.25,
               workers: int = 0, kill_at: float = 0.3) -> dict[str, Any]:
    """`replicas` scripted endpoints vs 1 on the same work (goal: >= 3.5x), and with one killed mid-run.

    Args:
        n: Requests per run.
        replicas: Scripted endpoints in the pool (compared with one).
        capacity: Requests each endpoint answers at once (more wait in its queue).
        latency_s: Seconds each endpoint takes to answer.
        workers: Client tasks sending requests (0: twice the pool's capacity).
        kill_at: Share of the run after which one replica is SIGKILLed, in the third run.
    """
    workers = workers or 2 * capacity * replicas
    with tempfile.TemporaryDirectory() as tmp:
        one = await _run(1, n, workers, capacity, latency_s, Path(tmp))
        many = await _run(replicas, n, workers, capacity, latency_s, Path(tmp))
        killed = await _run(replicas, n, workers, capacity, latency_s, Path(tmp), kill_at=kill_at)
    return {
        "requests": n, "replica_capacity": capacity, "latency_s": latency_s, "client_workers": workers,
        "ideal_requests_per_s_one": round(capacity / latency_s, 1),
        "one_replica": one, f"{replicas}_replicas": many,
        "throughput_ratio": round(many["requests_per_s"] / one["requests_per_s"], 2), "goal_ratio": 3.5,
        f"{replicas}_replicas_one_killed_at_{kill_at}": killed,
        "machine": {"cpus": os.cpu_count(), "loadavg_1m": round(os.getloadavg()[0], 2)},
    }
