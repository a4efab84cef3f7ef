"""`arenaforge serve` as a user runs it: one command brings up server, deployments and worker;
one Ctrl-C (SIGINT) stops all of it, leaving no server or worker process behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from arenaforge.flows.registry import FLOWS
from arenaforge.flows.serve import api_healthy
from tests.support.prefect_server import free_port

pytestmark = [pytest.mark.prefect_server, pytest.mark.slow]


def _pids_matching(text: str) -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if proc.name.isdigit():
            try:
                cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if text in cmd:
                pids.append(int(proc.name))
    return pids


def test_serve_starts_everything_and_one_ctrl_c_stops_it(tmp_path: Path) -> None:
    port = free_port()
    pool = f"cli-{port}"
    (tmp_path / "arenaforge.toml").write_text(
        f'[warehouse]\npath = "{tmp_path / "w.duckdb"}"\n'
        f'[prefect]\nport = {port}\nhome = "{tmp_path / "prefect"}"\nwork_pool = "{pool}"\n'
        '[prefect.schedules.sft]\ncron = "0 3 * * *"\nactive = false\n'
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "ARENAFORGE_"))}
    env.update({"NO_COLOR": "1", "COLUMNS": "200", "PYTHONUNBUFFERED": "1"})
    proc = subprocess.Popen(
        [sys.executable, "-m", "arenaforge.flows.cli", "serve"], cwd=tmp_path, env=env,
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    lines: list[str] = []
    try:
        deadline = time.monotonic() + 240
        while not any("Ctrl-C stops" in line for line in lines):
            line = proc.stdout.readline()
            assert line or proc.poll() is None, "serve exited early:\n" + "".join(lines)
            lines.append(line)
            assert time.monotonic() < deadline, "".join(lines)
        out = "".join(lines)
        api = f"http://127.0.0.1:{port}/api"
        assert f"UI: http://127.0.0.1:{port}" in out and api_healthy(api)
        for name in FLOWS:
            assert name in out
        assert "cron 0 3 * * *" in out
        assert _pids_matching(f"--pool {pool}"), "no worker process"

        ls = subprocess.run(
            [sys.executable, "-m", "arenaforge.flows.cli", "serve", "ls"], cwd=tmp_path, env=env,
            capture_output=True, text=True, timeout=120,
        )
        assert ls.returncode == 0 and "train-sft" in ls.stdout and "paused 0 3 * * *" in ls.stdout, ls.stdout

        os.kill(proc.pid, signal.SIGINT)  # what one Ctrl-C in the terminal delivers
        rest, _ = proc.communicate(timeout=90)
        assert proc.returncode == 0, rest
        assert "stopped" in rest
        assert not api_healthy(api)
        assert not _pids_matching(f"--pool {pool}") and not _pids_matching(f"--port {port}")
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
