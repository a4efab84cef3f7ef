"""Sandbox throughput and latency: the warm pool against a new container or subprocess per call,
and how fast sessions of a real-size stateful environment open.

For each concurrency level (independent sessions, each issuing its calls back to back) and two
tools, a trivial lookup and a 50 ms CPU-bound loop, it measures calls/s and p50/p99 latency for

  pool        the warm pool (`arenaforge.environments.runtime`), sessions opened beforehand
  docker_run  `docker run --rm -i --network none IMAGE <worker> --once` per call (bounded: few calls)
  subprocess  `python -I -S <worker> --once` per call

and prints the ratios. Then, in the same pool, `stateful`: session opens of a tau2-style retail
environment with a `state_mb` JSON state (`retail_state`): the first open (the state is shipped to
a worker and parsed there), `state_opens` opens one after another as episodes come (open, a call,
close, 20 ms) and as many back to back, and `state_concurrency` opens at once, twice. Goals (docs/SANDBOX.md): >= 1000 trivial calls/s and p99 <= 50 ms at concurrency 64,
>= 100x the throughput of a docker run per call; a 7 MB state opens in <= 20 ms (p50), and 64
concurrent opens all succeed. Then `large_module`: opens and whole episodes (open, 8 calls, close) of a
BFCL-size class module (`module_kb` of code, `large_module`), through the zygote's per-version template
beside a new version at every open (parsed and compiled each time), in the same pool; goal: open p50 <= 5 ms.
With `--engines A,B,...` (Docker engine addresses), also trivial calls/s with the pool's workers spread over
all those engines beside all on the first, alternated in the same run (`sandbox_engines`).
"""

from __future__ import annotations

import sys
from typing import Any

from arenaforge.schemas.errors import InputError

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


async def drive_sessions(pool: Any, sessions: list[Any], tool: str, args: dict[str, Any], per: int) -> dict[str, Any]:
    """Every session issues `per` calls back to back, all sessions at once: calls/s, latency percentiles, failures."""
    import asyncio
    import time

    latencies: list[float] = []
    failed = 0

    async def drive(session: Any) -> None:
        nonlocal failed
        for _ in range(per):
            t0 = time.perf_counter()
            obs = await pool.call(session, tool, args)
            latencies.append(time.perf_counter() - t0)
            failed += obs.outcome != "ok"

    t0 = time.perf_counter()
    await asyncio.gather(*(drive(s) for s in sessions))
    return {**_stats(latencies, time.perf_counter() - t0, len(sessions)), "failed": failed}


async def main(
    levels: str = "1,16,64,256",
    trivial_calls: int = 6000,
    cpu_calls: int = 32,
    subprocess_calls: int = 40,
    docker_run_calls: int = 8,
    docker_run_concurrency: int = 8,
    backend: str = "auto",
    pool_size: int = 0,
    workloads: str = "trivial,cpu50ms",
    state_mb: float = 7.0,
    state_opens: int = 50,
    state_concurrency: int = 64,
    module_kb: float = 240.0,
    module_opens: int = 40,
    engines: str = "",
    engine_calls: int = 4000,
    engine_concurrency: int = 64,
    engine_rounds: int = 3,
) -> dict:
    """Pool vs docker-run vs subprocess per call (calls/s, p50/p99 at each concurrency level); opens of a 7 MB-state env.

    Args:
        levels: Concurrency levels (sessions calling at once), comma-separated.
        trivial_calls: Calls per level of the trivial workload.
        cpu_calls: Calls per level of the 50 ms CPU-bound workload (at least one per session).
        subprocess_calls: Calls made as one subprocess each, for comparison (0: skip).
        docker_run_calls: Calls made as one `docker run` each, for comparison (0: skip).
        docker_run_concurrency: `docker run` calls at once.
        backend: Sandbox backend: auto, docker or process.
        pool_size: Sandbox workers (0: the config's sandbox.pool_size).
        workloads: Workloads, comma-separated: trivial, cpu50ms.
        state_mb: Size of the stateful environment whose session opens are timed, in MB (0: skip).
        state_opens: Session opens of the stateful environment, one by one.
        state_concurrency: Session opens of the stateful environment at once.
        module_kb: Size of the large-module environment whose opens are timed, in KB (0: skip).
        module_opens: Session opens of the large-module environment.
        engines: Docker engines to compare a pool over all of them with one, comma-separated (empty: skip).
        engine_calls: --engines: calls per round.
        engine_concurrency: --engines: sessions calling at once.
        engine_rounds: --engines: rounds, alternating the two pools.
    """
    import asyncio
    import json
    import logging
    import os
    import shutil
    import time

    from arenaforge.environments.runtime import create_pool, image_ref
    from arenaforge.environments.runtime.docker_backend import docker_engine_answers
    from arenaforge.environments.runtime.image import WORKER_COMMAND, worker_argv
    from arenaforge.schemas.config import load_config
    from arenaforge.schemas.models import Environment, FunctionDoc

    logging.basicConfig(level=logging.WARNING)
    conc_levels = [int(x) for x in levels.split(",") if x.strip()]
    names = [name.strip() for name in workloads.split(",") if name.strip()]
    if unknown := [name for name in names if name not in WORKLOADS]:
        raise InputError(f"unknown workload(s) {', '.join(unknown)}; choose from {', '.join(WORKLOADS)}")
    chosen = {name: WORKLOADS[name] for name in names}
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
                    out[workload][str(conc)] = await drive_sessions(pool, sessions, tool, args, per)
                    await asyncio.gather(*(pool.close(s) for s in sessions))
            if state_mb > 0:
                out["stateful"] = await bench_state(pool)
            if module_kb > 0:
                out["large_module"] = await bench_module(pool)
            info = dict(pool.info)
        return out, info

    async def bench_state(pool: Any) -> dict[str, Any]:
        """Opens of a real-size stateful environment: cold, one after another, and many at once."""
        from arenaforge.benchmarks.retail_state import retail_environment

        big = retail_environment(int(state_mb * 1_000_000))
        size = len(pool.template(big).blob)
        t0 = time.perf_counter()
        first = await pool.open(big)
        first_ms = (time.perf_counter() - t0) * 1000
        read = [await timed(pool.call(first, "get_order_details", {"order_id": "#W1000000"})) for _ in range(20)]
        await pool.close(first)
        one_by_one, back_to_back = [], []
        for _ in range(state_opens):  # as episodes come: open, a call, close, a moment's pause
            latency, session = await timed(pool.open(big))
            one_by_one.append(latency)
            await pool.call(session, "get_order_details", {"order_id": "#W1000000"})
            await pool.close(session)
            await asyncio.sleep(0.02)
        for _ in range(state_opens):  # the worst case: every open pays for its fork, confinement and code load
            latency, session = await timed(pool.open(big))
            back_to_back.append(latency)
            await pool.close(session)
        rounds = []
        for _ in range(2):  # the first round also ships the state to the workers that lack it
            t0 = time.perf_counter()
            results = await asyncio.gather(*(timed(pool.open(big)) for _ in range(state_concurrency)), return_exceptions=True)
            elapsed = time.perf_counter() - t0
            opened = [r for r in results if not isinstance(r, BaseException)]
            await asyncio.gather(*(pool.close(s) for _, s in opened))
            rounds.append({**_stats([lat for lat, _ in opened], elapsed, state_concurrency), "succeeded": len(opened),
                           "failed": [repr(r)[:200] for r in results if isinstance(r, BaseException)][:3]})
        return {
            "state_bytes": size,
            "first_open_ms": round(first_ms, 1),
            "read_call": _stats([lat for lat, _ in read], sum(lat for lat, _ in read), 1),
            "open_one_by_one": _stats(one_by_one, sum(one_by_one), 1),
            "open_back_to_back": _stats(back_to_back, sum(back_to_back), 1),
            "open_concurrent": rounds[0],
            "open_concurrent_again": rounds[1],
            "templates_loaded": pool.stats()["templates"],
        }

    async def bench_module(pool: Any) -> dict[str, Any]:
        """Opens and whole episodes of a BFCL-size (240 KB) tool module: the runtime as it is (the zygote compiled
        the code once; sessions fork from it, a spare is forked ahead) beside a new version at every open (the code
        parsed and compiled at every open, as a runtime without a per-version template does), in the same pool."""
        from arenaforge.benchmarks.large_module import large_module_environment

        big = large_module_environment(int(module_kb * 1000))
        versions = iter(range(10**9))

        def fresh() -> Any:  # same code plus a comment: a new content address, so nothing is reused
            return big.model_copy(update={"code": f"{big.code}\n# version {next(versions)}\n"})

        async def episodes(make: Any, on: Any, count: int) -> dict[str, Any]:
            opens, calls, t0 = [], 0, time.perf_counter()
            for _ in range(count):  # as episodes come: open, the gold calls, close
                env = make()
                latency, session = await timed(on.open(env))
                opens.append(latency)
                for call in env.calls:
                    calls += (await on.call(session, call.tool, call.arguments)).outcome in ("ok", "no_output")
                await on.close(session)
            elapsed = time.perf_counter() - t0
            return {"open": _stats(opens, sum(opens), 1), "calls_ok": calls, "latencies": opens,
                    "episode_calls_per_s": round(calls / elapsed, 1) if elapsed > 0 else float("nan")}

        async def back_to_back(on: Any, count: int) -> list[float]:
            out = []
            for _ in range(count):
                latency, session = await timed(on.open(big))
                out.append(latency)
                await on.close(session)
            return out

        t0 = time.perf_counter()
        first = await pool.open(big)
        first_ms = (time.perf_counter() - t0) * 1000
        await pool.close(first)
        # today's runtime beside this one in the same run: one spare session per version instead of `spare_sessions`
        async with await create_pool(cfg.model_copy(update={"spare_sessions": 1})) as today:
            await today.close(await today.open(big))
            figures: dict[str, dict[str, list]] = {"now": {"open": [], "b2b": []}, "one_spare": {"open": [], "b2b": []}}
            calls_s: dict[str, list[float]] = {"now": [], "one_spare": []}
            calls_ok = 0
            for half in (module_opens // 2, module_opens - module_opens // 2):  # alternated: load changes hit both
                for name, on in (("now", pool), ("one_spare", today)):
                    run = await episodes(lambda: big, on, half)
                    figures[name]["open"] += run.pop("latencies")
                    calls_s[name].append(run["episode_calls_per_s"])
                    calls_ok += run["calls_ok"] if name == "now" else 0
                    figures[name]["b2b"] += await back_to_back(on, half)
        cached = {"open": _stats(figures["now"]["open"], sum(figures["now"]["open"]), 1),
                  "episode_calls_per_s": round(sum(calls_s["now"]) / 2, 1), "calls_ok": calls_ok}
        uncached = await episodes(fresh, pool, module_opens)
        uncached.pop("latencies")
        spares = cfg.spare_sessions
        return {"code_bytes": len(big.code), "calls_per_episode": len(big.calls), "first_open_ms": round(first_ms, 1),
                "spare_sessions": spares, "template": cached,
                "template_open_back_to_back": _stats(figures["now"]["b2b"], sum(figures["now"]["b2b"]), 1),
                "one_spare": {"open": _stats(figures["one_spare"]["open"], sum(figures["one_spare"]["open"]), 1),
                              "open_back_to_back": _stats(figures["one_spare"]["b2b"], sum(figures["one_spare"]["b2b"]), 1),
                              "episode_calls_per_s": round(sum(calls_s["one_spare"]) / 2, 1)},
                "compile_every_open": uncached,
                "open_p50_speedup": round(uncached["open"]["p50_ms"] / max(cached["open"]["p50_ms"], 1e-9), 1),
                "episode_calls_per_s_ratio": round(cached["episode_calls_per_s"] / max(uncached["episode_calls_per_s"], 1e-9), 1)}

    async def timed(coro: Any) -> tuple[float, Any]:
        t0 = time.perf_counter()
        value = await coro
        return time.perf_counter() - t0, value

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
        once = [*worker_argv(python), "--once"]
        result["subprocess"] = None if subprocess_calls <= 0 else await bench_one_shot(once, subprocess_calls, 64)
        docker_cli = shutil.which("docker")
        if docker_run_calls > 0 and docker_cli and docker_engine_answers():
            argv = [docker_cli, "run", "--rm", "-i", "--network", "none", image_ref(cfg.image), *WORKER_COMMAND, "--once"]
            result["docker_run"] = await bench_one_shot(argv, docker_run_calls, docker_run_concurrency)
        else:
            result["docker_run"] = None
        engine_list = [e.strip() for e in engines.split(",") if e.strip()]
        if len(engine_list) > 1:
            from arenaforge.benchmarks.sandbox_engines import compare_engines

            tool, args = WORKLOADS["trivial"]
            result["engines"] = await compare_engines(cfg, env, tool, args, engine_list, engine_calls,
                                                      engine_concurrency, engine_rounds)
        result["loadavg_after"] = [round(x, 1) for x in os.getloadavg()]
        return result

    result = await run_all()  # the bench command runs this coroutine in its event loop
    result["stateful"] = result["pool"].pop("stateful", None)
    result["large_module"] = result["pool"].pop("large_module", None)
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
    at64 = result["pool"].get("trivial", {}).get("64")
    goals: dict[str, bool] = {}
    if at64:
        goals = {
            "trivial_calls_per_s_at_64>=1000": at64["calls_per_s"] >= 1000,
            "trivial_p99_ms_at_64<=50": at64["p99_ms"] <= 50,
            "throughput_over_docker_run_at_64>=100x": (ratios.get("pool_over_docker_run", {}).get("trivial", {}).get("64") or 0) >= 100,
        }
    state = result["stateful"]
    if state:
        goals["state_open_p50_ms<=20"] = state["open_one_by_one"]["p50_ms"] <= 20
        goals[f"{state_concurrency}_concurrent_opens_all_succeed"] = all(
            state[k]["succeeded"] == state_concurrency for k in ("open_concurrent", "open_concurrent_again"))
    module = result["large_module"]
    if module:
        goals["large_module_open_p50_ms<=5"] = module["template"]["open"]["p50_ms"] <= 5
        goals["large_module_back_to_back_open_p50_ms<=5"] = module["template_open_back_to_back"]["p50_ms"] <= 5
    result["goals"] = goals
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
    state = result.get("stateful")
    if state:
        rows.append(f"stateful ({state['state_bytes'] / 1e6:.1f} MB state): first open {state['first_open_ms']} ms; "
                    f"opens one by one p50/p99 {state['open_one_by_one']['p50_ms']}/{state['open_one_by_one']['p99_ms']} ms "
                    f"(back to back {state['open_back_to_back']['p50_ms']}/{state['open_back_to_back']['p99_ms']} ms); "
                    f"a read call p50 {state['read_call']['p50_ms']} ms")
        for label in ("open_concurrent", "open_concurrent_again"):
            c = state[label]
            rows.append(f"stateful {label}: {c['succeeded']} of {c['concurrency']} opened, p50/p99 {c['p50_ms']}/{c['p99_ms']} ms")
    module = result.get("large_module")
    if module:
        t, u = module["template"], module["compile_every_open"]
        rows.append(f"large module ({module['code_bytes'] / 1e3:.0f} KB code): first open {module['first_open_ms']} ms; "
                    f"open p50/p99 {t['open']['p50_ms']}/{t['open']['p99_ms']} ms (back to back p50 "
                    f"{module['template_open_back_to_back']['p50_ms']} ms), episodes {t['episode_calls_per_s']} calls/s; "
                    f"compiled at every open: open p50/p99 {u['open']['p50_ms']}/{u['open']['p99_ms']} ms, "
                    f"episodes {u['episode_calls_per_s']} calls/s")
        one = module["one_spare"]
        rows.append(f"large module, {module['spare_sessions']} spare sessions vs 1 (before): open p50 {t['open']['p50_ms']} vs "
                    f"{one['open']['p50_ms']} ms one by one, {module['template_open_back_to_back']['p50_ms']} vs "
                    f"{one['open_back_to_back']['p50_ms']} ms back to back")
    engines = result.get("engines")
    if engines:
        rows.append(f"engines {', '.join(engines['engines'])}: trivial calls/s at concurrency {engines['concurrency']} "
                    f"(median of {len(engines['runs']['one_engine'])}), one engine "
                    f"{engines['calls_per_s_median']['one_engine']}, all engines {engines['calls_per_s_median']['all_engines']}"
                    f" ({engines['all_over_one']}x)")
    for name, by_workload in result.get("ratios", {}).items():
        for workload, by_conc in by_workload.items():
            rows.append(f"{name} {workload}: " + ", ".join(f"c={c}: {r}x" for c, r in by_conc.items()))
    print("\n".join(rows), file=sys.stderr)
