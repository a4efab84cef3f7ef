"""Harbor tasks (`envs import harbor`): the task's own tests, run in the episode's container after the agent's turn
(`environments.containers.RoutedPool.verdict`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from arenaforge.environments.native import NativeVerdict
from arenaforge.schemas.models import Environment
from arenaforge.tracks.envs.graders.base import SuiteGrader


class HarborTestsGrader(SuiteGrader):
    kind = "harbor_tests"

    async def after_episode(self, env: Environment, pool: Any, session: Any, reached: int, results: Sequence[str],
                            verdict: NativeVerdict | None) -> NativeVerdict | None:
        return await pool.verdict(session)
