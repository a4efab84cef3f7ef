"""`arenaforge bench isolation`: each attack beside a neighbour's call loop on one worker; the neighbour loses nothing."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from arenaforge.benchmarks.isolation import ATTACKS
from arenaforge.flows.cli import app
from tests.support.requirements import require_docker


@pytest.mark.parametrize("backend", ["process", pytest.param("docker", marks=pytest.mark.docker)])
def test_each_attack_costs_the_neighbour_no_call(backend: str) -> None:
    if backend == "docker":
        require_docker()
    result = CliRunner().invoke(app, ["bench", "isolation", "--backend", backend, "--calls", "20",
                                      "--attacks", ",".join(ATTACKS), "--control-runs", "2"])
    assert result.exit_code == 0, result.output
    got = json.loads(result.stdout)
    assert set(got["attacks"]) == set(ATTACKS)
    # the yardstick's own noise, measured beside a trivial call in the same sitting
    control = got["control"]
    assert control["runs"] == len(control["p99_over_quiet"]) == 2 and control["neighbour_failures"] == 0, control
    assert control["over_2x"] == sum(x > 2 for x in control["p99_over_quiet"]) and control["worst"] > 0, control
    assert got["attacks_over_2x"] == sum(r["p99_over_quiet"] > 2 for r in got["attacks"].values())
    assert got["total_neighbour_failures"] == 0, {a: r["first_failure"] for a, r in got["attacks"].items()}
    for attack, row in got["attacks"].items():
        assert row["p99_ms"] > 0 and row["quiet_p99_ms"] > 0, attack
        assert row["attacker_next_call"] in ("ok", "limit"), (attack, row)  # its session serves again, or says why
        assert not row["attacker_call"].startswith(("Overloaded", "SessionLost", "WorkerLost")), (attack, row)
        throttled = row["worker_group_throttled"]  # its container's CPU-quota stops during the loop (Docker)
        if "cpu" in row["cgroups"]:
            assert throttled["times"] >= 0 and throttled["ms"] >= 0, (attack, throttled)
    if "memory" in got["attacks"]["memfd"]["cgroups"]:
        assert got["attacks"]["memfd"]["attacker_call"].startswith("limit: the session process was killed for memory")
    assert got["attacks"]["files"]["attacker_call"].startswith("ok: stopped after")  # the file cap, not the machine
    assert got["attacks"]["junk_lines"]["attacker_call"].startswith("limit: the session process flooded its reply")
    # measured again 2 s in: the attack that runs until its 5 s limit, never one whose call had returned
    settled = {attack: row["settled_p99_over_quiet"] for attack, row in got["attacks"].items()
               if row["settled_p99_ms"] is not None}
    assert "busy_call" in settled and not settled.keys() & {"spinners", "busy_thread", "newlines"}, settled
    assert got["worst_settled_p99_over_quiet"] == max(settled.values()) > 0


@pytest.mark.parametrize("backend", ["process", pytest.param("docker", marks=pytest.mark.docker)])
def test_the_neighbour_may_run_beside_a_flooding_call_too(backend: str) -> None:
    """`--during-call`: the loop starts with the newline flood's own call, not once it returned; a flood the worker
    had to parse line by line held the neighbour there (junk lines: its p99 450-1,250x quiet)."""
    if backend == "docker":
        require_docker()
    result = CliRunner().invoke(app, ["bench", "isolation", "--backend", backend, "--calls", "20", "--during-call",
                                      "--attacks", "newlines,junk_lines", "--settle-s", "0"])
    assert result.exit_code == 0, result.output
    got = json.loads(result.stdout)
    assert got["during_call"] is True and got["total_neighbour_failures"] == 0, got
    for attack, row in got["attacks"].items():
        assert row["slowest_ms"] >= row["p99_ms"] > 0, (attack, row)
        assert row["attacker_call"].startswith(("ok: pouring", "limit: the session process flooded",  # or, where the
                                                "timeout: the call exceeded")), (attack, row)  # flood beat its reply


def test_an_unknown_attack_is_one_line() -> None:
    done = subprocess.run([sys.executable, "-m", "arenaforge.flows.cli", "bench", "isolation", "--attacks", "rowhammer"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip() == ("error: unknown attack(s) rowhammer; choose from memfd, spinners, busy_call, "
                                   "busy_thread, fork_bomb, newlines, junk_lines, files, memory")


def test_a_negative_control_count_is_one_line() -> None:
    done = subprocess.run([sys.executable, "-m", "arenaforge.flows.cli", "bench", "isolation", "--control-runs", "-1"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip() == "error: --control-runs must be 0 or more, not -1"


def test_an_unknown_sandbox_workload_is_one_line() -> None:
    """`bench sandbox --workloads cpu` ended in a KeyError traceback."""
    done = subprocess.run([sys.executable, "-m", "arenaforge.flows.cli", "bench", "sandbox", "--workloads", "cpu"],
                          capture_output=True, text=True, check=False)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.strip() == "error: unknown workload(s) cpu; choose from trivial, cpu50ms"
