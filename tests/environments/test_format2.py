"""Package format 2 (issue 15): several namespaces, constructor and loader arguments, a harness-only state snapshot,
per-turn tool visibility; and format-1 packages written before format 2 existed read, keep their id and run."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path

import pytest

from arenaforge.environments.package import read_package, write_package
from arenaforge.environments.runtime import replay, run_calls
from arenaforge.schemas.models import Environment, FunctionDoc, ToolModule
from tests.environments.conftest import PoolHandle

# Two BFCL-style classes: each declares its own module global DEFAULT_STATE, which in one namespace collide.
COUNTER = '''\
import copy
DEFAULT_STATE = {"count": 0, "step": 1}


class CounterAPI:
    def __init__(self, step=1):
        self.count = 0
        self.step = step
        self._secret = "hidden"

    def _load_scenario(self, scenario, long_context=False):
        state = copy.deepcopy(DEFAULT_STATE)
        state.update(scenario)
        self.count = state["count"]
        self.long_context = long_context

    def bump(self):
        self.count += self.step
        return self.count

    def reset_counter(self):
        self.count = 0
'''
NOTES = '''\
DEFAULT_STATE = {"notes": ["from-defaults"]}


class NotesAPI:
    def __init__(self):
        self.notes = list(DEFAULT_STATE["notes"])

    def load_state(self, scenario):
        self.notes = list(scenario.get("notes", DEFAULT_STATE["notes"]))

    def add_note(self, text: str):
        self.notes.append(text)
        return len(self.notes)

    def defaults_seen(self):
        return DEFAULT_STATE
'''


def two_class_env() -> Environment:
    return Environment(
        name="two-classes",
        tools=[FunctionDoc(name=n) for n in ("bump", "reset_counter", "add_note", "defaults_seen")],
        code="",
        modules=[
            ToolModule(name="counter", code=COUNTER, class_name="CounterAPI", init_args={"step": 5},
                       load_args={"long_context": True}, state_key="CounterAPI"),
            ToolModule(name="notes", code=NOTES, class_name="NotesAPI", state_key="NotesAPI"),
        ],
        initial_state={"CounterAPI": {"count": 10}, "NotesAPI": {"notes": ["a"]}},
        tool_turns={"add_note": 1},
    )


def test_format_1_package_written_before_format_2_reads_keeps_its_id_and_runs(sandbox: PoolHandle) -> None:
    old = Path(str(resources.files("tests.environments") / "data" / "format1_message_api"))
    env = read_package(old)
    assert env.id == json.loads((old / "env.json").read_text())["id"] == "env-d46c7c6ee70476f937b02616c889aee0"
    assert env.format_version == 1 and env.modules == [] and env.tool_turns == {}
    obs = sandbox.run(run_calls(sandbox.pool, env, [("message_login", {"user_id": "USR001"}),
                                                    ("send_message", {"receiver_id": "USR002", "message": "yo"}),
                                                    ("view_messages_sent", {})]))
    assert [o.outcome for o in obs] == ["ok", "ok", "ok"] and json.loads(obs[2].output) == {"messages": ["yo"]}


def test_format_1_package_on_disk_is_unchanged(tmp_path: Path) -> None:
    old = Path(str(resources.files("tests.environments") / "data" / "format1_message_api"))
    write_package(read_package(old), tmp_path / "again")
    assert sorted(p.name for p in (tmp_path / "again").iterdir()) == sorted(p.name for p in old.iterdir())
    for name in ("env.json", "tools.json", "tools.py", "initial_state.json"):
        assert (tmp_path / "again" / name).read_text() == (old / name).read_text()


def test_format_2_round_trips_on_disk(tmp_path: Path) -> None:
    env = two_class_env()
    write_package(env, tmp_path / "pkg")
    assert (tmp_path / "pkg" / "modules" / "counter.py").read_text() == COUNTER
    assert not (tmp_path / "pkg" / "tools.py").exists()
    assert "code" not in json.loads((tmp_path / "pkg" / "env.json").read_text())["modules"][0]
    again = read_package(tmp_path / "pkg")
    assert again == env and again.format_version == 2


def test_each_module_has_its_own_namespace_arguments_and_state(sandbox: PoolHandle) -> None:
    env = two_class_env()
    obs, state = sandbox.run(replay(sandbox.pool, env, [("bump", {}), ("add_note", {"text": "b"}), ("defaults_seen", {})]))
    assert [o.output for o in obs[:2]] == ["15", "2"]  # step 5 from init_args; the notes module's own state
    assert json.loads(obs[2].output) == {"notes": ["from-defaults"]}  # its own DEFAULT_STATE, not the counter's
    assert state == {"counter": {"count": 15, "step": 5, "long_context": True}, "notes": {"notes": ["a", "b"]}}


def test_state_is_the_harness_s_and_tools_appear_at_their_turn(sandbox: PoolHandle) -> None:
    env = two_class_env()

    async def scenario() -> tuple:
        session = await sandbox.pool.open(env)
        try:
            probe = await sandbox.pool.call(session, "__state__", {})
            hidden = await sandbox.pool.call(session, "add_note", {"text": "early"})
            none = await sandbox.pool.call(session, "reset_counter", {})
            before = await sandbox.pool.state(session)
            session.turn = 1
            shown = await sandbox.pool.call(session, "add_note", {"text": "late"})
            return probe, hidden, none, before, shown, await sandbox.pool.state(session), session.calls
        finally:
            await sandbox.pool.close(session)

    probe, hidden, none, before, shown, after, calls = sandbox.run(scenario())
    assert probe.outcome == "error" and "unknown tool '__state__'" in (probe.error or "")
    assert hidden.outcome == "error" and "unknown tool 'add_note'" in (hidden.error or "") and "add_note" not in hidden.error.split(":", 1)[1]
    assert none.outcome == "no_output" and before["counter"]["count"] == 0 and before["notes"]["notes"] == ["a"]
    assert shown.output == "2" and after["notes"]["notes"] == ["a", "late"]
    assert calls == 2  # reset_counter and add_note ran; hidden tools, the refused probe and state reads are no calls
    assert [t.name for t in env.visible_tools(0)] == ["bump", "reset_counter", "defaults_seen"]


def test_state_of_a_format_1_class_and_functions_env(sandbox: PoolHandle) -> None:
    from tests.environments.toolsets import message_api_env, retail_functions_env

    _, message = sandbox.run(replay(sandbox.pool, message_api_env(), [("message_login", {"user_id": "USR001"})]))
    assert message == {"current_user": "USR001", "inbox": [{"sender": "USR002", "receiver": "USR001", "message": "hi"}],
                       "user_map": {"alice": "USR001", "bob": "USR002"}}  # _api_description is private: left out
    retail = retail_functions_env()
    _, db = sandbox.run(replay(sandbox.pool, retail, [("cancel_pending_order", {"order_id": "W1001", "reason": "x"})]))
    assert (db["orders"]["W1001"]["status"], retail.initial_state["orders"]["W1001"]["status"]) == ("cancelled", "pending")


def test_tool_turns_must_name_tools() -> None:
    with pytest.raises(ValueError, match="tool_turns names tools that are not in tools"):
        Environment(name="x", tools=[FunctionDoc(name="a")], code="def a():\n    return 1\n", tool_turns={"b": 1})
