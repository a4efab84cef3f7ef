"""`arenaforge bench models`: how well the openai backend keeps an endpoint's concurrency limit busy.

The scripted OpenAI-compatible server (testing/scripted_openai.py, real HTTP) runs in its
own process and answers every request after `latency_s`. The client sends `n` structured
requests through the model-access layer (retries, AIMD limiter, schema validation, usage
ledger). Reported:
  endpoint_busy_share  the time-weighted share of the limit in flight at the endpoint, from
                       first request in to last answer out (the goal's measure)
  client_slot_share    the share of the limiter's slots held by the client (sampled every 10 ms,
                       steady part); it also counts slot time the client spends on its own CPU
  requests/s against the ideal limit/latency, and the client's CPU time per call.
"""

from __future__ import annotations

import asyncio
import tempfile
import time
from pathlib import Path
from typing import Any

from arenaforge.benchmarks import real_model
from arenaforge.testing.scripted_endpoint import ScriptedEndpoint

_ANSWER = "answer = lambda req: chat_completion(content='{\"city\": \"Oslo\"}')"

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


async def _drive(url: str, n: int, limit: int, wh_path: Path) -> dict[str, Any]:
    from arenaforge.schemas.config import ModelConfig
    from arenaforge.services.models import ChatRequest, open_chat_model
    from arenaforge.warehouse import Warehouse

    cfg = ModelConfig(backend="openai", base_url=url, model="scripted", cache=False,
                      concurrency_initial=limit, concurrency_max=limit)
    samples: list[int] = []
    done = asyncio.Event()

    async def sample(model: Any) -> None:
        while not done.is_set():
            samples.append(model.limiter.in_flight)
            await asyncio.sleep(0.01)

    async with open_chat_model(cfg, Warehouse(wh_path)) as model:
        sampler = asyncio.create_task(sample(model))
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
        "window": (t0, t0 + wall),
        "wall_s": round(wall, 2),
        "requests_per_s": round(n / wall, 1),
        "client_slot_share": round(sum(min(s, limit) for s in steady) / (len(steady) * limit), 3),
        "client_cpu_ms_per_call": round(cpu / n * 1000, 2),
    }


def main(n: int = 4096, limit: int = 128, latency_s: float = 0.3, real: bool = False, model: str = "smollm2-135m",
         qas: int = 40, chains: int = 10, server_tasks: int = 8, code_qas: int = 2) -> Any:
    """Client throughput against a scripted endpoint (share of `limit` kept busy; goal >= 0.9), or with --real
    the pipeline written by a real model behind the local llama-server (what was kept, by stage, and why).

    Args:
        n: Requests sent to the scripted endpoint.
        limit: The client's concurrency limit (the share of it kept busy is the result).
        latency_s: Seconds the scripted endpoint takes to answer.
        real: Drive the pipeline with a real model behind `arenaforge model serve`'s engine (llama-server) instead.
        model: --real: a bundled model (smollm2-135m) or the path of a GGUF file.
        qas: --real: QA instances `envs synth --decomposition stepwise --tool-code evidence` writes.
        chains: --real: chains per server `sft synth` walks.
        server_tasks: --real: server-only tasks per server `sft synth` writes (one tool each).
        code_qas: --real: QA instances whose tool code the model writes itself (`--tool-code model`).
    """
    if real:
        return real_model.run(model, n=qas, chains=chains, server_tasks=server_tasks, code_qas=code_qas)
    return _scripted(n, limit, latency_s)


async def _scripted(n: int, limit: int, latency_s: float) -> dict:
    with ScriptedEndpoint(_ANSWER, latency_s) as endpoint, tempfile.TemporaryDirectory() as tmp:
        result = await _drive(endpoint.url, n, limit, Path(tmp) / "bench.duckdb")
    window = endpoint.request_window(*result.pop("window"))
    return {"concurrency_limit": limit, "latency_s": latency_s, "ideal_requests_per_s": round(limit / latency_s, 1),
            "endpoint_busy_share": endpoint.busy_share(limit, *window), "endpoint_peak_in_flight": endpoint.peak,
            **result}
