"""The warm pool on both backends: state, isolation, outcomes, both tool-code shapes, run_calls."""

from __future__ import annotations

import asyncio
import json

import pytest

from arenaforge.environments.runtime import EnvLoadError, run_calls
from arenaforge.schemas.errors import SandboxError
from arenaforge.schemas.models import Environment, FunctionDoc
from tests.environments.conftest import PoolHandle
from tests.environments.toolsets import message_api_env, retail_class_env, retail_functions_env


async def _calls(h: PoolHandle, env: Environment, calls: list[tuple[str, dict]]) -> list:
    return await run_calls(h.pool, env, calls)


def test_state_persists_within_a_session_and_never_leaks(sandbox: PoolHandle) -> None:
    pool = sandbox.pool

    async def scenario() -> tuple[list, list]:
        env = retail_functions_env()
        one, two = await pool.open(env), await pool.open(env)
        a = [
            await pool.call(one, "cancel_pending_order", {"order_id": "W1001", "reason": "changed mind"}),
            await pool.call(one, "get_order_details", {"order_id": "W1001"}),
            await pool.call(one, "get_user_balance", {"user_id": "u1"}),
        ]
        b = [
            await pool.call(two, "get_order_details", {"order_id": "W1001"}),
            await pool.call(two, "get_user_balance", {"user_id": "u1"}),
        ]
        await pool.close(one)
        await pool.close(two)
        return a, b

    a, b = sandbox.run(scenario())
    assert [o.outcome for o in a + b] == ["ok"] * 5
    assert json.loads(a[0].output)["status"] == "cancelled"
    assert json.loads(a[1].output)["status"] == "cancelled"
    assert a[2].output == "112.5"
    assert json.loads(b[0].output)["status"] == "pending"  # the other session starts from the initial state
    assert b[1].output == "100.0"


def test_class_with_state_constructor(sandbox: PoolHandle) -> None:
    obs = sandbox.run(
        _calls(
            sandbox,
            retail_class_env(),
            [
                ("cancel_pending_order", {"order_id": "W1001", "reason": "x"}),
                ("get_user_balance", {"user_id": "u1"}),
                ("_audit", {}),
            ],
        )
    )
    assert (obs[0].outcome, obs[0].output) == ("ok", "cancelled")
    assert (obs[1].outcome, obs[1].output) == ("ok", "112.5")
    assert obs[2].outcome == "error" and "unknown tool '_audit'" in (obs[2].error or "")


def test_bfcl_style_class_loaded_by_scenario(sandbox: PoolHandle) -> None:
    obs = sandbox.run(
        _calls(
            sandbox,
            message_api_env(),
            [
                ("send_message", {"receiver_id": "USR002", "message": "too early"}),
                ("message_login", {"user_id": "USR001"}),
                ("send_message", {"receiver_id": "USR002", "message": "hello bob"}),
                ("view_messages_sent", {}),
            ],
        )
    )
    assert json.loads(obs[0].output) == {"error": "No user is currently logged in."}
    assert json.loads(obs[1].output)["login_status"] is True
    assert json.loads(obs[2].output) == {"sent_status": True, "message_count": 2}  # the scenario's inbox had 1
    assert json.loads(obs[3].output) == {"messages": ["hello bob"]}


def test_outcomes_error_no_output_and_bad_calls(sandbox: PoolHandle) -> None:
    obs = sandbox.run(
        _calls(
            sandbox,
            retail_functions_env(),
            [
                ("get_order_details", {"order_id": "nope"}),
                ("noop", {}),
                ("log_note", {"note": "printed"}),
                ("no_such_tool", {}),
                ("get_order_details", {"wrong": 1}),
            ],
        )
    )
    assert [o.outcome for o in obs] == ["error", "no_output", "ok", "error", "error"]
    assert obs[0].text() == "Error: order nope not found"  # what agent harnesses show: the message
    assert 'File "tools.py", line' in (obs[0].traceback or "")  # the traceback into the tool code, kept aside
    assert "ValueError: order nope not found" in (obs[0].traceback or "")
    assert "execution.py" not in (obs[0].traceback or "")
    assert obs[1].text() == "(no output)"
    assert obs[2].output == "note: printed\n"
    assert "unknown tool 'no_such_tool'" in (obs[3].error or "")
    assert "TypeError" in (obs[4].traceback or "") and "unexpected keyword argument 'wrong'" in (obs[4].error or "")


def test_run_calls_reproduces_gold_answers(sandbox: PoolHandle) -> None:
    env = retail_functions_env()
    obs = sandbox.run(run_calls(sandbox.pool, env, env.calls))
    assert [o.outcome for o in obs] == ["ok", "ok"]
    assert json.loads(obs[0].output)["status"] == env.gold_answers[0]
    assert obs[1].output == env.gold_answers[1]


@pytest.mark.parametrize(
    "code,needle",
    [
        ("def f(:\n    pass\n", "SyntaxError"),
        ("import numpy_that_is_not_here\ndef f():\n    return 1\n", "ModuleNotFoundError"),
        ("raise RuntimeError('boom at import')\n", "boom at import"),
    ],
)
def test_code_that_does_not_load_raises_env_load_error(sandbox: PoolHandle, code: str, needle: str) -> None:
    env = Environment(name="broken", tools=[FunctionDoc(name="f")], code=code)
    with pytest.raises(EnvLoadError) as err:
        sandbox.run(sandbox.pool.open(env))
    assert needle in err.value.detail


def test_missing_class_is_a_load_error(sandbox: PoolHandle) -> None:
    env = Environment(name="noclass", tools=[FunctionDoc(name="f")], code="x = 1\n", style="class", class_name="Missing")
    with pytest.raises(EnvLoadError, match="class 'Missing' is not defined"):
        sandbox.run(sandbox.pool.open(env))


def test_closed_session_refuses_calls(sandbox: PoolHandle) -> None:
    async def scenario() -> None:
        session = await sandbox.pool.open(retail_functions_env())
        await sandbox.pool.close(session)
        await sandbox.pool.call(session, "noop", {})

    with pytest.raises(SandboxError, match="closed"):
        sandbox.run(scenario())


def test_many_sessions_in_parallel_stay_isolated(sandbox: PoolHandle) -> None:
    pool = sandbox.pool

    async def one(i: int) -> tuple[str, str]:
        session = await pool.open(message_api_env())
        await pool.call(session, "message_login", {"user_id": "USR001"})
        await pool.call(session, "send_message", {"receiver_id": "USR002", "message": f"m{i}"})
        seen = await pool.call(session, "view_messages_sent", {})
        await pool.close(session)
        return f"m{i}", seen.output

    async def all_of_them() -> list[tuple[str, str]]:
        return await asyncio.gather(*(one(i) for i in range(40)))

    results = sandbox.run(all_of_them())
    for mine, seen in results:
        assert json.loads(seen) == {"messages": [mine]}


def test_a_shared_load_failure_whose_waiter_gave_up_is_not_logged_as_never_retrieved():
    """A zygote load is one future shared by every session waiting on it (`WorkerPool._load`), read through
    `asyncio.shield`. When the only waiter's own deadline cancelled it first, nobody read the failure and asyncio
    logged "Future exception was never retrieved" under load; the future now marks its failure read itself."""
    import gc

    from arenaforge.environments.runtime.workers import _retrieved
    from arenaforge.environments.runtime.errors import Overloaded

    def run(mark: bool) -> list[str]:
        logged: list[str] = []
        loop = asyncio.new_event_loop()
        loop.set_exception_handler(lambda _loop, context: logged.append(context["message"]))

        async def main() -> None:
            ready = loop.create_future()
            if mark:
                ready.add_done_callback(_retrieved)
            waiter = asyncio.ensure_future(asyncio.shield(ready))
            await asyncio.sleep(0)
            waiter.cancel()  # the session's open deadline passed first
            await asyncio.gather(waiter, return_exceptions=True)
            ready.set_exception(Overloaded("worker-0 loaded nothing in 60 s"))
            await asyncio.sleep(0)

        loop.run_until_complete(main())
        loop.close()
        gc.collect()
        return logged

    assert run(mark=False) == ["Future exception was never retrieved"]  # the log this guards against, reproduced
    assert run(mark=True) == []
