"""`arenaforge bench envs`: RL environment synthesis throughput, offline and against a slow endpoint.

1. offline — verified environments per minute, end to end: knowledge source -> QA synthesis and
   verification -> tools verified in the sandbox -> merging -> distractors -> self-test ->
   warehouse writes (one upsert per stage). The embedding model's one-off load is timed apart.
2. openai — the same QA and environment stages against the scripted OpenAI-compatible server
   (tests/support/scripted_openai.py, real HTTP) answering every request after `latency_s`; the
   server's in-flight count is sampled every millisecond and the mean share of the concurrency
   limit kept busy is reported over the model-bound QA stage (decomposition + verification)
   and over the whole run. Needs the repository checkout (it imports the test server).
"""

from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from schemas.config import Config, ModelConfig, SandboxConfig
from warehouse.db import Warehouse


def _offline(n: int, sources: list[str], shared_data: str | None, sandbox: str, out: dict[str, Any]) -> None:
    from tasks.embeddings import embed
    from tasks.envs_pipeline import EnvsSpec, build_environments, load_sources, synthesize_qas

    t = time.perf_counter()
    embed(["warm up"])
    out["embedding_model_load_s"] = round(time.perf_counter() - t, 2)
    with tempfile.TemporaryDirectory() as tmp:
        cfg = Config(sandbox=SandboxConfig(backend=sandbox))  # type: ignore[arg-type]
        wh = Warehouse(Path(tmp) / "bench.duckdb")
        spec = EnvsSpec(sources=sources, n=n, shared_data=shared_data, batch_size=100_000)
        t0 = time.perf_counter()
        loaded = load_sources(spec)
        t1 = time.perf_counter()
        ids, qa_counts = synthesize_qas(cfg, wh, "bench", spec, loaded)
        t2 = time.perf_counter()
        timings: dict[str, float] = {}
        counts = build_environments(cfg, wh, "bench", spec, ids, loaded, timings=timings)
        t3 = time.perf_counter()
        for source in loaded.values():
            source.close()
        stored = wh.count("environments")
    total = t3 - t0
    out["offline"] = {
        "sources": sources, "qa_requested": n * len(sources), **qa_counts, **counts, "environments_stored": stored,
        "sandbox_backend": sandbox, "load_sources_s": round(t1 - t0, 2), "qa_stage_s": round(t2 - t1, 2),
        "env_stage_s": round(t3 - t2, 2), **{k: round(v, 2) for k, v in timings.items()}, "total_s": round(total, 2),
        "verified_envs_per_min": round(counts["environments"] / total * 60, 1),
    }


_SERVER = """
import sys
from tests.support.envs_fakes import EnvsResponder
from tests.support.scripted_openai import ScriptedOpenAI
latency = float(sys.argv[1])
answer = EnvsResponder()
def responder(req):
    reply = answer(req)
    reply.delay_s = latency
    return reply
server = ScriptedOpenAI()
server.responder = responder
server.start()
print(server.url, flush=True)
sys.stdin.read()  # until the benchmark closes our stdin
print(len(server.chat_requests()), server.max_in_flight, flush=True)
server.stop()
"""


def _openai(n: int, limit: int, latency_s: float, sandbox: str, out: dict[str, Any]) -> None:
    import subprocess
    import sys

    from tasks.envs_pipeline import EnvsSpec, build_environments, synthesize_qas
    from tasks.models import openai_model

    repo = Path(__file__).resolve().parents[2]
    # the scripted server runs in its own process, so its threads do not share our GIL
    proc = subprocess.Popen([sys.executable, "-c", _SERVER, str(latency_s)], cwd=repo, stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, text=True, env={**__import__("os").environ, "PYTHONPATH": str(repo)})
    assert proc.stdout is not None and proc.stdin is not None
    url = proc.stdout.readline().strip()
    samples: list[tuple[float, int]] = []
    stop = threading.Event()

    def sample() -> None:  # the client's slots in use: every limiter of this endpoint (one per event loop)
        while not stop.is_set():
            busy = sum(lim.in_flight for (base, _), lim in list(openai_model._LIMITERS.items()) if base == url)
            samples.append((time.perf_counter(), busy))
            time.sleep(0.01)  # a tighter loop steals the GIL from the event loop it measures

    sampler = threading.Thread(target=sample, daemon=True)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            model = ModelConfig(backend="openai", base_url=url, model="scripted", cache=False,
                                concurrency_initial=limit, concurrency_max=limit, max_retries=2, timeout_s=120)
            cfg = Config(model=model, sandbox=SandboxConfig(backend=sandbox))  # type: ignore[arg-type]
            wh = Warehouse(Path(tmp) / "bench.duckdb")
            spec = EnvsSpec(sources=["sample"], n=n, batch_size=100_000)
            sampler.start()
            t0 = time.perf_counter()
            ids, qa_counts = synthesize_qas(cfg, wh, "bench", spec)
            t1 = time.perf_counter()
            timings: dict[str, float] = {}
            counts = build_environments(cfg, wh, "bench", spec, ids, timings=timings)
            t2 = time.perf_counter()
    finally:
        stop.set()
        sampler.join(timeout=5)
        tail, _ = proc.communicate(timeout=60)
    requests, peak = (int(x) for x in tail.split())

    def busy(a: float, b: float) -> float:
        window = [k for t, k in samples if a <= t <= b]
        return round(sum(min(k, limit) for k in window) / (len(window) * limit), 3) if window else 0.0

    def active(a: float, b: float) -> float:
        """Busy share while the stage talks to the endpoint (first request out to last answer in):
        the stage's setup and its batch writes to DuckDB send no requests by design."""
        times = [t for t, k in samples if a <= t <= b and k > 0]
        return busy(times[0], times[-1]) if times else 0.0

    out["openai"] = {
        "requests": requests, "latency_s": latency_s, "concurrency_limit": limit, "server_peak_in_flight": peak,
        **qa_counts, **counts, "qa_stage_s": round(t1 - t0, 2), "env_stage_s": round(t2 - t1, 2),
        "busy_share_qa_stage": busy(t0, t1),
        "busy_share_qa_requests": active(t0, t1),
        "busy_share_tool_building": busy(t1 + timings.get("pool_start_s", 0), t1 + timings.get("pool_start_s", 0)
                                         + timings.get("tools_verified_s", 0)),
        "busy_share_whole_run": busy(t0, t2), **{k: round(v, 2) for k, v in timings.items()},
        "requests_per_s": round(requests / (t2 - t0), 1),
        "ideal_requests_per_s": round(limit / latency_s, 1),
    }


def main(n: int = 300, sources: str = "sample", shared_data: str = "", openai_n: int = 1024, limit: int = 128,
         latency_s: float = 0.3, sandbox: str = "process", skip_openai: bool = False, skip_offline: bool = False) -> dict:
    """Verified envs/minute offline (goal >= 300), and the concurrency-limit busy share at limit 128 (goal >= 0.9)."""
    out: dict[str, Any] = {}
    if not skip_offline:
        _offline(n, [s for s in sources.split(",") if s], shared_data or None, sandbox, out)
    if not skip_openai:
        _openai(openai_n, limit, latency_s, sandbox, out)
    return out
