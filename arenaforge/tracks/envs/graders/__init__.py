"""Imported suites' graders by `NativeCheck.kind`: each suite that `envs import` brings in grades its episodes
with its own object here; the episode loop asks `grader_for(env)` and never compares a suite's name.

Adding a suite's grading: a module with its `SuiteGrader` subclass plus one line in `GRADERS` (and its name in
`NativeCheck.kind`).
"""

from __future__ import annotations

from arenaforge.schemas.models import Environment
from arenaforge.tracks.envs.graders.base import SuiteGrader
from arenaforge.tracks.envs.graders.bfcl_multi_turn import BfclMultiTurnGrader
from arenaforge.tracks.envs.graders.harbor_tests import HarborTestsGrader
from arenaforge.tracks.envs.graders.state_hash import StateHashGrader

__all__ = ["GRADERS", "SuiteGrader", "grader_for"]

GRADERS: dict[str, SuiteGrader] = {g.kind: g for g in (StateHashGrader(), BfclMultiTurnGrader(), HarborTestsGrader())}
_NO_NATIVE_CHECK = SuiteGrader()


def grader_for(env: Environment) -> SuiteGrader:
    """The grader of the suite `env` was imported from; one that grades nothing for our own environments."""
    return _NO_NATIVE_CHECK if env.native is None else GRADERS[env.native.kind]
