"""Copy-forcing warm-start data: every concrete value renamed consistently, tools shuffled, the rollout's format kept."""

from __future__ import annotations

import json
import re

from arenaforge.schemas.models import FunctionDoc, ToolObservation
from arenaforge.tracks.train.copy_forcing import copy_forced_variants
from arenaforge.tracks.train.warmstart import conversation
from tests.support.rl import solving_policy, tiny_env, tiny_model_path, with_pool

DISTRACTOR = FunctionDoc(name="get_mayor", description="Mayor of a city.",
                         parameters={"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})


def _env():
    env = tiny_env()
    return env.model_copy(update={"tools": [*env.tools, DISTRACTOR], "distractors": ["get_mayor"]})


def _replay(env):
    observations = [ToolObservation(outcome="ok", output=c.answer) for c in env.calls]
    return conversation(env, observations)


def _values(example):
    """(country argument, capital observation, city argument, population observation, final answer)."""
    messages = example["messages"]
    calls = [json.loads(c["function"]["arguments"]) for m in messages for c in m.get("tool_calls", [])]
    tools = [m["content"] for m in messages if m["role"] == "tool"]
    return calls[0]["country"], tools[0], calls[1]["city"], tools[1], messages[-1]["content"]


def test_values_are_renamed_consistently_in_every_message():
    example = _replay(_env())
    variants = copy_forced_variants(example, 4, seed=7)
    assert len(variants) == 4
    for variant in variants:
        country, capital, city, population, answer = _values(variant)
        assert city == capital and answer == f"The answer is {population}."  # a call copies an observation
        question = variant["messages"][1]["content"]
        assert question == f"How many people live in the capital of {country}?"  # the call copies the question
        text = json.dumps([m for m in variant["messages"] if m["role"] != "system"])
        assert not re.search(r"Freedonia|Quaxton|81234", text)  # no original value survives
        # same shape: a word of the same length and case, digits of the same length
        assert re.fullmatch(r"[A-Z][a-z]{8}", country) and re.fullmatch(r"[A-Z][a-z]{6}", capital)
        assert re.fullmatch(r"[1-9][0-9]{4}", population)
        assert variant["messages"][0] == example["messages"][0]  # the system prompt is untouched
        assert sorted(json.dumps(t) for t in variant["tools"]) == sorted(json.dumps(t) for t in example["tools"])
    assert len({_values(v) for v in variants}) == 4  # fresh values per variant
    assert len({tuple(t["function"]["name"] for t in v["tools"]) for v in variants}) > 1  # the tool list is shuffled


def test_variants_are_a_pure_seeded_function_of_the_replay():
    example = _replay(_env())
    assert copy_forced_variants(example, 3, seed=1) == copy_forced_variants(example, 3, seed=1)
    assert copy_forced_variants(example, 3, seed=1) != copy_forced_variants(example, 3, seed=2)
    assert example == _replay(_env())  # the replay itself is not changed
    assert copy_forced_variants(example, 0) == []


def test_json_observations_rename_leaves_not_keys_and_ids_keep_their_prefix():
    env = tiny_env()
    record = {"city": "Quaxton", "store_id": "ST104", "price": 12.5}
    observations = [ToolObservation(outcome="ok", output=json.dumps(record)), ToolObservation(outcome="ok", output="81234")]
    variant = copy_forced_variants(conversation(env, observations), 1, seed=0)[0]
    observed = json.loads(next(m["content"] for m in variant["messages"] if m["role"] == "tool"))
    assert sorted(observed) == ["city", "price", "store_id"]
    assert observed["city"] != "Quaxton" and observed["store_id"] != "ST104"
    assert re.fullmatch(r"ST\d{3}", observed["store_id"])
    assert isinstance(observed["price"], float) and re.fullmatch(r"\d\d\.\d", str(observed["price"]))
    calls = [json.loads(c["function"]["arguments"]) for m in variant["messages"] for c in m.get("tool_calls", [])]
    assert calls[1]["city"] == observed["city"]


def test_a_variant_is_the_replay_of_the_renamed_environment_token_for_token():
    """The variant tokenizes exactly as a solving rollout in an environment that holds its fresh values."""
    from transformers import AutoTokenizer

    from arenaforge.testing.scripted_policy import ScriptedEngine
    from arenaforge.tracks.train.params import EpisodeParams
    from arenaforge.tracks.train.rollout.episodes import run_episode
    from arenaforge.tracks.train.sft import encode

    tok = AutoTokenizer.from_pretrained(tiny_model_path())
    env = _env()
    variant = copy_forced_variants(_replay(env), 1, seed=3)[0]
    country, capital, _, population, _ = _values(variant)
    order = [t["function"]["name"] for t in variant["tools"]]
    renamed = tiny_env(country=country, capital=capital, population=int(population))
    renamed = renamed.model_copy(update={"tools": sorted([*renamed.tools, DISTRACTOR], key=lambda t: order.index(t.name)),
                                         "distractors": ["get_mayor"]})
    ids, mask = encode(tok, variant, 4096)
    episode = with_pool(lambda pool: run_episode(ScriptedEngine(tok, solving_policy(renamed)), tok, pool, renamed,
                                                 EpisodeParams(max_turns=4).rollout_config()))
    rollout = episode.rollout
    assert rollout.reward.f1 == 1.0
    sequence = rollout.prompt_ids + rollout.response_ids
    assert ids[: len(sequence)] == sequence and tok.decode(ids[len(sequence):]) == "\n"
    assert mask[len(rollout.prompt_ids): len(sequence)] == rollout.response_mask
