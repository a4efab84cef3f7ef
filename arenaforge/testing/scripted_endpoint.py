"""The scripted OpenAI-compatible endpoint the model-bound benchmarks drive, in its own process.

It answers every request after `latency_s` and logs each change of its in-flight count, so
the benchmark can report the share of the concurrency limit the endpoint itself sees busy
over any window (the client's view, slots held, also counts time the client spends on its own
work while holding a slot). Its own process, so its loop does not share the client's GIL.
"""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

_SERVER = """
import json, sys
from arenaforge.testing.scripted_openai import Reply, ScriptedOpenAI, chat_completion
{setup}
latency = float(sys.argv[1])
def responder(req):
    reply = answer(req)
    reply = Reply(body=reply) if isinstance(reply, dict) else reply
    reply.delay_s = latency
    return reply
server = ScriptedOpenAI()
server.responder = responder
server.capacity = int(sys.argv[2]) or None
server.start()
print(server.url, flush=True)
sys.stdin.read()  # until the benchmark closes our stdin
print(json.dumps({{"peak": server.max_in_flight, "log": server.in_flight_log}}), flush=True)
server.stop()
"""


class ScriptedEndpoint:
    """`with ScriptedEndpoint(setup, latency_s) as ep:` ... `ep.url`; after the block, `ep.busy_share(...)`.

    `setup` is Python that defines `answer(request) -> Reply | dict` in the server process.
    """

    def __init__(self, setup: str, latency_s: float, capacity: int = 0) -> None:
        self.setup = setup
        self.latency_s = latency_s
        self.capacity = capacity  # requests worked on at once (0: no cap), see ScriptedOpenAI.capacity
        self.killed = False
        self.url = ""
        self.peak = 0
        self.log: list[tuple[float, int]] = []
        self._proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> ScriptedEndpoint:
        self._proc = subprocess.Popen(
            [sys.executable, "-c", _SERVER.format(setup=self.setup), str(self.latency_s), str(self.capacity)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self._proc.stdout is not None
        self.url = self._proc.stdout.readline().strip()
        if not self.url:
            self._proc.kill()
            raise RuntimeError("the scripted endpoint did not start")
        return self

    @property
    def pid(self) -> int:
        assert self._proc is not None
        return self._proc.pid

    def kill(self) -> None:
        """SIGKILL the server process: a replica that crashed with requests in flight."""
        assert self._proc is not None
        self._proc.kill()
        self._proc.wait(timeout=60)
        self.killed = True

    def __exit__(self, *exc: Any) -> None:
        assert self._proc is not None
        out, _ = self._proc.communicate(timeout=120)
        tail = out.strip().splitlines()
        if tail and not self.killed:
            done = json.loads(tail[-1])
            self.peak, self.log = done["peak"], [tuple(x) for x in done["log"]]

    def busy_share(self, limit: int, start: float, end: float) -> float:
        """Time-weighted mean share of `limit` in flight at the endpoint over [start, end] (perf_counter times)."""
        return round(busy_share(self.log, limit, start, end), 3)

    def request_window(self, start: float, end: float) -> tuple[float, float]:
        """First request in to last answer out within [start, end]: the stretch the work talks to the endpoint."""
        inside = [t for t, _ in self.log if start <= t <= end]
        return (inside[0], inside[-1]) if inside else (start, start)

    def arrivals(self, start: float, end: float) -> int:
        """Requests that reached the endpoint within [start, end]."""
        level, count = 0, 0
        for t, k in self.log:
            if start <= t <= end and k > level:
                count += 1
            level = k
        return count


def busy_share(log: list[tuple[float, int]], limit: int, start: float, end: float) -> float:
    """Time-weighted mean of min(in flight, limit) / limit over [start, end], from an in-flight change log."""
    if end <= start:
        return 0.0
    level, area, last = 0, 0.0, start
    for t, count in log:
        if t > end:
            break
        if t > start:
            area += min(level, limit) * (t - last)
            last = t
        level = count
    area += min(level, limit) * (end - last)
    return area / ((end - start) * limit)
