"""A real two-node Ray cluster on loopback for tests: a head and a second worker node, each `ray start --block`.

Own ports and temp dir, 127.0.0.1 only, so it never touches another Ray on the machine; each node runs in its own
session and is stopped by signalling that session (never `ray stop`, which stops every Ray of the user).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RayCluster:
    def __init__(self, work: Path, worker_nodes: int = 1, cpus: int = 1, logical_gpus: int = 0) -> None:
        self.work = work
        self.worker_nodes = worker_nodes
        self.cpus = cpus
        self.logical_gpus = logical_gpus  # GPUs the nodes advertise to Ray's scheduler (a count; none need exist)
        self.address = ""
        self.nodes: list[subprocess.Popen] = []

    def start(self) -> None:
        ray = str(Path(sys.executable).with_name("ray"))
        port = _free_port()
        self.address = f"127.0.0.1:{port}"
        common = ["--block", "--node-ip-address=127.0.0.1", f"--num-cpus={self.cpus}", f"--num-gpus={self.logical_gpus}",
                  "--disable-usage-stats", f"--object-store-memory={100 * 2**20}"]
        head = [ray, "start", "--head", f"--port={port}", "--include-dashboard=false",
                f"--temp-dir={self.work / 'ray'}", *common]
        self.nodes.append(self._node(head, "head"))
        self._wait_for_nodes(1)
        for n in range(self.worker_nodes):
            self.nodes.append(self._node([ray, "start", f"--address={self.address}", *common], f"worker{n}"))
            self._wait_for_nodes(2 + n)

    def _node(self, argv: list[str], name: str) -> subprocess.Popen:
        log = (self.work / f"ray-{name}.log").open("w")
        return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, "RAY_ADDRESS": ""})

    def alive_nodes(self) -> int:
        """Alive nodes as the cluster's GCS reports them (`ray status` would need the dashboard)."""
        probe = ("import ray, sys; ray.init(address=sys.argv[1], log_to_driver=False, logging_level='error'); "
                 "print(sum(1 for n in ray.nodes() if n['Alive']))")
        out = subprocess.run([sys.executable, "-c", probe, self.address], capture_output=True, text=True, timeout=120)
        return int(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 and out.stdout.strip() else 0

    def _wait_for_nodes(self, n: int) -> None:
        while self.alive_nodes() < n:
            for node in self.nodes:
                if node.poll() is not None:
                    raise RuntimeError(f"a ray node exited with {node.returncode}; see {self.work}/ray-*.log")
            time.sleep(0.5)  # a poll interval: the loop ends on the condition, not the clock

    def stop(self) -> None:
        for node in reversed(self.nodes):
            if node.poll() is None:
                os.killpg(node.pid, signal.SIGTERM)  # `ray start --block` takes its processes down with it
                node.wait(timeout=60)
