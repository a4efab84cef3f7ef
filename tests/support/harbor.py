"""A Harbor task's tools service (environment/tools/server.py of an `envs export`) run as a local process."""

from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path


class ToolsService:
    """The task's tools service (environment/tools/server.py) as a local process on a free port."""

    def __init__(self, tools_dir: Path, call_log: Path) -> None:
        from tests.support.prefect_server import free_port

        self.url = f"http://127.0.0.1:{free_port()}"
        self.call_log = call_log  # what Harbor collects from the service for the verifier
        self.proc = subprocess.Popen([sys.executable, str(tools_dir / "server.py")],
                                     env={**os.environ, "PORT": self.url.rsplit(":", 1)[1], "CALL_LOG": str(call_log)},
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2):
                    return
            except OSError:
                assert self.proc.poll() is None, self.proc.stderr.read()
                assert time.monotonic() < deadline, "tools service did not start"
                time.sleep(0.1)  # polling a condition with a deadline

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(timeout=30)
