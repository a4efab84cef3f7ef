"""`arenaforge bench models`: how well the openai backend keeps an endpoint's concurrency limit busy.

The scripted OpenAI-compatible server (tests/support/scripted_openai.py, real HTTP) runs in its
own process and answers every request after `latency_s`. The client sends `n` structured
requests through the model-access layer (retries, AIMD limiter, schema validation, usage
ledger) and samples the limiter's in-flight count every 10 ms. Reported: the mean share of the
limit kept busy, requests/s against the ideal limit/latency, and the client's CPU time per call.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

_SERVER = """
import sys, time
sys.path.insert(0, {repo!r})
from tests.support.scripted_openai import ScriptedOpenAI, Reply, chat_completion
server = ScriptedOpenAI()
server.responder = lambda req: Reply(body=chat_completion(content='{{"city": "Oslo"}}'), delay_s={latency})
server.start()
print(server.url, flush=True)
sys.stdin.read()
"""

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


async def _drive(url: str, n: int, limit: int, wh_path: Path) -> dict[str, Any]:
    from schemas.config import ModelConfig
    from tasks.models import ChatRequest, chat_model, openai_model
    from warehouse import Warehouse

    cfg = ModelConfig(backend="openai", base_url=url, model="scripted", cache=False,
                      concurrency_initial=limit, concurrency_max=limit)
    samples: list[int] = []
    done = asyncio.Event()

    async def sample() -> None:
        while not done.is_set():
            samples.append(sum(lim.in_flight for (base, _), lim in list(openai_model._LIMITERS.items()) if base == url))
            await asyncio.sleep(0.01)

    with chat_model(cfg, Warehouse(wh_path)) as model:
        sampler = asyncio.create_task(sample())
        cpu0, t0 = time.process_time(), time.perf_counter()
        await asyncio.gather(*[
            model.complete(ChatRequest(step="bench", messages=[{"role": "user", "content": f"city #{i}?"}],
                                       response_schema=SCHEMA))
            for i in range(n)
        ])
        wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
        done.set()
        await sampler
    steady = samples[len(samples) // 10: len(samples) - len(samples) // 10] or samples  # drop ramp-up and tail
    return {
        "requests": n,
        "wall_s": round(wall, 2),
        "requests_per_s": round(n / wall, 1),
        "busy_share": round(sum(min(s, limit) for s in steady) / (len(steady) * limit), 3),
        "client_cpu_ms_per_call": round(cpu / n * 1000, 2),
    }


def main(n: int = 4096, limit: int = 128, latency_s: float = 0.3) -> dict:
    """Mean share of the concurrency limit kept busy at `limit` against a `latency_s` endpoint (goal >= 0.9)."""
    repo = str(Path(__file__).resolve().parents[2])
    server = subprocess.Popen([sys.executable, "-c", _SERVER.format(repo=repo, latency=latency_s)],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        url = server.stdout.readline().strip()
        with tempfile.TemporaryDirectory() as tmp:
            result = asyncio.run(_drive(url, n, limit, Path(tmp) / "bench.duckdb"))
    finally:
        server.kill()
        server.wait()
    return {"concurrency_limit": limit, "latency_s": latency_s,
            "ideal_requests_per_s": round(limit / latency_s, 1), **result}
