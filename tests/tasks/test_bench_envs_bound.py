"""`bench envs` says what bounds a whole-run share: request seconds at the limit against CPU seconds per core."""

from __future__ import annotations

import os

from arenaforge.benchmarks.envs import _cpu_bound


def test_cpu_bound_share_cap_compares_request_seconds_with_cpu_seconds_per_core() -> None:
    cores = len(os.sched_getaffinity(0))
    run = {"client_cpu_s": {"batch": 1.0, "stream": 10.0 * cores}, "sandbox_cpu_s": {"batch": 1.0, "stream": 3.0 * cores},
           "endpoint_cpu_s": {"batch": 0.5, "stream": 1.0 * cores}}
    out = _cpu_bound(run, {"batch": 1280, "stream": 1280}, 0.3, 128)  # 1,280 x 0.3 s / 128 = 3 s at the full limit
    assert out["cores"] == cores and out["request_s_at_limit"] == {"batch": 3.0, "stream": 3.0}
    assert out["cpu_s"] == {"batch": 2.5, "stream": round(14.0 * cores, 2)}
    # batch: 2.5 CPU s fit in the 3 s of requests on any core count; stream: 14 s per core against 3 s of requests
    assert out["cpu_bound_share_cap"] == {"batch": 1.0, "stream": round(3.0 / 14.0, 3)}
    assert len(out["load_average"]) == 3
