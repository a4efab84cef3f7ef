"""Warm-start SFT data: gold calls replayed in a sandbox session, the same tokens a solving rollout produces."""

from __future__ import annotations

import json

from arenaforge.schemas.models import GoldCall, ToolObservation
from arenaforge.tracks.train.sft import encode, load_examples
from arenaforge.tracks.train.warmstart import warmstart_examples, write_jsonl
from tests.support.rl import solving_policy, tiny_env, tiny_model_path, with_pool


def _replayed(envs):
    """Warm-start examples of `envs`, their gold calls run in the real sandbox (process backend)."""

    return with_pool(lambda pool: warmstart_examples(pool, envs))


def test_conversation_replays_gold_calls_in_the_sandbox():
    env = tiny_env()
    examples, rejections = _replayed([env])
    assert rejections == [] and len(examples) == 1
    messages = examples[0]["messages"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]
    assert messages[1]["content"] == env.question
    call = messages[2]["tool_calls"][0]
    assert call["function"]["name"] == "get_capital"
    assert json.loads(call["function"]["arguments"]) == {"country": "Freedonia"}
    assert [messages[3]["content"], messages[5]["content"]] == ["Quaxton", "81234"]  # observations from running the code
    assert messages[-1]["content"] == "The answer is 81234."
    assert examples[0]["tools"] == [t.as_openai_tool() for t in env.tools]


def test_tokens_equal_a_solving_rollout(tmp_path):
    """Warm-start prompts are the rollout's prompts: the SFT sequence is the rollout's token sequence."""
    from transformers import AutoTokenizer

    from arenaforge.testing.scripted_policy import ScriptedEngine
    from arenaforge.tracks.train.params import EpisodeParams
    from arenaforge.tracks.train.rollout.episodes import run_episode

    tok = AutoTokenizer.from_pretrained(tiny_model_path())
    env = tiny_env()
    examples, _ = _replayed([env])
    path = write_jsonl(examples, tmp_path / "ws.jsonl")
    ids, mask = encode(tok, load_examples(path)[0], 4096)
    episode = with_pool(lambda pool: run_episode(ScriptedEngine(tok, solving_policy(env)), tok, pool, env,
                                                 EpisodeParams(max_turns=4).rollout_config()))
    rollout = episode.rollout
    assert rollout.reward.f1 == 1.0
    sequence = rollout.prompt_ids + rollout.response_ids
    assert ids[: len(sequence)] == sequence and tok.decode(ids[len(sequence):]) == "\n"
    # trained tokens are exactly the engine's tokens of the rollout
    assert mask[len(rollout.prompt_ids): len(sequence)] == rollout.response_mask


def test_envs_whose_gold_calls_fail_are_rejected():
    broken = tiny_env(country="Sylvania").model_copy(
        update={"calls": [GoldCall(tool="get_capital", arguments={"country": "Nowhere"})]})
    no_calls = tiny_env(country="Borduria").model_copy(update={"calls": []})
    examples, rejections = _replayed([tiny_env(), broken, no_calls])
    assert len(examples) == 1 and examples[0]["env_id"] == tiny_env().id
    assert sorted(r.reason for r in rejections) == ["gold_call_failed", "no_gold_calls"]


def test_independent_gold_calls_share_a_turn():
    """Parallel branches are issued together; a call that uses an earlier answer waits for the next turn."""
    from arenaforge.schemas.models import GoldCall
    from arenaforge.tracks.train.warmstart import call_waves, conversation

    env = tiny_env().model_copy(update={"calls": [
        GoldCall(tool="get_capital", arguments={"country": "Freedonia"}, answer="Quaxton"),
        GoldCall(tool="get_capital", arguments={"country": "Sylvania"}, answer="Ostia"),
        GoldCall(tool="get_population", arguments={"city": "Quaxton"}, answer="81234"),
        GoldCall(tool="get_population", arguments={"city": "Ostia"}, answer="5150")]})
    assert call_waves(env) == [[0, 1], [2, 3]]
    obs = [ToolObservation(outcome="ok", output=o) for o in ("Quaxton", "Ostia", "81234", "5150")]
    messages = conversation(env, obs)["messages"]
    assistant = [m for m in messages if m["role"] == "assistant"]
    assert [len(m.get("tool_calls", [])) for m in assistant] == [2, 2, 0]
    assert [m["tool_call_id"] for m in messages if m["role"] == "tool"] == ["call_0_0", "call_0_1", "call_1_0", "call_1_1"]
    assert assistant[-1]["content"] == "The answer is 81234, 5150."
