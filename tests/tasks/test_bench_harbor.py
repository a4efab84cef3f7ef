"""`arenaforge bench harbor` runs end to end (its numbers are read from its JSON, never asserted on)."""

from __future__ import annotations

import asyncio

from arenaforge.benchmarks.harbor import main
from tests.support.requirements import require_docker


def test_bench_harbor_imports_its_tasks_and_measures_both_sides() -> None:
    require_docker()
    out = asyncio.run(main(tasks=2, sessions=1, calls=2, sandbox_backend="process"))
    assert (out["imported"], out["rejected"]) == (2, 0)
    assert out["container_task"]["run_shell"]["n"] == 2 and out["container_task"]["tests_verdict"]["n"] == 1
    assert out["sandbox"]["backend"] == "process" and out["sandbox"]["call"]["n"] == 2
