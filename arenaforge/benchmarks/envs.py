"""`arenaforge bench envs`: RL environment synthesis throughput, offline and against a slow endpoint.

1. offline — verified environments per minute, end to end: knowledge source -> QA synthesis and
   verification -> tools verified in the sandbox -> merging -> distractors -> self-test ->
   warehouse writes (one upsert per stage). The embedding model's one-off load and the warehouse's
   first open in the process (a lake: extensions, ATTACH, a new lake's migrations) are timed apart.
2. openai — the same QA and environment stages against the scripted OpenAI-compatible server
   (tests/support/scripted_openai.py, real HTTP, its own process) answering every request after
   `latency_s`. The endpoint logs its in-flight count; the goal's measure is its time-weighted
   share of the concurrency limit while the model-bound QA stage (decomposition + verification)
   talks to it, first request in to last answer out. Also reported: the same over the whole QA
   stage, tool building and the whole run, and the client's share of limiter slots held. A
   reference run of the bare model layer (same n, same endpoint, just before) says what this
   machine allows at that moment; these VMs' speed drifts by 10-20% over an hour.
   Then the streaming pipeline on the same endpoint and inputs, side by side: whole-run shares, the
   timeline (when the last answer came back, the tail after it) and the CPU seconds of the client, the
   sandbox and the endpoint over the run and its tail, which say what bounds the run on this machine.
   `batch_size` sets both pipelines' chunk/window of kept QAs (default: one for the run); with `merge_across`
   each merges against the ones before it (the sliding window of `envs synth --merge-across`).
   Needs the repository checkout (it imports the test server).
"""

from __future__ import annotations

import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from arenaforge.benchmarks import bench_warehouse_path
from arenaforge.benchmarks import models as models_bench
from arenaforge.schemas.config import Config, ModelConfig, SandboxConfig
from arenaforge.testing.scripted_endpoint import ScriptedEndpoint
from arenaforge.warehouse.db import Warehouse


async def _offline(n: int, sources: list[str], shared_data: str | None, sandbox: str, out: dict[str, Any],
                   layout: str = "lake") -> None:
    from arenaforge.services.embeddings import embed
    from arenaforge.services.run_scope import open_run_scope
    from arenaforge.tracks.envs.knowledge import run_sources
    from arenaforge.tracks.envs.pipeline import EnvsSpec, build_environments, synthesize_qas

    t = time.perf_counter()
    embed(["warm up"])
    out["embedding_model_load_s"] = round(time.perf_counter() - t, 2)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Config(sandbox=SandboxConfig(backend=sandbox))  # type: ignore[arg-type]
        wh = Warehouse(bench_warehouse_path(Path(tmp), layout))
        # the warehouse's one-off first open in this process (a lake: extension load and its signature
        # check, ATTACH, a new lake's migrations), timed apart as the embedding model's load is
        tw, cw = time.perf_counter(), time.process_time()
        wh.applied_migrations()
        opened = {"warehouse_open_s": round(time.perf_counter() - tw, 2),
                  "warehouse_open_cpu_s": round(time.process_time() - cw, 2)}
        spec = EnvsSpec(sources=sources, n=n, shared_data=shared_data, batch_size=100_000)
        timings: dict[str, float] = {}
        async with open_run_scope(cfg, wh, "bench") as run:
            t0, c0 = time.perf_counter(), time.process_time()
            run_sources(run, spec.sources, spec.shared_data)  # loaded once per run; the stages reuse them
            t1, c1 = time.perf_counter(), time.process_time()
            ids, qa_counts = await synthesize_qas(run, spec)
            t2, c2 = time.perf_counter(), time.process_time()
            counts = await build_environments(run, spec, ids, timings=timings)
            t3, c3 = time.perf_counter(), time.process_time()
        stored = wh.count("environments")
    total = t3 - t0
    out["offline"] = {
        "sources": sources, "qa_requested": n * len(sources), **qa_counts, **counts, "environments_stored": stored,
        "sandbox_backend": sandbox, "layout": layout, **opened,
        "load_sources_s": round(t1 - t0, 2), "qa_stage_s": round(t2 - t1, 2), "env_stage_s": round(t3 - t2, 2),
        # CPU seconds of this process (sandbox workers aside) per stage: waiting for a core does not count
        "load_sources_cpu_s": round(c1 - c0, 2), "qa_stage_cpu_s": round(c2 - c1, 2), "env_stage_cpu_s": round(c3 - c2, 2),
        **{k: round(v, 2) for k, v in timings.items()}, "total_s": round(total, 2),
        "verified_envs_per_min": round(counts["environments"] / total * 60, 1),
    }


# The envs prompts get the scripted model's answers; the bare model-layer reference run (step
# "bench", see arenaforge/benchmarks/models.py) gets its one-field answer.
_ANSWER = """
from arenaforge.testing.envs_responder import EnvsResponder
envs = EnvsResponder()
def answer(req):
    if ((req.get("response_format") or {}).get("json_schema") or {}).get("name") == "bench":
        return chat_completion(content='{"city": "Oslo"}')
    return envs(req)
"""


async def _openai(n: int, limit: int, latency_s: float, sandbox: str, out: dict[str, Any], batch_size: int,
                  merge_across: bool = False) -> None:
    from arenaforge.services.embeddings import embed
    from arenaforge.services.run_scope import open_run_scope
    from arenaforge.tracks.envs.pipeline import EnvsSpec, build_environments, chunks, synthesize_qas

    embed(["warm up"])  # the embedding model's one-off load is not the first pipeline's distractor stage
    samples: list[tuple[float, int]] = []
    stop = threading.Event()

    def sample(limiter: Any) -> None:  # the client's slots held: the run's limiter for the endpoint
        while not stop.is_set():
            samples.append((time.perf_counter(), limiter.in_flight))
            time.sleep(0.01)  # a tighter loop steals the GIL from the event loop it measures

    with ScriptedEndpoint(_ANSWER, latency_s) as endpoint, tempfile.TemporaryDirectory() as tmp:
        model = ModelConfig(backend="openai", base_url=endpoint.url, model="scripted", cache=False,
                            concurrency_initial=limit, concurrency_max=limit, max_retries=2, timeout_s=120)
        # the scripted endpoint's tool code is ours (envs_responder.py), so the process backend may run it
        cfg = Config(model=model, sandbox=SandboxConfig(backend=sandbox, process_allows_model_code=True))  # type: ignore[arg-type]
        wh = Warehouse(Path(tmp) / "bench.duckdb")
        spec = EnvsSpec(sources=["sample"], n=n, batch_size=batch_size, merge_across=merge_across)
        # Reference, side by side on the same endpoint: the bare model layer, no pipeline work.
        reference = await models_bench._drive(endpoint.url, n, limit, Path(tmp) / "reference.duckdb")
        timings: dict[str, float] = {}
        async with open_run_scope(cfg, wh, "bench") as run:
            # the limiter is bound to this loop here; the sampler thread only reads its count
            sampler = threading.Thread(target=sample, args=(run.model.limiter,), daemon=True)
            sampler.start()
            try:
                with _CpuLog(endpoint.pid) as batch_cpu:
                    t0 = time.perf_counter()
                    ids, qa_counts = await synthesize_qas(run, spec)
                    t1 = time.perf_counter()
                    counts: dict[str, int] = {}
                    for chunk in chunks(ids, spec.batch_size):  # as `run_envs` does: the end stages per chunk
                        for key, value in (await build_environments(run, spec, chunk, timings=timings)).items():
                            counts[key] = counts.get(key, 0) + value
                    t2 = time.perf_counter()
            finally:
                stop.set()
                sampler.join(timeout=5)
        stream_window, stream, stream_cpu = await _stream_run(cfg, spec, Path(tmp) / "stream.duckdb", endpoint.pid)
    # the endpoint's log arrives when it stops, so every share is read here
    stream_tools_end = stream_window[0] + stream.get("tools_verified_s", 0)
    batch_last = endpoint.request_window(t0, t2)[1]
    stream_last = endpoint.request_window(*stream_window)[1]
    stream = {"busy_share_whole_run": endpoint.busy_share(limit, *stream_window),
              "busy_share_until_tools_verified": endpoint.busy_share(limit, stream_window[0], stream_tools_end),
              "requests":
              endpoint.arrivals(*stream_window), "whole_run_s": round(stream_window[1] - stream_window[0], 2), **stream}
    tools_start = t1 + timings.get("pool_start_s", 0)
    tools_end = tools_start + timings.get("tools_verified_s", 0)
    qa_requests = endpoint.request_window(t0, t1)
    qa_share = endpoint.busy_share(limit, *qa_requests)
    reference_share = endpoint.busy_share(limit, *endpoint.request_window(*reference["window"]))
    held = [k for t, k in samples if qa_requests[0] <= t <= qa_requests[1]]
    out["openai"] = {
        "requests": endpoint.arrivals(t0, t2), "latency_s": latency_s, "concurrency_limit": limit,
        "endpoint_peak_in_flight": endpoint.peak, **qa_counts, **counts,
        "qa_stage_s": round(t1 - t0, 2), "qa_requests_s": round(qa_requests[1] - qa_requests[0], 2),
        "env_stage_s": round(t2 - t1, 2),
        # the goal's measure: the endpoint's busy share while the QA stage talks to it
        "endpoint_busy_share_qa_requests": qa_share,
        # the same n through the bare model layer, just before: what this machine allows right now
        "endpoint_busy_share_model_layer_alone": reference_share,
        "qa_share_vs_model_layer": round(qa_share / reference_share, 3) if reference_share else 0.0,
        "endpoint_busy_share_qa_stage": endpoint.busy_share(limit, t0, t1),
        "endpoint_busy_share_tool_building": endpoint.busy_share(limit, tools_start, tools_end),
        "endpoint_busy_share_whole_run": endpoint.busy_share(limit, t0, t2),
        "client_slot_share_qa_requests": round(sum(min(k, limit) for k in held) / (len(held) * limit), 3) if held else 0.0,
        **{k: round(v, 2) for k, v in timings.items()},
        "requests_per_s_qa": round(endpoint.arrivals(*qa_requests) / max(qa_requests[1] - qa_requests[0], 1e-9), 1),
        "ideal_requests_per_s": round(limit / latency_s, 1),
        # the streaming pipeline on the same endpoint and inputs, just after: the whole-run figure side by side
        "whole_run_busy_share": {"batch": endpoint.busy_share(limit, t0, t2), "stream": stream["busy_share_whole_run"]},
        "whole_run_s": {"batch": round(t2 - t0, 2), "stream": stream["whole_run_s"]},
        # from the first request until every tool is verified (before merging, distractors and self-tests)
        "until_tools_verified_busy_share": {"batch": endpoint.busy_share(limit, t0, tools_end),
                                            "stream": stream["busy_share_until_tools_verified"]},
        "until_tools_verified_s": {"batch": round(tools_end - t0, 2), "stream": stream["tools_verified_s"]},
        # the timeline: when the first request went out (the run's head: sources loaded, prompts built), when the
        # last answer came back, and the run's tail after it (no request in flight)
        "first_request_s": {"batch": round(endpoint.request_window(t0, t2)[0] - t0, 2),
                            "stream": round(endpoint.request_window(*stream_window)[0] - stream_window[0], 2)},
        "last_answer_s": {"batch": round(batch_last - t0, 2), "stream": round(stream_last - stream_window[0], 2)},
        "tail_after_last_answer_s": {"batch": round(t2 - batch_last, 2), "stream": round(stream_window[1] - stream_last, 2)},
        # the client process's CPU seconds (its threads; not the endpoint's or the sandbox workers' processes)
        # CPU seconds over the whole run and over its tail (after the last answer), of the client process (its
        # threads) and of the sandbox (the process backend's workers and their session processes); the endpoint's
        # process is not counted
        "client_cpu_s": {"batch": batch_cpu.spent(t0)[0], "stream": stream_cpu.spent(stream_window[0])[0]},
        "sandbox_cpu_s": {"batch": batch_cpu.spent(t0)[1], "stream": stream_cpu.spent(stream_window[0])[1]},
        "tail_client_cpu_s": {"batch": batch_cpu.spent(batch_last)[0], "stream": stream_cpu.spent(stream_last)[0]},
        "tail_sandbox_cpu_s": {"batch": batch_cpu.spent(batch_last)[1], "stream": stream_cpu.spent(stream_last)[1]},
        "endpoint_cpu_s": {"batch": batch_cpu.spent(t0)[2], "stream": stream_cpu.spent(stream_window[0])[2]},
        "batch_size": batch_size,
        "merge_across": merge_across,
        "stream": stream,
    }
    out["openai"].update(_cpu_bound(out["openai"], {"batch": endpoint.arrivals(t0, t2), "stream": stream["requests"]},
                                    latency_s, limit))


def _cpu_bound(run: dict[str, Any], requests: dict[str, int], latency_s: float, limit: int) -> dict[str, Any]:
    """What bounds each pipeline's whole-run share on this machine: the seconds its requests need at the full limit
    (requests x latency / limit) against the seconds its CPU work needs on this machine's cores (client + sandbox +
    endpoint CPU seconds / cores). `cpu_bound_share_cap` = request_s / max(request_s, cpu_s / cores): the whole-run
    share no schedule can beat here, with every core ours (other load on the machine lowers it further)."""
    cores = len(os.sched_getaffinity(0))
    request_s = {k: round(n * latency_s / limit, 2) for k, n in requests.items()}
    cpu_s = {k: round(run["client_cpu_s"][k] + run["sandbox_cpu_s"][k] + run["endpoint_cpu_s"][k], 2) for k in requests}
    return {"cores": cores, "request_s_at_limit": request_s, "cpu_s": cpu_s,
            "cpu_bound_share_cap": {k: round(request_s[k] / max(request_s[k], cpu_s[k] / cores, 1e-9), 3) for k in requests},
            "load_average": [round(x, 2) for x in os.getloadavg()]}


async def _stream_run(cfg: Config, spec: Any, db: Path, endpoint_pid: int
                      ) -> tuple[tuple[float, float], dict[str, Any], _CpuLog]:
    """The same inputs through the streaming pipeline (tracks/envs/stream.py) into a fresh warehouse: its
    window (perf_counter) and counts."""
    from arenaforge.services.run_scope import open_run_scope
    from arenaforge.tracks.envs.stream import stream_envs

    timings: dict[str, float] = {}
    async with open_run_scope(cfg, Warehouse(db), "bench") as run:
        with _CpuLog(endpoint_pid) as cpu:
            t0 = time.perf_counter()
            counts = await stream_envs(run, spec.model_copy(update={"pipeline": "stream"}), timings=timings)
            t1 = time.perf_counter()
    return (t0, t1), {**counts, **{k: round(v, 2) for k, v in timings.items()}}, cpu


class _CpuLog:
    """`with _CpuLog(endpoint_pid) as log:` samples (time, client, sandbox and endpoint CPU s) every `every_s`
    from a thread; `log.spent(t)`: the CPU seconds from `t` (the last sample at or before it) to the end."""

    def __init__(self, skip: int, every_s: float = 0.25) -> None:
        self.skip, self.every_s = skip, every_s
        self.samples: list[tuple[float, float, float, float]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _sample(self) -> None:
        self.samples.append((time.perf_counter(), time.process_time(), *_children_cpu(self.skip)))

    def _run(self) -> None:
        while not self._stop.wait(self.every_s):
            self._sample()

    def __enter__(self) -> _CpuLog:
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sample()

    def spent(self, since: float) -> tuple[float, float, float]:
        """CPU seconds of the client, the sandbox and the endpoint from `since` to the end."""
        start = max((s for s in self.samples if s[0] <= since), default=self.samples[0])
        end = self.samples[-1]
        return round(end[1] - start[1], 2), round(end[2] - start[2], 2), round(end[3] - start[3], 2)


def _children_cpu(skip: int) -> tuple[float, float]:
    """CPU seconds of this process's descendants (their own and their reaped children's: the sandbox workers
    and the session processes they forked) but the subtree of `skip` (the endpoint's process); and of that one."""
    clk = os.sysconf("SC_CLK_TCK")
    parent: dict[int, int] = {}
    ticks: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        pid = int(entry.name)
        parent[pid] = int(fields[1])
        ticks[pid] = sum(int(x) for x in fields[11:15])  # utime, stime, cutime, cstime

    def below_us(pid: int) -> bool:
        while pid > 1:
            pid = parent.get(pid, 0)
            if pid == skip:
                return False
            if pid == os.getpid():
                return True
        return False

    return (sum(t for pid, t in ticks.items() if pid != skip and below_us(pid)) / clk, ticks.get(skip, 0) / clk)


async def main(n: int = 300, sources: str = "sample", shared_data: str = "", openai_n: int = 4096, limit: int = 128,
         latency_s: float = 0.3, sandbox: str = "process", skip_openai: bool = False, skip_offline: bool = False,
         layout: str = "lake", batch_size: int = 112, merge_across: bool = True) -> dict:
    """Verified envs/minute offline (goal >= 300), and the concurrency-limit busy share at limit 128 (goal >= 0.9).

    `layout`: the offline run's warehouse, `lake` (the default) or `file` (one DuckDB file, as before DuckLake).
    `batch_size`: the openai runs' chunk (batch) / window (stream) of kept QAs that merging and distractors see:
    the default 112 makes three windows of the 336 QAs the default 4,096 decompositions keep (100000: one for the
    whole run). `merge_across` (default on; --no-merge-across): each merges against the ones before it, so the
    windows make the one window's merges: the sliding window of `envs synth --pipeline stream --merge-across`.

    Args:
        n: QAs requested per knowledge source in the offline run.
        sources: Knowledge sources of the offline run, comma-separated (sample, tau2, ...).
        shared_data: Directory of shared datasets the sources read (empty: the bundled data only).
        openai_n: Decompositions requested in the openai-backend runs.
        limit: The model endpoint's concurrency limit in the openai-backend runs.
        latency_s: Seconds the scripted endpoint takes to answer.
        sandbox: Sandbox backend: process, docker or auto.
        skip_openai: Skip the openai-backend runs.
        skip_offline: Skip the offline run.
        layout: Warehouse of the offline run: lake (DuckLake) or file (one DuckDB file).
        batch_size: Kept QAs per batch (batch pipeline) or window (stream pipeline) in the openai-backend runs.
        merge_across: Each window merges against the ones before it (--no-merge-across: on its own).
    """
    out: dict[str, Any] = {}
    if not skip_offline:
        await _offline(n, [s for s in sources.split(",") if s], shared_data or None, sandbox, out, layout)
    if not skip_openai:
        await _openai(openai_n, limit, latency_s, sandbox, out, batch_size, merge_across)
    return out
