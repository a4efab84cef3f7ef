"""What an imported suite's grader answers (`SuiteGrader`); the defaults are an environment with no native check:
one user turn, the question, and no verdict."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar

from arenaforge.environments.native import NativeVerdict
from arenaforge.schemas.models import Environment

DEFAULT_QUESTION = "Answer the question using the tools."


class SuiteGrader:
    """An imported suite's own scoring of an episode, beside our F1 (`Environment.native`), as verifiers injects a
    rubric into an environment: the episode loop asks it for the user's turns and, after each turn and at the end,
    for its verdict (the session is still open: `pool.state(session)`, or `pool.verdict(session)` for a container)."""

    kind: ClassVar[str] = ""  # the `NativeCheck.kind` it grades

    def user_turns(self, env: Environment) -> list[str]:
        """The user's messages, one per user turn."""
        return [env.question or DEFAULT_QUESTION]

    async def after_turn(self, env: Environment, pool: Any, session: Any, turn: int, turn_results: Sequence[str],
                         results: Sequence[str], verdict: NativeVerdict | None) -> NativeVerdict | None:
        """The verdict after user turn `turn` (`turn_results`: its calls' results; `results`: every turn's so far)."""
        return verdict

    async def after_episode(self, env: Environment, pool: Any, session: Any, reached: int, results: Sequence[str],
                            verdict: NativeVerdict | None) -> NativeVerdict | None:
        """The episode's verdict, once its last reached user turn (`reached`) is over."""
        return verdict
