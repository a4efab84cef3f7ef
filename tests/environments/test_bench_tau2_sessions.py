"""`arenaforge bench tau2_sessions`: τ²-bench retail's own database and gold actions, sessions at once, against each
task alone (issue 35). Needs the shared data (tau2_retail); the full check is 50 sessions x 3 rounds on Docker."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from arenaforge.benchmarks import tau2_sessions


@pytest.mark.shared_data
def test_tasks_at_once_end_as_they_do_alone(shared_data: Path) -> None:
    result = asyncio.run(tau2_sessions.main(backend="process", sessions=6, rounds=1, shared_data=str(shared_data)))
    assert result["alone"]["failures"] == [] and result["alone"]["states_read"] == 6
    assert result["alone"]["calls_ok"] > 0.8 * result["calls"]  # the gold actions really run on these tools
    [round_] = result["rounds"]
    assert round_["failures"] == []
    assert (round_["calls_matching"], round_["states_equal"]) == (result["calls"], 6)
    assert result["every_call_and_state"] is True
