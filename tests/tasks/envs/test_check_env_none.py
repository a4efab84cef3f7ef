"""A gold call whose tool legitimately returns nothing (None, `no_output`) passes the environment checks, as it
passes `sandbox check`; a call that must return an answer and returns nothing still fails."""

from __future__ import annotations

import asyncio

from arenaforge.environments.runtime import create_pool
from arenaforge.schemas.models import GoldCall
from arenaforge.tasks.envs.check_env import check_environment
from tests.support.envs_fakes import sandbox_cfg
from tests.support.rl import CODE, tiny_env

NONE_CODE = CODE + '''
def set_motto(country, motto):
    """Record a country's motto; returns nothing."""
    DATA.setdefault("mottos", {})[country] = motto
'''


def _env(answer: str | None):
    env = tiny_env()
    tools = [*env.tools, env.tools[0].model_copy(update={
        "name": "set_motto", "description": "Record a country's motto; returns nothing.",
        "parameters": {"type": "object", "properties": {"country": {"type": "string"}, "motto": {"type": "string"}},
                       "required": ["country", "motto"]}})]
    calls = [*env.calls, GoldCall(tool="set_motto", arguments={"country": "Freedonia", "motto": "Hail"}, sub_qa=2,
                                  answer=answer)]
    return env.model_copy(update={"code": NONE_CODE, "tools": tools, "calls": calls, "id": None})


def test_none_is_a_valid_result_and_a_missing_answer_is_not():
    async def go():
        pool = await create_pool(sandbox_cfg(backend="process"))
        try:
            return (await check_environment(pool, _env(None), {}), await check_environment(pool, _env("Hail"), {}))
        finally:
            await pool.shutdown()

    declared_none, declared_answer = asyncio.run(go())
    assert declared_none.ok and declared_none.checks["gold_calls"], declared_none.details
    assert not declared_answer.checks["gold_calls"] and declared_answer.failing_tools == {"set_motto"}
    assert any("wrong_answer: set_motto" in d and "no_output" in d for d in declared_answer.details)
