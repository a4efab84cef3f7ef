"""What one session's misbehaviour costs its neighbour on the same worker (issue 35).

For each attack, a fresh pool of one worker (so the two sessions share it): the neighbour's `calls` trivial calls
back to back, first alone (quiet), then while the attacker does its worst beside it. Printed per attack: the
neighbour's failures (observations that are not `ok`, and sandbox failures), its p50/p99 latency and p99 against
its quiet p99, how the attacker's own call ended, and whether its session serves again afterwards.

Attacks: `memfd` (memory no address-space limit sees: twice `memory_mb` written into an anonymous file), `spinners`
(busy background processes, as many as its `pids` allow, left running by a call that returns: the call is `limit`
and they die with it), `busy_call` (the same processes while the call waits on them, until its time limit: what the
neighbour's loop runs beside), `busy_thread` (a thread left spinning after its call returned), `fork_bomb` (a call
that forks until its limit),
`newlines` (a thread pouring bare newlines into its reply channel between calls), `junk_lines` (a call that writes
short lines into its reply channel until the flood bound ends it), `files` (empty files until the
scratch file cap), `memory` (an address-space blow-up). The neighbour's loop starts with the attack and is over in
well under a second, while `busy_call` is still forking; an attack still running `settle_s` after it began is
measured a second time then (`settled_p99_ms`). Goal (issue 35): 0 neighbour failures and p99 within 2x of
quiet for every attack, on both backends; the attacker ends as `limit`, `error` or `timeout`, charged to its tool.

The yardstick has noise of its own: `control` is the same measurement with the attacker making one trivial call,
`control_runs` times, interleaved with the attacks, so that a run over 2x can be set beside how often the same loop
goes over 2x with nothing beside it, measured in the same sitting.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from arenaforge.environments.runtime import EnvironmentFailure, create_pool
from arenaforge.schemas.config import SandboxConfig
from arenaforge.schemas.errors import InputError
from arenaforge.schemas.models import Environment, FunctionDoc

ATTACKS_CODE = r'''
import os, socket, threading

def ok():
    return "fine"

def memfd(mb: int):
    global HELD
    HELD = os.memfd_create("held")
    chunk = b"m" * (1 << 20)
    for _ in range(mb):
        os.write(HELD, chunk)
    return "held"

def spinners(n: int):
    for _ in range(n):
        if os.fork() == 0:
            while True:
                pass
    return "spinning"

def busy_call(n: int):
    spinners(n)
    while True:
        os.wait()

def busy_thread():
    def spin():
        while True:
            pass
    threading.Thread(target=spin, daemon=True).start()
    return "spinning"

def fork_bomb():
    while True:
        os.fork()

def _channel():
    for fd in sorted(int(x) for x in os.listdir("/proc/self/fd")):
        try:
            if "socket" in os.readlink(f"/proc/self/fd/{fd}"):
                return socket.socket(fileno=os.dup(fd))
        except OSError:
            pass

def newlines():
    channel = _channel()
    def pour():
        try:
            for _ in range(20000):
                channel.sendall(b"\n" * (1 << 16))
        except OSError:
            pass
    threading.Thread(target=pour, daemon=True).start()
    return "pouring"

def junk_lines():
    channel, junk = _channel(), b"x\n" * (1 << 15)
    for _ in range(20000):
        channel.sendall(junk)

def files(n: int):
    made = 0
    try:
        for i in range(n):
            open(f"/tmp/f{i}", "w").close()
            made += 1
    except OSError as err:
        return f"stopped after {made}: {err.strerror}"
    return f"made {made}"

def memory():
    chunks = []
    while True:
        chunks.append(bytearray(50 << 20))
'''
ATTACKS = ("memfd", "spinners", "busy_call", "busy_thread", "fork_bomb", "newlines", "junk_lines", "files", "memory")
ATTACK_TOOLS = ("ok", *ATTACKS)
BACKGROUND = ("spinners", "busy_thread", "newlines")  # their call returns, and what it started stays


def attacks_env() -> Environment:
    return Environment(name="attacks", tools=[FunctionDoc(name=n) for n in ATTACK_TOOLS], code=ATTACKS_CODE)


def _args(attack: str, cfg: SandboxConfig) -> dict[str, Any]:
    spinners = {"n": cfg.pids - 4}
    return {"memfd": {"mb": 2 * cfg.memory_mb}, "spinners": spinners, "busy_call": spinners,
            "files": {"n": 400_000}}.get(attack, {})


async def _neighbour_loop(pool: Any, session: Any, calls: int) -> tuple[list[float], list[str]]:
    latencies, failures = [], []
    for _ in range(calls):
        started = time.monotonic()
        try:
            obs = await pool.call(session, "ok", {})
            if obs.outcome != "ok":
                failures.append(f"{obs.outcome}: {obs.error}")
        except EnvironmentFailure as err:
            failures.append(f"{type(err).__name__}: {err}")
        latencies.append(time.monotonic() - started)
    return latencies, failures


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(p * len(ordered)))] * 1000, 2) if ordered else float("nan")


async def _throttled(pool: Any) -> list[float] | None:
    """The worker's group's CPU-quota stops so far ([times, ms], `cgroups.throttled`); None where it has none."""
    return (await pool.ping())[0].get("group_throttled")


async def _one(cfg: SandboxConfig, attack: str, calls: int, settle_s: float, during_call: bool) -> dict[str, Any]:
    pool = await create_pool(cfg)
    try:
        env = attacks_env()
        neighbour, attacker = await pool.open(env), await pool.open(env)
        quiet, _ = await _neighbour_loop(pool, neighbour, calls)
        throttled_before = await _throttled(pool)
        began = time.monotonic()
        attack_call = asyncio.ensure_future(pool.call(attacker, attack, _args(attack, cfg)))
        if attack in BACKGROUND and not during_call:  # the loop runs beside what the call left behind
            await asyncio.wait({attack_call})
        busy, failures = await _neighbour_loop(pool, neighbour, calls)
        throttled_after = await _throttled(pool)
        # the loop above takes well under a second, while `busy_call` is still forking: measure again once the
        # attack has run `settle_s`, if it still runs (the fork bomb and memfd are over by then)
        settled: list[float] = []
        if settle_s:
            await asyncio.wait({attack_call}, timeout=max(0.0, began + settle_s - time.monotonic()))
            if not attack_call.done():
                settled, more = await _neighbour_loop(pool, neighbour, calls)
                failures += more
        try:
            own = await attack_call
            outcome = f"{own.outcome}: {own.error or own.output}"[:200]
        except EnvironmentFailure as err:
            outcome = f"{type(err).__name__}: {err}"[:200]
        try:
            after = (await pool.call(attacker, "ok", {})).outcome
        except EnvironmentFailure as err:
            after = type(err).__name__
        info = dict(pool.info)
    finally:
        await pool.shutdown()
    return {
        "neighbour_failures": len(failures), "first_failure": failures[0][:200] if failures else None,
        "quiet_p50_ms": _pct(quiet, 0.5), "quiet_p99_ms": _pct(quiet, 0.99),
        "p50_ms": _pct(busy, 0.5), "p99_ms": _pct(busy, 0.99),
        "p99_over_quiet": round(_pct(busy, 0.99) / max(_pct(quiet, 0.99), 1e-3), 2), "slowest_ms": _pct(busy, 1.0),
        "settled_p99_ms": _pct(settled, 0.99) if settled else None,
        "settled_p99_over_quiet": round(_pct(settled, 0.99) / max(_pct(quiet, 0.99), 1e-3), 2) if settled else None,
        "attacker_call": outcome, "attacker_next_call": after, "cgroups": info.get("cgroups", []),
        # the worker's group (its container, on Docker) out of CPU quota during the attacked loop: each stop holds the
        # worker and every session for the rest of a period, the neighbour's slowest call among them
        "worker_group_throttled": {"times": throttled_after[0] - throttled_before[0],
                                   "ms": round(throttled_after[1] - throttled_before[1], 1)}
        if throttled_before and throttled_after else None,
    }


async def main(backend: str = "docker", calls: int = 500, attacks: str = ",".join(ATTACKS),
               session_cgroups: bool = True, process_cpu_groups: bool = True,
               docker_socket_channel: bool = True, settle_s: float = 2.0,
               busy_session_cores: int = 1, cpus: float = SandboxConfig().cpus,
               session_cpu_share: float = SandboxConfig().session_cpu_share,
               during_call: bool = False, control_runs: int = 1) -> dict[str, Any]:
    """Each attack beside a neighbour's call loop, on a fresh one-worker pool.

    Args:
        backend: Sandbox backend: process or docker.
        calls: Trivial calls the neighbour makes, quiet and then under attack.
        attacks: Comma-separated attacks to run (memfd, spinners, busy_call, busy_thread, fork_bomb, newlines,
            junk_lines, files, memory).
        session_cgroups: A cgroup per session (off: as before issue 35's groups).
        process_cpu_groups: Process backend: a CPU group per session too (`sandbox.process_cpu_groups`; off: as
            before it was on by default).
        docker_socket_channel: Docker: calls over the pool's socket in the container (`sandbox.docker_socket_channel`;
            off: through the engine's attach stream, as before).
        settle_s: Measure the neighbour again this long after an attack began, if it still runs then (its
            processes all started: `settled_p99_ms`); 0: skip.
        busy_session_cores: Cores a session runs on while its call runs long: from 1 ms on a worker of at most
            twice as many sessions as cores, as here (`sandbox.busy_session_cores`; 0: all, as before).
        cpus: Docker: CPUs of the worker's container (`sandbox.cpus`).
        session_cpu_share: Docker: the share of the container's CPUs one session may use (`sandbox.session_cpu_share`).
        during_call: Start the neighbour's loop with a background attack's call (spinners, busy_thread, newlines)
            rather than once it returns, so that it also runs beside what that call does before returning.
        control_runs: Runs of the same loop beside one trivial call instead of an attack (the yardstick's own noise),
            interleaved with the attacks; 0: none.
    """
    chosen = [a.strip() for a in attacks.split(",") if a.strip()]
    unknown = sorted(set(chosen) - set(ATTACKS))
    if unknown:
        raise InputError(f"unknown attack(s) {', '.join(unknown)}; choose from {', '.join(ATTACKS)}")
    cfg = SandboxConfig(backend=backend, pool_size=1, session_cgroups=session_cgroups,
                        process_cpu_groups=process_cpu_groups, docker_socket_channel=docker_socket_channel,
                        busy_session_cores=busy_session_cores, cpus=cpus, session_cpu_share=session_cpu_share)
    if control_runs < 0:
        raise InputError(f"--control-runs must be 0 or more, not {control_runs}")
    results: dict[str, Any] = {}
    controls: list[dict[str, Any]] = []
    for i in range(max(len(chosen), control_runs)):  # a control run after each attack, while both last
        if i < len(chosen):
            results[chosen[i]] = await _one(cfg, chosen[i], calls, settle_s, during_call)
        if i < control_runs:
            controls.append(await _one(cfg, "ok", calls, 0.0, during_call))
    attacked = [r["p99_over_quiet"] for r in results.values()]
    control_ratios = [r["p99_over_quiet"] for r in controls]
    return {
        "backend": backend, "calls": calls, "session_cgroups": session_cgroups,
        "process_cpu_groups": process_cpu_groups, "docker_socket_channel": docker_socket_channel,
        "busy_session_cores": busy_session_cores, "cpus": cpus, "session_cpu_share": session_cpu_share,
        "during_call": during_call,
        "memory_mb": cfg.memory_mb, "pids": cfg.pids, "call_timeout_s": cfg.call_timeout_s,
        "attacks": results,
        "attacks_over_2x": sum(x > 2 for x in attacked),
        # the same loop beside one trivial call: how often the yardstick alone reads over 2x
        "control": {"runs": len(controls), "p99_over_quiet": control_ratios,
                    "over_2x": sum(x > 2 for x in control_ratios), "worst": max(control_ratios, default=None),
                    "neighbour_failures": sum(r["neighbour_failures"] for r in controls)},
        "total_neighbour_failures": sum(r["neighbour_failures"] for r in [*results.values(), *controls]),
        "worst_p99_over_quiet": max((r["p99_over_quiet"] for r in results.values()), default=None),
        "worst_settled_p99_over_quiet": max((r["settled_p99_over_quiet"] for r in results.values()
                                             if r["settled_p99_over_quiet"] is not None), default=None),
    }
