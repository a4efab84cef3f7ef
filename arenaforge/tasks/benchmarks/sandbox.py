"""Sandbox throughput and latency: the warm pool against a new container or subprocess per call.

For each concurrency level (independent sessions, each issuing its calls back to back) and two
tools, a trivial lookup and a 50 ms CPU-bound loop, it measures calls/s and p50/p99 latency for

  pool        the warm pool (`arenaforge.environments.runtime`), sessions opened beforehand
  docker_run  `docker run --rm -i --network none IMAGE worker.py --once` per call (bounded: few calls)
  subprocess  `python -I -S worker.py --once` per call

and prints the ratios. Goals (docs/SANDBOX.md): >= 1000 trivial calls/s and p99 <= 50 ms at
concurrency 64, and >= 100x the throughput of a docker run per call.
"""

from __future__ import annotations

import sys
from typing import Any

TOOL_CODE = '''\
import time

DB = {}


def lookup(key: str):
    return DB.get(key)


def burn(ms: float = 50.0):
    """Busy-loop until `ms` of this process's CPU time is spent."""
    start = time.process_time()
    n = 0
    while time.process_time() - start < ms / 1000.0:
        n += 1
    return n > 0
'''
WORKLOADS = {"trivial": ("lookup", {"key": "answer"}), "cpu50ms": ("burn", {"ms": 50.0})}


def _stats(latencies: list[float], elapsed: float, concurrency: int) -> dict[str, Any]:
    lat = sorted(latencies)
    n = len(lat)

    def pct(p: float) -> float:
        return round(lat[min(n - 1, int(p * n))] * 1000, 2) if n else float("nan")

    return {
        "calls": n,
        "concurrency": concurrency,
        "calls_per_s": round(n / elapsed, 1) if elapsed > 0 else float("nan"),
        "p50_ms": pct(0.50),
        "p99_ms": pct(0.99),
        "elapsed_s": round(elapsed, 3),
    }


def main(
    levels: str = "1,16,64,256",
    trivial_calls: int = 6000,
    cpu_calls: int = 32,
    subprocess_calls: int = 40,
    docker_run_calls: int = 8,
    docker_run_concurrency: int = 8,
    backend: str = "auto",
    pool_size: int = 0,
    workloads: str = "trivial,cpu50ms",
) -> dict:
    """Pool vs docker-run vs subprocess per call: calls/s and p50/p99 at each concurrency level."""
    import asyncio
    import json
    import logging
    import os
    import shutil
    import time

    from arenaforge.environments.runtime import create_pool, image_ref
    from arenaforge.environments.runtime.image import WORKER_COMMAND, WORKER_PATH
    from arenaforge.environments.runtime.transports import docker_engine_answers
    from arenaforge.schemas.config import load_config
    from arenaforge.schemas.models import Environment, FunctionDoc

    logging.basicConfig(level=logging.WARNING)
    conc_levels = [int(x) for x in levels.split(",") if x.strip()]
    chosen = {name: WORKLOADS[name] for name in workloads.split(",") if name.strip()}
    base = load_config().sandbox
    cfg = base.model_copy(
        update={
            "backend": backend,
            "call_timeout_s": 300.0,  # at concurrency 256 a 50 ms CPU call waits its turn on 2 cores
            "max_concurrency": max(base.max_concurrency, max(conc_levels)),
            "session_cpu_s": 600,
            **({"pool_size": pool_size} if pool_size else {}),
        }
    )
    env = Environment(
        name="bench",
        tools=[FunctionDoc(name="lookup"), FunctionDoc(name="burn")],
        code=TOOL_CODE,
        data_var="DB",
        initial_state={"answer": 42},
    )
    once_env = {"code": env.code, "data_var": "DB", "initial_state": env.initial_state, "tools": ["lookup", "burn"]}

    async def bench_pool() -> tuple[dict[str, Any], dict[str, Any]]:
        out: dict[str, Any] = {}
        async with await create_pool(cfg) as pool:
            for workload, (tool, args) in chosen.items():
                out[workload] = {}
                for conc in conc_levels:
                    total = trivial_calls if workload == "trivial" else max(cpu_calls, conc)
                    per = max(1, total // conc)
                    sessions = await asyncio.gather(*(pool.open(env) for _ in range(conc)))
                    await asyncio.gather(*(pool.call(s, "lookup", {"key": "answer"}) for s in sessions))  # warm
                    latencies: list[float] = []
                    bad = 0

                    async def drive(session: Any) -> None:
                        nonlocal bad
                        for _ in range(per):
                            t0 = time.perf_counter()
                            obs = await pool.call(session, tool, args)
                            latencies.append(time.perf_counter() - t0)
                            bad += obs.outcome != "ok"

                    t0 = time.perf_counter()
                    await asyncio.gather(*(drive(s) for s in sessions))
                    elapsed = time.perf_counter() - t0
                    await asyncio.gather(*(pool.close(s) for s in sessions))
                    out[workload][str(conc)] = {**_stats(latencies, elapsed, conc), "failed": bad}
            info = dict(pool.info)
        return out, info

    async def one_shot(argv: list[str], workload: str, conc: int, total: int) -> dict[str, Any]:
        tool, args = WORKLOADS[workload]
        payload = json.dumps({"env": once_env, "tool": tool, "args": args}).encode()
        sem = asyncio.Semaphore(conc)
        latencies: list[float] = []
        bad = 0

        async def one() -> None:
            nonlocal bad
            async with sem:
                t0 = time.perf_counter()
                proc = await asyncio.create_subprocess_exec(
                    *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL
                )
                out, _ = await proc.communicate(payload)
                latencies.append(time.perf_counter() - t0)
                try:
                    bad += json.loads(out)["outcome"] != "ok"
                except (ValueError, KeyError):
                    bad += 1

        t0 = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(total)))
        return {**_stats(latencies, time.perf_counter() - t0, conc), "failed": bad}

    async def bench_one_shot(argv: list[str], max_calls: int, max_conc: int) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for workload in chosen:
            out[workload] = {}
            for conc in conc_levels:
                eff = min(conc, max_conc)
                total = min(max(eff, max_calls if conc > 1 else max(4, max_calls // 3)), max_calls)
                out[workload][str(conc)] = await one_shot(argv, workload, eff, total)
        return out

    async def run_all() -> dict[str, Any]:
        # other work on the machine skews every figure: keep the load beside them
        result: dict[str, Any] = {"cores": os.cpu_count(), "loadavg_before": [round(x, 1) for x in os.getloadavg()]}
        result["pool"], result["pool_info"] = await bench_pool()
        result["pool_backend"] = result["pool_info"].get("backend")
        python = shutil.which("python3") or sys.executable
        result["subprocess"] = None if subprocess_calls <= 0 else await bench_one_shot([python, "-I", "-S", str(WORKER_PATH), "--once"], subprocess_calls, 64)
        docker_cli = shutil.which("docker")
        if docker_run_calls > 0 and docker_cli and docker_engine_answers():
            argv = [docker_cli, "run", "--rm", "-i", "--network", "none", image_ref(cfg.image), *WORKER_COMMAND, "--once"]
            result["docker_run"] = await bench_one_shot(argv, docker_run_calls, docker_run_concurrency)
        else:
            result["docker_run"] = None
        result["loadavg_after"] = [round(x, 1) for x in os.getloadavg()]
        return result

    result = asyncio.run(run_all())
    ratios: dict[str, Any] = {}
    for other in ("docker_run", "subprocess"):
        if not result.get(other):
            continue
        ratios[f"pool_over_{other}"] = {
            workload: {
                conc: round(result["pool"][workload][conc]["calls_per_s"] / max(result[other][workload][conc]["calls_per_s"], 1e-9), 1)
                for conc in result["pool"][workload]
            }
            for workload in chosen
        }
    result["ratios"] = ratios
    at64 = result["pool"]["trivial"].get("64")
    if at64:
        result["goals"] = {
            "trivial_calls_per_s_at_64>=1000": at64["calls_per_s"] >= 1000,
            "trivial_p99_ms_at_64<=50": at64["p99_ms"] <= 50,
            "throughput_over_docker_run_at_64>=100x": (ratios.get("pool_over_docker_run", {}).get("trivial", {}).get("64") or 0) >= 100,
        }
    _print_table(result)
    return result


def _print_table(result: dict[str, Any]) -> None:
    rows = [
        f"load average before/after: {result.get('loadavg_before')} / {result.get('loadavg_after')} on {result.get('cores')} cores",
        "mode        workload  conc   calls/s     p50 ms    p99 ms",
    ]
    for mode in ("pool", "docker_run", "subprocess"):
        for workload, by_conc in (result.get(mode) or {}).items():
            for conc, s in by_conc.items():
                rows.append(
                    f"{mode:<11} {workload:<9} {conc:>4} {s['calls_per_s']:>9} {s['p50_ms']:>10} {s['p99_ms']:>9}"
                    + (f"  (ran at concurrency {s['concurrency']})" if s["concurrency"] != int(conc) else "")
                )
    for name, by_workload in result.get("ratios", {}).items():
        for workload, by_conc in by_workload.items():
            rows.append(f"{name} {workload}: " + ", ".join(f"c={c}: {r}x" for c, r in by_conc.items()))
    print("\n".join(rows), file=sys.stderr)
