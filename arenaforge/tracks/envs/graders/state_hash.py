"""Python suites (`envs import python`): the session's final state must hash to the gold calls' final state."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from arenaforge.environments.native import NativeVerdict, state_hash_verdict
from arenaforge.schemas.models import Environment
from arenaforge.tracks.envs.graders.base import SuiteGrader


class StateHashGrader(SuiteGrader):
    kind = "state_hash"

    async def after_episode(self, env: Environment, pool: Any, session: Any, reached: int, results: Sequence[str],
                            verdict: NativeVerdict | None) -> NativeVerdict | None:
        assert env.native is not None
        return state_hash_verdict(env.native, await pool.state(session))
