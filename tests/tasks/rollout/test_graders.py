"""Imported suites' graders: one object per `NativeCheck.kind`, asked by the episode loop instead of the suite's name."""

from __future__ import annotations

import asyncio
import typing

from arenaforge.environments.native import NativeVerdict
from arenaforge.schemas.models import Environment, FunctionDoc, NativeCheck
from arenaforge.tracks.envs.graders import GRADERS, grader_for


def test_every_native_check_kind_has_its_grader() -> None:
    assert set(GRADERS) == set(typing.get_args(NativeCheck.model_fields["kind"].annotation))


def test_an_environment_without_a_native_check_has_one_turn_and_no_verdict() -> None:
    env = Environment(name="plain", tools=[FunctionDoc(name="f")], code="def f():\n    return 1\n", question="q?")
    grader = grader_for(env)
    assert grader.user_turns(env) == ["q?"]
    assert asyncio.run(grader.after_episode(env, None, None, 0, [], None)) is None


def test_a_state_hash_suite_grades_the_final_state() -> None:
    from arenaforge.environments.state import state_hash

    class Pool:
        async def state(self, session: object) -> dict[str, int]:
            return {"n": 1}

    native = NativeCheck(suite="s", kind="state_hash", gold_state_sha256=state_hash({"n": 1}), source="test")
    env = Environment(name="s", tools=[FunctionDoc(name="f")], code="def f():\n    return 1\n", native=native)
    assert asyncio.run(grader_for(env).after_episode(env, Pool(), None, 0, [], None)) == NativeVerdict(True)
