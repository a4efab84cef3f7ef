"""Constrained decoding of tool calls (hf engine): a random untrained model only ever writes calls to the
environment's tools with their schema keys, as well-formed JSON, and records the constrained distribution's
log-probs."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from arenaforge.services.policy import SamplingParams, build_engine
from arenaforge.services.policy.constrained import (
    FREE,
    Ground,
    ToolCallConstraint,
    ToolSpec,
    after_open,
    ground_of,
    step,
)
from tests.support.rl import tiny_model_path

TOOLS = (ToolSpec("get_weather", ("city", "unit"), ("city",)), ToolSpec("lookup_user", ("user_id", "fields"), ()))
_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def _walk(text: str):
    state = after_open(TOOLS)
    for ch in text:
        state = step(state, ch)
        if state is None:
            return None
    return state


def test_the_automaton_takes_calls_to_known_tools_and_keys_only():
    good = '\n{"name": "get_weather", "arguments": {"city": "Pa\\"ris", "unit": [1, {"a": -2.5e3}, true, null]}}\n'
    assert _walk(good) == ("special", "</tool_call>", FREE)
    assert _walk('\n{"name": "get_wea') is not None
    assert _walk('\n{"name": "send_mail"') is None  # not a tool of this environment
    assert _walk('\n{"name": "get_weather", "arguments": {"country": ') is None  # not one of its keys
    assert _walk('\n{"name": "get_weather", "arguments": {}') is None  # `city` is required
    assert _walk('\n{"name": "get_weather", "arguments": {"city": 01') is None  # not JSON
    assert _walk('\n{"name": "lookup_user", "arguments": {}}\n') == ("special", "</tool_call>", FREE)


@pytest.fixture(scope="module")
def engine():
    engine = build_engine("hf", model_path=tiny_model_path())
    tok = engine.tokenizer
    boost = [i for i in range(len(tok)) if '"' in tok.decode([i]) or "}" in tok.decode([i])]
    call_open = tok.convert_tokens_to_ids("<tool_call>")

    def nudge(module, args, out):  # an untrained model rarely opens a call or ends a string: nudge it to
        out[..., call_open] += 12.0
        out[..., boost] += 4.0
        return out

    engine.model.lm_head.register_forward_hook(nudge)
    return engine


def test_random_model_only_calls_known_tools_with_schema_keys(engine):
    tok = engine.tokenizer
    prompt = tok.encode("<|im_start|>user\nweather?<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)

    async def sample():
        return await asyncio.gather(*(engine.generate(prompt, SamplingParams(max_tokens=160, seed=s, tools=TOOLS))
                                      for s in range(8)))

    gens = asyncio.run(sample())
    calls = [json.loads(body) for g in gens for body in _CALL.findall(tok.decode(g.token_ids, skip_special_tokens=False))]
    assert len(calls) >= 4
    specs = {t.name: t for t in TOOLS}
    for call in calls:
        spec = specs[call["name"]]
        assert set(call["arguments"]) <= set(spec.keys) and set(spec.required) <= set(call["arguments"])


def test_recorded_logprobs_are_the_constrained_distributions(engine):
    import torch

    tok = engine.tokenizer
    prompt = tok.encode("<|im_start|>user\nwho?<|im_end|>\n<|im_start|>assistant\n", add_special_tokens=False)
    gen = asyncio.run(engine.generate(prompt, SamplingParams(max_tokens=48, seed=5, tools=TOOLS)))
    with torch.no_grad():
        logits = engine.model(torch.tensor([prompt + gen.token_ids])).logits[0, len(prompt) - 1 : -1].float()
    constraint = ToolCallConstraint(tok, logits.shape[-1])
    ground = ground_of(tok, prompt)  # grounded arguments are on by default: replay them too
    state, expected = FREE, []
    for row, token in zip(logits, gen.token_ids, strict=True):
        masked = row.masked_fill(~constraint.mask(state, TOOLS), float("-inf"))
        expected.append(float(torch.log_softmax(masked, -1)[token]))
        state = constraint.advance(state, token, TOOLS, ground)
    unconstrained = torch.log_softmax(logits, -1).gather(-1, torch.tensor(gen.token_ids)[:, None]).squeeze(-1)
    assert torch.allclose(torch.tensor(gen.logprobs), torch.tensor(expected), atol=1e-4)
    assert not torch.allclose(torch.tensor(gen.logprobs), unconstrained, atol=1e-4)  # the mask did matter


# --- grounded arguments: top-level values copied from the context ------------------------------------------------

ORDER = (ToolSpec("get_order", ("order_id", "qty"), ("order_id",)),)
CONTEXT = "user\nWhere is order OR5031? I bought 3 Wireless Mouse on 2024-05-01 for 24.99.\nassistant\n"


def _call(value: str, ground, qty: str | None = None):
    args = f'"order_id": {value}' + (f", \"qty\": {qty}" if qty is not None else "")
    state = after_open(ORDER, ground)
    for ch in f'\n{{"name": "get_order", "arguments": {{{args}}}}}\n':
        state = step(state, ch)
        if state is None:
            return None
    return state


def test_grounded_strings_are_word_bounded_spans_of_the_context():
    ground = Ground(CONTEXT)
    end = ("special", "</tool_call>", FREE)
    for value in ('"OR5031"', '"Wireless Mouse"', '"2024-05-01"', '"24.99"', '"Where is order OR5031?"'):
        assert _call(value, ground) == end, value
    for value in ('"OR5000"', '"OR503"', '"R5031"', '"Mouse o"', '""', '"Wireless Mouse on 2024-05-01 f"'):
        assert _call(value, ground) is None, value  # not in the context, or cuts a word
    assert _call('"anything at all"', None) == end  # without a ground values stay free


def test_grounded_numbers_are_numbers_of_the_context_and_literals_stay_free():
    ground = Ground(CONTEXT)
    end = ("special", "</tool_call>", FREE)
    for qty in ("3", "24.99", "2024", "true", "null", '[1, "x"]'):
        assert _call('"OR5031"', ground, qty) == end, qty
    for qty in ("5", "24", "-3", "5031", "24.9"):  # 5031 is part of the word OR5031, 24.9 cuts 24.99
        assert _call('"OR5031"', ground, qty) is None, qty


def test_a_context_without_candidates_leaves_values_free():
    ground = Ground("   \n\n")  # no span, no number: grounding must not dead-end
    assert ground.starts == frozenset() and ground.numbers == frozenset()
    assert _call('"OR5000"', ground, "17") == ("special", "</tool_call>", FREE)


def test_a_multi_token_id_is_copied_across_token_boundaries_with_the_real_tokenizer():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(tiny_model_path())
    prompt = tok.encode(f"<|im_start|>{CONTEXT}", add_special_tokens=False)
    ground = ground_of(tok, prompt)
    constraint = ToolCallConstraint(tok, len(tok))
    state = constraint.advance(FREE, tok.convert_tokens_to_ids("<tool_call>"), ORDER, ground)
    for token in tok.encode('\n{"name": "get_order", "arguments": {"order_id": ', add_special_tokens=False):
        state = constraint.advance(state, token, ORDER)
    value = tok.encode('"OR5031"}}\n', add_special_tokens=False)
    assert len([t for t in value if any(c in "OR5031" for c in tok.decode([t]))]) >= 3  # the id spans tokens
    for token in value:  # every token of the copied id is allowed by the mask of the state it is sampled in
        assert constraint.mask(state, ORDER)[token], tok.decode([token])
        state = constraint.advance(state, token, ORDER)
    assert state == ("special", "</tool_call>", FREE)
    # a memorised id is cut off where it leaves the context: after `"OR50`, `0` is masked, `3` is not
    state = constraint.advance(FREE, tok.convert_tokens_to_ids("<tool_call>"), ORDER, ground)
    for token in tok.encode('\n{"name": "get_order", "arguments": {"order_id": "OR50', add_special_tokens=False):
        state = constraint.advance(state, token, ORDER)
    allowed = constraint.mask(state, ORDER)
    assert allowed[tok.convert_tokens_to_ids("3")] and not allowed[tok.convert_tokens_to_ids("0")]


def test_grounded_episode_copies_the_id_from_the_question():
    """A policy that has memorised a call with `OR5000` (its logits pushed towards that text) calls the tool with
    the question's `OR5031` under grounded decoding, and with its memorised id without it."""
    from arenaforge.tracks.train.params import EpisodeParams
    from arenaforge.tracks.train.rollout.episodes import parse_tool_calls, run_episode
    from tests.support.rl import call_text, tiny_env, with_pool

    engine = build_engine("hf", model_path=tiny_model_path())
    engine.prefix_store = None  # the hook tells a prompt's pass by its width: a stored prompt's pass is one token wide
    tok = engine.tokenizer
    env = tiny_env(country="OR5031")  # "How many people live in the capital of OR5031?"
    memorised = tok.encode(call_text("get_capital", country="OR5000") + "<|im_end|>", add_special_tokens=False)
    quotes = [i for i in range(len(tok)) if tok.decode([i]).startswith('"')]
    im_end = tok.convert_tokens_to_ids("<|im_end|>")
    written: list[int] = []

    def nudge(module, args, kwargs, out):  # follow the memorised tokens while on them; else close strings, stop
        ids = kwargs["input_ids"]
        if ids.shape[1] > 1:
            written.clear()  # a new prompt
        else:
            written.append(int(ids[0, 0]))
        out.logits[..., quotes] += 5.0
        out.logits[..., im_end] += 8.0
        if written == memorised[: len(written)] and len(written) < len(memorised):
            out.logits[..., memorised[len(written)]] += 30.0
        return out

    engine.model.register_forward_hook(nudge, with_kwargs=True)

    def first_call(ground: bool):
        cfg = EpisodeParams(max_turns=1, max_tokens_per_turn=48, temperature=0.0, ground_arguments=ground).rollout_config()
        episode = with_pool(lambda pool: run_episode(engine, tok, pool, env, cfg))
        r = episode.rollout
        text = tok.decode([t for t, m in zip(r.response_ids, r.response_mask) if m], skip_special_tokens=False)
        return parse_tool_calls(text, ["get_capital", "get_population"])[0], r

    call, rollout = first_call(ground=True)
    assert (call.name, call.arguments, call.error) == ("get_capital", {"country": "OR5031"}, None)
    assert rollout.reward.recall > 0  # the call reached the environment and returned the capital
    free_call, _ = first_call(ground=False)
    assert free_call.arguments == {"country": "OR5000"}
