"""Sandbox verification of a drafted environment, and the self-test of an accepted one.

`check_environment` runs in one sandbox session: the module loads; every gold call returns its gold
answer (`environments.reward.answer_matches`); the call for every other record of the tool's data returns
what the knowledge source says for that record (a tool that returns a constant, or the writer's invented
answer, fails) and never a gold answer; nothing times out. `self_test` checks an accepted
environment end to end with the shared F1 reward: replaying the gold calls earns 1.0, no calls earn 0,
random tools with random valid arguments earn < 1. A call the sandbox itself failed (`pool.call` raises an
`EnvironmentFailure`: a worker died, the machine was overloaded) is an infrastructure failure, never the tool's.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from typing import Any

from arenaforge.environments.reward import answer_matches, f1_reward, gold_call_passes
from arenaforge.schemas.models import Environment, FunctionDoc, GoldCall
from arenaforge.tracks.envs.tool_data import Probe


@dataclass
class CheckResult:
    ok: bool
    checks: dict[str, bool]
    details: list[str]
    failing_tools: set[str]


async def check_environment(pool: Any, env: Environment, probes: dict[str, list[Probe]]) -> CheckResult:
    """Sandbox checks: imports, gold calls answer, other records' arguments give what the source says for them and
    never a gold answer, nothing times out."""
    from arenaforge.environments.runtime import EnvLoadError

    details: list[str] = []
    failing: set[str] = set()
    try:
        session = await pool.open(env)
    except EnvLoadError as err:
        return CheckResult(False, {"imports": False}, [f"import_error: {err.detail[-300:]}"], {t.name for t in env.tools})
    gold_ok = leak_free = no_timeout = grounded = True
    try:
        for call in env.calls:
            obs = await pool.call(session, call.tool, call.arguments)  # EnvironmentFailure: the sandbox's fault
            if obs.outcome == "timeout":
                no_timeout = False
                failing.add(call.tool)
                details.append(f"timeout: {call.tool} did not return within its limit")
            elif not gold_call_passes(call.answer, obs.outcome, obs.output):  # None is a valid result
                gold_ok = False
                failing.add(call.tool)
                details.append(f"wrong_answer: {call.tool}({json.dumps(call.arguments)}) gave "
                               f"{obs.outcome} {(obs.output or obs.error or '')[:160]!r}, expected {call.answer!r}")
        gold_by_tool: dict[str, list[GoldCall]] = {}
        for call in env.calls:
            gold_by_tool.setdefault(call.tool, []).append(call)
        for tool, tool_probes in probes.items():
            for probe in tool_probes:
                args = probe.arguments
                obs = await pool.call(session, tool, args)
                if obs.outcome == "timeout":
                    no_timeout = False
                    failing.add(tool)
                    details.append(f"timeout: {tool}({json.dumps(args)})")
                    break
                if probe.answer is not None and (obs.outcome != "ok" or not answer_matches(probe.answer, obs.output)):
                    grounded = False  # the code does not compute the source's answer for another record
                    failing.add(tool)
                    details.append(f"wrong_answer: {tool}({json.dumps(args)}) gave {obs.outcome} "
                                   f"{(obs.output or obs.error or '')[:160]!r}, the source says {probe.answer!r}")
                    break
                leaked = [c.answer for c in gold_by_tool.get(tool, []) if obs.outcome == "ok"
                          and c.arguments != args and answer_matches(c.answer or "", obs.output)
                          and not (probe.answer and answer_matches(c.answer or "", probe.answer))]
                if leaked:
                    leak_free = False
                    failing.add(tool)
                    details.append(f"answer_leak: {tool}({json.dumps(args)}) also returns {leaked[0]!r}")
                    break
    finally:
        await pool.close(session)
    checks = {"imports": True, "gold_calls": gold_ok, "other_records": grounded, "no_answer_leak": leak_free,
              "no_timeout": no_timeout}
    return CheckResult(all(checks.values()), checks, details, failing)


def random_arguments(doc: FunctionDoc, data: Any, rng: random.Random) -> dict[str, Any]:
    """Arguments valid for the tool's schema, drawn from its enum values, data keys or random tokens."""
    keys = [k for k in data if isinstance(k, str)] if isinstance(data, dict) else []
    rows = data if isinstance(data, list) else []
    args: dict[str, Any] = {}
    props = doc.parameters.get("properties", {})
    for pname in doc.parameters.get("required", []):
        spec = props.get(pname, {})
        ptype = spec.get("type", "string")
        column = [r[pname] for r in rows if isinstance(r, dict) and pname in r]
        if "enum" in spec:
            args[pname] = rng.choice(spec["enum"])
        elif ptype == "integer":
            args[pname] = int(rng.choice(column)) if column else rng.randint(0, 1000)
        elif ptype == "number":
            args[pname] = float(rng.choice(column)) if column else rng.random() * 100
        elif ptype == "boolean":
            args[pname] = rng.random() < 0.5
        else:
            pool = keys or [str(v) for v in column] or [f"x{rng.randint(0, 999)}"]
            args[pname] = rng.choice(pool)
    return args


async def self_test(pool: Any, env: Environment, seed: int = 0) -> tuple[dict[str, bool], list[str]]:
    """F1 of gold replay (must be 1.0), no calls (0) and random valid calls (< 1).

    The random calls follow the gold replay in its session when the replay left the state as it started (its
    snapshot equals `initial_state`; `check_environment` probes after the gold calls the same way): they see what a
    fresh session would, and the pool forks one session per self-test instead of two plus a spare (a version opened
    twice gets one). A replay that changed the state gets the random calls a fresh session."""
    from arenaforge.environments.runtime import EnvironmentFailure, run_calls

    try:
        session = await pool.open(env)
    except EnvironmentFailure as err:  # the sandbox failed, not the environment: the row is an environment failure
        return {"self_test_gold_f1": False}, [f"sandbox_failure: {str(err)[:300]}"]
    try:
        if env.tool_turns:  # a replay is not an episode: every tool visible (`runtime.replay`)
            session.turn = max(env.tool_turns.values())
        try:
            gold_obs = [await pool.call(session, c.tool, c.arguments) for c in env.calls]
            unchanged = await _state_unchanged(pool, session, env)
        except EnvironmentFailure as err:
            return {"self_test_gold_f1": False}, [f"sandbox_failure: {str(err)[:300]}"]
        gold = f1_reward(env.gold_answers, [o.text() for o in gold_obs], len(env.calls))
        empty = f1_reward(env.gold_answers, [], 0)
        rng = random.Random(f"{seed}:{env.id}")
        docs = {t.name: t for t in env.tools}
        gold_pairs = [(c.tool, c.arguments) for c in env.calls]
        calls: list[tuple[str, dict[str, Any]]] = []
        for _ in range(max(1, len(env.calls))):
            for _try in range(10):
                name = rng.choice(sorted(docs))
                args = random_arguments(docs[name], (env.initial_state or {}).get(name), rng)
                if (name, args) not in gold_pairs:
                    break
            calls.append((name, args))
        try:
            if unchanged:
                rand_obs = [await pool.call(session, name, args) for name, args in calls]
            else:
                await pool.close(session)
                rand_obs = await run_calls(pool, env, calls)
        except EnvironmentFailure as err:
            return {"self_test_random_f1": False}, [f"sandbox_failure: {str(err)[:300]}"]
    finally:
        await pool.close(session)
    rand = f1_reward(env.gold_answers, [o.text() for o in rand_obs], len(calls))
    checks = {"self_test_gold_f1": gold.f1 == 1.0, "self_test_no_calls_f1": empty.f1 == 0.0,
              "self_test_random_f1": rand.f1 < 1.0}
    details = [f"self-test f1: gold {gold.f1:.3f}, no calls {empty.f1:.3f}, random {rand.f1:.3f}"]
    return checks, details


async def _state_unchanged(pool: Any, session: Any, env: Environment) -> bool:
    """Whether the session's state (the harness's snapshot, `Pool.state`) is still `env.initial_state`."""
    from arenaforge.environments.runtime import EnvironmentFailure
    from arenaforge.schemas.errors import SandboxError

    try:
        state = await pool.state(session)
    except EnvironmentFailure:
        raise
    except SandboxError:  # unreadable or over the output limit: assume it changed
        return False
    return bool(state == json.loads(json.dumps(env.initial_state)))
