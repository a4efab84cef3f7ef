"""A real Prefect server for the test session (started once: it takes ~20 s on 2 cores).

`prefect server start` in a subprocess on a free loopback port, SQLite in a temp
PREFECT_HOME, telemetry off. The fixture exports PREFECT_API_URL so in-process flows and
CLI subprocesses all report to it.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

QUIET_ENV = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "1",
    "PREFECT_LOGGING_LEVEL": "WARNING",
    "PREFECT_SERVER_UI_SHOW_PROMOTIONAL_CONTENT": "false",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class PrefectServer:
    def __init__(self, home: Path, port: int | None = None) -> None:
        self.home = home
        self.port = port or free_port()
        self.proc: subprocess.Popen | None = None

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def env(self) -> dict[str, str]:
        return {**QUIET_ENV, "PREFECT_HOME": str(self.home), "PREFECT_API_URL": self.api_url}

    def start(self, timeout_s: float = 120) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, **self.env()}
        env.pop("PREFECT_API_URL")  # the server itself must not point at itself
        env["PREFECT_UI_API_URL"] = self.api_url  # else the UI (browser tests) calls the default port 4200
        self.log = open(self.home / "server.log", "w")  # noqa: SIM115 (closed in stop)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(self.port)],
            env=env, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"prefect server exited: {(self.home / 'server.log').read_text()[-2000:]}")
            try:
                with urllib.request.urlopen(f"{self.api_url}/health", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except OSError:
                time.sleep(0.5)  # polling a condition with a deadline, not a fixed sleep
        raise RuntimeError("prefect server did not become healthy in time")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, 15)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, 9)
        if getattr(self, "log", None):
            self.log.close()
