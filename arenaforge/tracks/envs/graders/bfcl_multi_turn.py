"""BFCL multi-turn (`envs import bfcl`): the suite's user turns, tools revealed at their turn, and BFCL's checks
after every turn (`environments.native.bfcl_turn_verdict`); the first failing turn decides."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from arenaforge.environments.native import NativeVerdict, bfcl_turn_verdict
from arenaforge.schemas.models import Environment
from arenaforge.tracks.envs.graders.base import SuiteGrader

ADDED_TOOLS_PROMPT = "I have updated some more functions you can choose from. What about now?"  # BFCL's words


class BfclMultiTurnGrader(SuiteGrader):
    kind = "bfcl_multi_turn"

    def user_turns(self, env: Environment) -> list[str]:
        """The suite's turns (a turn with no message that reveals tools says so, as BFCL does)."""
        assert env.native is not None
        if not env.native.turns:
            return super().user_turns(env)
        out = []
        for index, turn in enumerate(env.native.turns):
            text = "\n".join(str(m.get("content", "")) for m in turn.get("messages", []) if m.get("role") == "user")
            revealed = [t for t in env.tools if env.tool_turns.get(t.name) == index and index > 0]
            if revealed:
                docs = json.dumps([t.as_openai_tool() for t in revealed], ensure_ascii=False)
                text = f"{text}\n\n{ADDED_TOOLS_PROMPT}\n{docs}".strip() if text else f"{ADDED_TOOLS_PROMPT}\n{docs}"
            out.append(text)
        return out

    async def after_turn(self, env: Environment, pool: Any, session: Any, turn: int, turn_results: Sequence[str],
                         results: Sequence[str], verdict: NativeVerdict | None) -> NativeVerdict | None:
        assert env.native is not None
        if verdict is None or verdict.passed:
            verdict = bfcl_turn_verdict(env.native, turn, await pool.state(session), turn_results, results)
        return verdict

    async def after_episode(self, env: Environment, pool: Any, session: Any, reached: int, results: Sequence[str],
                            verdict: NativeVerdict | None) -> NativeVerdict | None:
        assert env.native is not None
        for later in range(reached + 1, len(self.user_turns(env))):  # turns the budget never reached: no response
            if verdict is None or verdict.passed:
                verdict = bfcl_turn_verdict(env.native, later, None, [], results)
        return verdict
