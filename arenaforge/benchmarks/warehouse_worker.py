"""One writer or reader process of `arenaforge bench warehouse` (run with `python -m`).

    python -m arenaforge.benchmarks.warehouse_worker write LOCATION DATA_PATH WORKLOAD GO STOP OUT
    python -m arenaforge.benchmarks.warehouse_worker read  LOCATION DATA_PATH -        GO STOP OUT

A writer replays the pipeline's write pattern from WORKLOAD (JSON, one entry per batch): the model
layer's cache and usage rows through the group-commit writers, then the QA stage's upsert, then the
environment stage's upsert. A reader queries the browsing view like `arenaforge db show` does until
STOP exists. Both open the warehouse before writing `OUT.ready`, start when GO exists, and write
their timings to OUT as JSON. Only `import duckdb` and the warehouse: it runs under the legacy
duckdb too (PYTHONPATH), for the single-file baseline exactly as it was.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

CACHE_COLUMNS = [("key", "VARCHAR"), ("model", "VARCHAR"), ("request", "JSON"), ("response", "JSON")]
CALL_COLUMNS = [("call_id", "VARCHAR"), ("key", "VARCHAR"), ("run_id", "VARCHAR"), ("step", "VARCHAR"),
                ("model", "VARCHAR"), ("cached", "BOOLEAN"), ("attempts", "INTEGER"), ("reasks", "INTEGER"),
                ("prompt_tokens", "INTEGER"), ("completion_tokens", "INTEGER"), ("latency_s", "DOUBLE")]
# what `arenaforge db tables` and `arenaforge db show environments` run
READS = ['SELECT count(*) FROM "v_environments"', 'SELECT * FROM "v_environments" LIMIT 20']


def _wait_for(path: Path, timeout_s: float = 600) -> None:
    deadline = time.monotonic() + timeout_s
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.005)


def write(wh: Any, workload: Path, go: Path, out: Path) -> dict[str, Any]:
    from arenaforge.schemas.registry import by_table
    from arenaforge.warehouse.buffer import BufferedTableWriter
    from arenaforge.warehouse.writer_lock import lock_waits

    batches = []
    for batch in json.loads(workload.read_text()):  # validated records ready before the clock starts
        stage = {name: [by_table(table).model_validate_json(text) for table, text in batch[name]] for name in ("qa", "env")}
        batches.append({**stage, "cache": batch["cache"], "calls": batch["calls"]})
    cache = BufferedTableWriter(wh, "llm_cache", CACHE_COLUMNS)
    calls = BufferedTableWriter(wh, "llm_calls", CALL_COLUMNS)
    wh.relations()  # open (a lake: attach and read the catalog) before the clock starts
    waited_before = len(lock_waits())  # the lake's writers' lock (the single file has its own): waits from here on
    Path(str(out) + ".ready").touch()
    _wait_for(go)
    start, cpu = time.time(), time.process_time()
    new, upserts = 0, []
    for batch in batches:
        for row in batch["cache"]:
            cache.add(dict(zip([c for c, _ in CACHE_COLUMNS], row, strict=True)))
        for row in batch["calls"]:
            calls.add(dict(zip([c for c, _ in CALL_COLUMNS], row, strict=True)))
        for stage in ("qa", "env"):
            t = time.perf_counter()
            new += wh.upsert(batch[stage])
            upserts.append(time.perf_counter() - t)
    cache.close()
    calls.close()
    return {"start": start, "end": time.time(), "cpu_s": time.process_time() - cpu, "new_records": new, "upsert_s": upserts,
            "lock_wait_s": lock_waits()[waited_before:]}


def read(wh: Any, go: Path, stop: Path, out: Path) -> dict[str, Any]:
    wh.query(READS[0])  # open (and, for a lake, attach) before the clock starts
    Path(str(out) + ".ready").touch()
    _wait_for(go)
    latencies, errors, i = [], [], 0
    while not stop.exists():
        t = time.perf_counter()
        try:
            wh.query(READS[i % len(READS)])
            latencies.append(time.perf_counter() - t)
        except Exception as err:  # noqa: BLE001 - a failed read is a result here, counted and shown
            errors.append(str(err).splitlines()[0][:200])
        i += 1
        time.sleep(0.02)  # a person re-running a query, not a tight loop stealing the writers' CPU
    return {"read_s": latencies, "errors": errors}


def main_cli(argv: list[str]) -> None:
    from arenaforge.warehouse import Warehouse

    role, location, data_path, workload, go, stop, out = argv
    wh = Warehouse(location, lock_timeout_s=600, data_path=data_path or None)
    result = write(wh, Path(workload), Path(go), Path(out)) if role == "write" else read(wh, Path(go), Path(stop), Path(out))
    Path(out).write_text(json.dumps(result))


if __name__ == "__main__":
    main_cli(sys.argv[1:])
