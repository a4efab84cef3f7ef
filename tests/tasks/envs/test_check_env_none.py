"""A gold call whose tool legitimately returns nothing (None, `no_output`) passes the environment checks, as it
passes `sandbox check`; a call that must return an answer and returns nothing still fails."""

from __future__ import annotations

import asyncio

from arenaforge.environments.runtime import create_pool
from arenaforge.schemas.models import GoldCall
from arenaforge.tracks.envs.check_env import check_environment
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


TICKET_CODE = '''
DATA = {}

def next_ticket():
    """The next ticket number; each call takes one."""
    DATA["counter"] += 1
    return DATA["counter"]
'''


def test_self_test_shares_a_session_only_while_the_state_is_unchanged():
    """A read-only replay leaves the random calls its session (one open); a replay that changed the state gets them
    a fresh one, so they score as in a fresh session: here the random call repeats the gold call and earns 1.0."""
    from arenaforge.schemas.models import Environment, FunctionDoc
    from arenaforge.tracks.envs.check_env import self_test

    ticket = Environment(name="tickets", tools=[FunctionDoc(name="next_ticket", description="The next ticket number.",
                                                            parameters={"type": "object", "properties": {}})],
                         code=TICKET_CODE, style="functions", data_var="DATA", initial_state={"counter": 0},
                         calls=[GoldCall(tool="next_ticket", arguments={}, sub_qa=1, answer="1")], gold_answers=["1"],
                         question="Which ticket do I get?")

    async def go():
        pool = await create_pool(sandbox_cfg(backend="process"))
        opened: list[str] = []
        real_open = pool.open

        async def counting_open(env):
            opened.append(env.name)
            return await real_open(env)

        pool.open = counting_open
        try:
            return await self_test(pool, tiny_env()), await self_test(pool, ticket), opened
        finally:
            await pool.shutdown()

    (read_only, details), (mutating, _), opened = asyncio.run(go())
    assert all(read_only.values()), details
    assert mutating == {"self_test_gold_f1": True, "self_test_no_calls_f1": True, "self_test_random_f1": False}
    assert opened == ["capital-population-freedonia", "tickets", "tickets"]
