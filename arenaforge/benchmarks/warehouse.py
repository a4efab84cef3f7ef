"""`arenaforge bench warehouse`: the pipeline's write pattern on each warehouse layout, side by side.

Records are real: an offline `envs` run (sample source, process sandbox) makes QA instances,
verifications, environments, merges and distractor sets, which are then varied (an extra parent)
into as many distinct records as the workload needs; every batch also carries `shared` QA
instances that every writer writes (they must land once). Each writer process replays, per batch of
`batch_size` QA instances: `calls_per_qa` model-cache and usage rows each through the group-commit
writers, the QA stage's upsert (instances, verifications, rejections), the environment stage's
upsert (environments, distractor sets, a merge, rejections). Writers write as fast as they can:
this measures the warehouse, not synthesis.

Layouts: `single_file` (the DuckDB file as before DuckLake, this duckdb), `single_file_duckdb_2_0_0`
(the same code under duckdb 2.0.0, i.e. today's single file exactly; when installed beside the
environment), `ducklake_sqlite` (the default) and, with `--postgres CONNINFO`, `ducklake_postgres`.
Scenarios: `one_writer` (a pipeline run alone: the throughput goal) and `four_writers` (`writers`
writer processes plus one reader process running what `arenaforge db tables` / `db show
environments` run, its session held open). Each (layout, scenario) runs `repeat` times, the layouts'
order rotating so none always goes first on a machine whose load drifts.
Reported per layout and scenario: rows/s (every row written, records and cache/usage rows, over
the wall time from start to the last writer's flush; median of the repeats, and each run), the
writers' CPU seconds per 1,000 rows (least distorted by machine load), upsert and read latency
and a lake's writers' waits for the writers' lock (pooled), rows lost and duplicated (expected
distinct keys vs stored). Ratios are against today's single file (duckdb 2.0.0 when installed beside the environment).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any


def _pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 4)


# --------------------------------------------------------------------------- records
async def harvest(tmp: Path, n: int = 8) -> dict[str, list[Any]]:
    """Real records from an offline envs run (QA and environment stages), by table."""
    from arenaforge.schemas.config import Config, SandboxConfig
    from arenaforge.schemas.registry import by_table
    from arenaforge.services.run_scope import open_run_scope
    from arenaforge.tracks.envs.pipeline import EnvsSpec, build_environments, synthesize_qas
    from arenaforge.warehouse import Warehouse

    wh = Warehouse(tmp / "harvest.lake")
    cfg = Config(sandbox=SandboxConfig(backend="process"))
    spec = EnvsSpec(sources=["sample"], n=n, batch_size=100_000)
    async with open_run_scope(cfg, wh, "bench") as run:
        ids, _ = await synthesize_qas(run, spec)
        await build_environments(run, spec, ids)
    tables = ["qa_instances", "qa_verifications", "environments", "distractor_sets", "env_merges"]
    return {t: wh.load(by_table(t)) for t in tables}  # type: ignore[arg-type]


def _variant(record: Any, tag: str) -> Any:
    data = record.model_dump(mode="json")
    data.update(id="", parents=[*data["parents"], tag])
    return type(record).model_validate(data)


def workloads(real: dict[str, list[Any]], writers: int, batches: int, batch_size: int, calls_per_qa: int,
              shared: int) -> tuple[list[list[dict[str, Any]]], dict[str, set[str]]]:
    """Per writer, per batch: records (as (table, json)) and cache/usage rows; plus every expected key by table."""
    from arenaforge.schemas import Rejection

    expected: dict[str, set[str]] = {}
    plans = []

    def take(table: str, k: int) -> Any:
        items = real[table]
        return items[k % len(items)]

    for w in range(writers):
        plan = []
        for b in range(batches):
            qa, env = [], []
            for i in range(batch_size):
                tag = f"bench:shared:{b}:{i}" if i < shared else f"bench:{w}:{b}:{i}"
                qa += [_variant(take("qa_instances", i), tag), _variant(take("qa_verifications", i), tag)]
                env += [_variant(take("environments", i), tag), _variant(take("distractor_sets", i), tag)]
                if i % 10 == 9:  # about one rejection per ten instances at each stage
                    qa.append(Rejection(stage="verify_qa", subject=tag, reason="low_quality_score", parents=[tag]))
                    env.append(Rejection(stage="self_test", subject=tag, reason="self_test_failed", parents=[tag]))
            if real["env_merges"]:  # a merge per batch when the harvest made any
                env.append(_variant(take("env_merges", b), f"bench:{w}:{b}"))
            request = json.dumps({"messages": [{"role": "user", "content": take("environments", b).model_dump_json()[:3000]}]})
            response = json.dumps({"content": take("qa_instances", b).model_dump_json()[:1000]})
            cache, calls = [], []
            for c in range(batch_size * calls_per_qa):
                key = f"bench-{w}-{b}-{c}"
                cache.append([key, "bench-model", request, response])
                calls.append([f"{key}-call", key, "bench", "decompose_qa", "bench-model", False, 1, 0, 900, 250, 0.8])
            for r in qa + env:
                expected.setdefault(r.TABLE, set()).add(r.id)
            expected.setdefault("llm_cache", set()).update(row[0] for row in cache)
            expected.setdefault("llm_calls", set()).update(row[0] for row in calls)
            plan.append({"qa": [(r.TABLE, r.model_dump_json()) for r in qa], "env": [(r.TABLE, r.model_dump_json()) for r in env],
                         "cache": cache, "calls": calls})
        plans.append(plan)
    return plans, expected


# --------------------------------------------------------------------------- one measured run
def _worker(role: str, location: str, data_path: str, workload: str, go: Path, stop: Path, out: Path,
            env: dict[str, str]) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "arenaforge.benchmarks.warehouse_worker", role, location, data_path, workload,
           str(go), str(stop), str(out)]
    with open(f"{out}.err", "w") as err:  # a file, not a pipe: a chatty worker never blocks on a full pipe
        return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=err, text=True)


def measure(location: str, data_path: str, plans: list[Path], expected: dict[str, set[str]], reader: bool,
            env: dict[str, str], work: Path) -> dict[str, Any]:
    from arenaforge.warehouse import Warehouse

    Warehouse(location, data_path=data_path or None).relations()  # create and migrate outside the clock
    go, stop = work / "go", work / "stop"
    procs, outs = [], []
    for i, plan in enumerate(plans):
        outs.append(work / f"writer-{i}.json")
        procs.append(_worker("write", location, data_path, str(plan), go, stop, outs[-1], env))
    if reader:
        outs.append(work / "reader.json")
        procs.append(_worker("read", location, data_path, "-", go, stop, outs[-1], env))
    try:
        return _drive(procs, outs, plans, expected, reader, go, stop, location, data_path)
    finally:
        stop.touch()
        for p in procs:  # never leave a worker behind, whatever happened
            if p.poll() is None:
                p.kill()
                p.wait()


def _drive(procs: list[subprocess.Popen], outs: list[Path], plans: list[Path], expected: dict[str, set[str]],
           reader: bool, go: Path, stop: Path, location: str, data_path: str) -> dict[str, Any]:
    from arenaforge.warehouse import Warehouse

    deadline = time.monotonic() + 600
    while not all(Path(str(o) + ".ready").exists() for o in outs):
        failed = [o for p, o in zip(procs, outs, strict=True) if p.poll() not in (None, 0)]
        if failed or time.monotonic() > deadline:
            raise RuntimeError(f"bench worker did not start: {_tail(failed[0]) if failed else 'timeout'}")
        time.sleep(0.01)
    go.touch()
    failures = []  # a writer that dies is a result (its rows count as lost), not the end of the benchmark
    for p, o in zip(procs[: len(plans)], outs, strict=False):
        if p.wait(timeout=1800) != 0:
            failures.append(_tail(o).splitlines()[-1][:300])
    stop.touch()
    if reader and procs[-1].wait(timeout=600) != 0:
        raise RuntimeError(f"bench reader failed: {_tail(outs[-1])}")
    results = [json.loads(o.read_text()) if o.exists() else None for o in outs]
    writes = [r for r in results[: len(plans)] if r is not None]
    wh = Warehouse(location, data_path=data_path or None)
    stored = lost = duplicated = 0
    for table, ids in expected.items():
        key = "key" if table == "llm_cache" else "call_id" if table == "llm_calls" else "id"
        _, rows = wh.query(f"SELECT count(*), count(DISTINCT {key}), count(DISTINCT {key}) FILTER (WHERE list_contains(?, {key})) "
                           f"FROM {table}", [sorted(ids)])
        total, distinct, present = rows[0]
        stored += total
        lost += len(ids) - present
        duplicated += total - distinct
    return {
        "rows": stored, "lost": lost, "duplicated": duplicated, "failures": failures,
        "wall": max(r["end"] for r in writes) - min(r["start"] for r in writes) if writes else None,
        "upserts": [x for r in writes for x in r["upsert_s"]], "cpu": sum(r["cpu_s"] for r in writes),
        "lock_waits": [x for r in writes for x in r.get("lock_wait_s", [])],
        "reads": results[-1]["read_s"] if reader else [], "read_errors": results[-1]["errors"] if reader else [],
    }


def summarize(runs: list[dict[str, Any]], reader: bool) -> dict[str, Any]:
    """Median rows/s over the repeats; latencies pooled over them; losses and failures summed."""
    rates = sorted(r["rows"] / r["wall"] for r in runs if r["wall"])
    upserts = [x for r in runs for x in r["upserts"]]
    waits = [x for r in runs for x in r["lock_waits"]]
    out: dict[str, Any] = {
        "rows_per_s": round(rates[len(rates) // 2], 1) if rates else None, "rows_per_s_runs": [round(x, 1) for x in rates],
        "rows_written": sum(r["rows"] for r in runs), "rows_lost": sum(r["lost"] for r in runs),
        "rows_duplicated": sum(r["duplicated"] for r in runs),
        "upsert_p50_s": _pct(upserts, 0.5), "upsert_p99_s": _pct(upserts, 0.99),
        # what a lake's writers waited for one another (every take of the writers' lock, the group commits' too)
        "writer_wait_p50_s": _pct(waits, 0.5), "writer_wait_p99_s": _pct(waits, 0.99),
        "writer_wait_max_s": round(max(waits), 3) if waits else None,
        # the writers' own CPU (all their threads) per 1,000 rows: what machine load distorts least
        "writer_cpu_s_per_1k_rows": round(1000 * sum(r["cpu"] for r in runs) / max(1, sum(r["rows"] for r in runs)), 3),
    }
    failures = [f for r in runs for f in r["failures"]]
    if failures:
        out.update(writer_failures=len(failures), writer_failure_sample=failures[0])
    if reader:
        reads = [x for r in runs for x in r["reads"]]
        errors = [e for r in runs for e in r["read_errors"]]
        out.update(reads=len(reads), read_errors=len(errors), read_p50_s=_pct(reads, 0.5), read_p99_s=_pct(reads, 0.99),
                   read_max_s=round(max(reads), 3) if reads else None, reads_over_1s=sum(x > 1 for x in reads))
        if errors:
            out["read_error_sample"] = errors[0]
    return out


def _tail(out: Path) -> str:
    err = Path(f"{out}.err")
    return (err.read_text()[-2000:] if err.exists() else "") or "no output"


# --------------------------------------------------------------------------- the benchmark
async def main(writers: int = 4, batches: int = 6, batch_size: int = 40, calls_per_qa: int = 4, shared: int = 2,
         repeat: int = 3, postgres: str = "", legacy: bool = True) -> dict[str, Any]:
    """Rows/s of the pipeline's write pattern, read latency under `writers` writers, rows lost: per layout.

    Args:
        writers: Writer processes in the concurrent scenario.
        batches: Batches (one transaction each) per writer.
        batch_size: QA instances per batch (with their verifications, environments and distractor sets).
        calls_per_qa: Model-cache and usage rows written per QA instance.
        shared: Instances per batch that every writer writes (the same ids: each must be stored once).
        repeat: Rounds; each layout takes its turn first.
        postgres: Also measure a PostgreSQL catalog at this conninfo or URL (empty: skip).
        legacy: Also measure the single file under duckdb 2.0.0 (--no-legacy: skip).
    """
    from arenaforge.warehouse.legacy import legacy_duckdb_dir, legacy_env

    out: dict[str, Any] = {"machine_load_1m_at_start": round(os.getloadavg()[0], 2), "writers": writers,
                           "batches": batches, "batch_size": batch_size, "calls_per_qa": calls_per_qa, "repeat": repeat}
    with tempfile.TemporaryDirectory(prefix="af-bench-wh-") as tmp_dir:
        tmp = Path(tmp_dir)
        t = time.perf_counter()
        real = await harvest(tmp)
        out["harvest_s"] = round(time.perf_counter() - t, 1)
        plans, expected = workloads(real, writers, batches, batch_size, calls_per_qa, shared)
        files = []
        for i, plan in enumerate(plans):
            files.append(tmp / f"plan-{i}.json")
            files[-1].write_text(json.dumps(plan))
        one_expected = workloads(real, 1, batches, batch_size, calls_per_qa, shared)[1]
        out["rows_per_writer"] = sum(len(v) for v in one_expected.values())

        env = dict(os.environ)
        layouts: dict[str, tuple[str, str, dict[str, str]]] = {"single_file": ("file:{d}/w.duckdb", "", env)}
        if legacy:
            old = legacy_env(legacy_duckdb_dir(install=False))
            layouts["single_file_duckdb_2_0_0"] = ("file:{d}/w.duckdb", "", old)
        layouts["ducklake_sqlite"] = ("{d}/w.lake", "", env)
        if postgres:  # a libpq conninfo or URL, with or without the `postgres:` that --db takes
            from arenaforge.warehouse.lake import is_postgres

            postgres = postgres if is_postgres(postgres) else f"postgres:{postgres}"
            layouts["ducklake_postgres"] = (postgres, "{d}/data", env)

        runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
        names = list(layouts)
        for rep in range(repeat):
            order = names[rep % len(names):] + names[: rep % len(names)]  # each layout takes its turn first
            for scenario, n_writers, reader in (("one_writer", 1, False), ("four_writers", writers, True)):
                for name in order:
                    location, data_path, child_env = layouts[name]
                    work = tmp / f"{rep}-{scenario}-{name}"
                    work.mkdir()
                    if name == "ducklake_postgres":
                        _reset_postgres(postgres)
                    exp = one_expected if n_writers == 1 else expected
                    runs.setdefault((name, scenario), []).append(measure(
                        location.format(d=work), data_path.format(d=work), files[:n_writers], exp, reader, child_env, work))
    out["machine_load_1m_at_end"] = round(os.getloadavg()[0], 2)
    results: dict[str, dict[str, Any]] = {}
    for (name, scenario), measured in runs.items():
        results.setdefault(name, {})[scenario] = summarize(measured, reader=scenario == "four_writers")
    out["layouts"] = results
    base = "single_file_duckdb_2_0_0" if "single_file_duckdb_2_0_0" in results else "single_file"
    out["baseline"] = base
    for name in results:
        if name.startswith("ducklake"):
            for scenario in results[name]:
                baseline = results[base][scenario].get("rows_per_s")
                if baseline:
                    out[f"{name}_vs_today_{scenario}"] = round(results[name][scenario]["rows_per_s"] / baseline, 2)
    lake = results["ducklake_sqlite"]["four_writers"]
    out["goals"] = {
        # the pipeline's write pattern: one run writing, as `envs synth` does
        "throughput_ratio_ge_0_8": out.get("ducklake_sqlite_vs_today_one_writer", 0) >= 0.8,
        "read_p99_lt_1s_while_4_writers_write": (lake.get("read_p99_s") or 0) < 1.0,
        "rows_lost_0": all(r[s]["rows_lost"] == 0 and r[s]["rows_duplicated"] == 0
                           for name, r in results.items() if name.startswith("ducklake") for s in r),
    }
    return out


def _reset_postgres(conninfo: str) -> None:
    """Empty the PostgreSQL catalog database (every run starts from a fresh lake)."""
    import duckdb

    from arenaforge.warehouse.extensions import extension_path
    from arenaforge.warehouse.lake import LakeLocation

    target = LakeLocation.parse(conninfo, "/tmp").target
    con = duckdb.connect()
    con.execute(f"LOAD '{extension_path('postgres_scanner')}'")
    con.execute(f"ATTACH '{target}' AS pg (TYPE postgres)")
    con.execute("CALL postgres_execute('pg', 'DROP SCHEMA public CASCADE; CREATE SCHEMA public')")
    con.close()
