"""Constrained decoding of tool calls (hf engine): a random untrained model only ever writes calls to the
environment's tools with their schema keys, as well-formed JSON, and records the constrained distribution's
log-probs."""

from __future__ import annotations

import asyncio
import json
import re

import pytest

from arenaforge.tasks.policy import SamplingParams, build_engine
from arenaforge.tasks.policy.constrained import FREE, ToolCallConstraint, ToolSpec, after_open, step
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
    state, expected = FREE, []
    for row, token in zip(logits, gen.token_ids, strict=True):
        masked = row.masked_fill(~constraint.mask(state, TOOLS), float("-inf"))
        expected.append(float(torch.log_softmax(masked, -1)[token]))
        state = constraint.advance(state, token, TOOLS)
    unconstrained = torch.log_softmax(logits, -1).gather(-1, torch.tensor(gen.token_ids)[:, None]).squeeze(-1)
    assert torch.allclose(torch.tensor(gen.logprobs), torch.tensor(expected), atol=1e-4)
    assert not torch.allclose(torch.tensor(gen.logprobs), unconstrained, atol=1e-4)  # the mask did matter
