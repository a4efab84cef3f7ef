"""Policy engines: the vLLM HTTP client against a scripted vLLM server, the hf engine, the factory."""

from __future__ import annotations

import asyncio

import pytest

from arenaforge.schemas.errors import ConfigError, ProviderError
from arenaforge.services.policy import SamplingParams, build_engine
from arenaforge.services.policy.vllm_http import VllmHttpEngine
from arenaforge.tracks.train.params import EpisodeParams
from arenaforge.tracks.train.rollout.episodes import run_episode
from tests.support.rl import solving_policy, tiny_env, tiny_model_path, with_pool
from tests.support.scripted_vllm import ScriptedVllm, text_responder


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path())


@pytest.mark.parametrize("legacy", [False, True])
def test_vllm_client_sends_token_ids_and_reads_ids_and_logprobs(legacy):
    server = ScriptedVllm(lambda prompt, body: [p + 1 for p in prompt[-3:]], legacy=legacy).start()
    try:
        engine = VllmHttpEngine(server.base_url, model="tiny")
        gen = asyncio.run(engine.generate([5, 6, 7, 8], SamplingParams(max_tokens=2, stop_token_ids=(3,), seed=1)))
    finally:
        server.stop()
    assert gen.token_ids == [7, 8] and gen.logprobs == [-0.25, -0.25] and gen.finish_reason == "length"
    body = server.requests[0]
    assert body["prompt"] == [5, 6, 7, 8] and body["logprobs"] == 1 and body["return_tokens_as_token_ids"] is True
    assert body["stop_token_ids"] == [3] and body["seed"] == 1 and body["skip_special_tokens"] is False


def test_vllm_client_retries_5xx_then_fails_cleanly():
    server = ScriptedVllm(lambda prompt, body: [1]).start()
    try:
        server.fail_next = 1
        engine = VllmHttpEngine(server.base_url, model="tiny", backoff_s=0.001)
        gen = asyncio.run(engine.generate([1], SamplingParams()))
        assert gen.token_ids == [1] and len(server.requests) == 2
        server.fail_next = 10
        with pytest.raises(ProviderError, match="failed after 3 attempts"):
            asyncio.run(VllmHttpEngine(server.base_url, model="tiny", max_retries=2, backoff_s=0.001)
                        .generate([1], SamplingParams()))
    finally:
        server.stop()


def test_rollout_through_scripted_vllm_server(tokenizer):
    env = tiny_env()
    server = ScriptedVllm(text_responder(tokenizer, solving_policy(env))).start()
    try:
        engine = build_engine("vllm", base_url=server.base_url, served_model="tiny")
        r = with_pool(lambda pool: run_episode(engine, tokenizer, pool, env, EpisodeParams().rollout_config())).rollout
    finally:
        server.stop()
    assert r.engine == "vllm" and r.status == "finished" and r.reward.f1 == 1.0
    assert len(server.requests) == 3
    # each request's prompt is the previous prompt + its generated ids + observation ids (never re-tokenized)
    first, second = server.requests[0]["prompt"], server.requests[1]["prompt"]
    assert second[: len(first)] == first and second == r.prompt_ids + r.response_ids[: len(second) - len(first)]


def test_hf_engine_logprobs_match_a_forward_pass(tokenizer):
    import torch

    engine = build_engine("hf", model_path=tiny_model_path())
    prompt = tokenizer.encode("def f(x):", add_special_tokens=False)
    gen = asyncio.run(engine.generate(prompt, SamplingParams(max_tokens=6, seed=3)))
    assert 1 <= len(gen.token_ids) <= 6 and len(gen.logprobs) == len(gen.token_ids)
    with torch.no_grad():
        logits = engine.model(torch.tensor([prompt + gen.token_ids])).logits[0, len(prompt) - 1 : -1]
    expected = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(gen.token_ids)[:, None]).squeeze(-1)
    assert torch.allclose(torch.tensor(gen.logprobs), expected, atol=1e-4)


def test_unknown_engine_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown engine"):
        build_engine("tgi")
    with pytest.raises(ConfigError, match="base_url"):
        build_engine("vllm")


def test_vllm_local_engine_without_vllm_is_a_config_error():
    try:
        import vllm  # noqa: F401
    except ImportError:
        with pytest.raises(ConfigError, match="needs vllm"):
            build_engine("vllm-local", model_path=str(tiny_model_path()))
        return
    pytest.skip("optional: vllm is installed; the in-process engine needs a GPU run")


def test_hf_engine_batches_concurrent_requests_and_cuts_each_answer(tokenizer):
    import torch

    engine = build_engine("hf", model_path=tiny_model_path())
    prompts = [tokenizer.encode(t, add_special_tokens=False) for t in ("def f(x):", "import os\nimport json", "a")]
    limits = [3, 7, 5]

    async def main():
        return await asyncio.gather(*(engine.generate(p, SamplingParams(max_tokens=n, seed=1))
                                      for p, n in zip(prompts, limits)))

    gens = asyncio.run(main())
    assert engine.batches == [3]
    for prompt, limit, gen in zip(prompts, limits, gens):
        assert 1 <= len(gen.token_ids) <= limit
        with torch.no_grad():  # left padding must not change what each row's log-probs mean
            logits = engine.model(torch.tensor([prompt + gen.token_ids])).logits[0, len(prompt) - 1 : -1]
        expected = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(gen.token_ids)[:, None]).squeeze(-1)
        assert torch.allclose(torch.tensor(gen.logprobs), expected, atol=1e-3)


def test_hf_engine_samples_each_request_with_its_own_seed(tokenizer):
    """A request's tokens depend on its own seed only, not on the batch it shared (issue 11)."""
    engine = build_engine("hf", model_path=tiny_model_path())
    prompt = tokenizer.encode("def f(x):", add_special_tokens=False)
    other = tokenizer.encode("import os", add_special_tokens=False)
    params = [SamplingParams(max_tokens=12, temperature=1.0, seed=s) for s in (7, 8, 9)]

    async def batch():
        return await asyncio.gather(engine.generate(prompt, params[0]), engine.generate(other, params[1]),
                                    engine.generate(prompt, params[2]))

    together = asyncio.run(batch())
    alone = asyncio.run(engine.generate(prompt, params[0]))
    assert engine.batches[0] == 3
    assert together[0].token_ids == alone.token_ids and together[0].logprobs == pytest.approx(alone.logprobs, abs=1e-4)
    assert together[0].token_ids != together[2].token_ids  # same prompt, another seed: another sample


def test_shared_prefixes_encode_each_run_of_alike_prompts_once():
    from arenaforge.services.policy.hf import shared_prefixes

    head = list(range(100, 140))
    prompts = [head + [1, 2], [7] * 30, head + [3], head + [1, 2], [5]]
    prefixes, owner, cut = shared_prefixes(prompts, min_shared=16)
    assert owner[0] == owner[2] == owner[3] and len({owner[0], owner[1], owner[4]}) == 3
    assert prefixes[owner[0]] == head and cut[0] == cut[2] == cut[3] == 40  # the group's common beginning
    assert cut[1] == 29 and cut[4] == 0  # a prompt like no other keeps its last token to itself
    _, alone, cuts = shared_prefixes(prompts, min_shared=None)
    assert len(set(alone)) == 5 and cuts == [len(p) - 1 for p in prompts]


def test_hf_engine_encodes_a_shared_prompt_once_and_samples_as_if_alone(tokenizer):
    """A group's samples of one prompt (and prompts that only share a beginning, as later turns do) read the shared
    part's keys and values, computed once: each answer and its log-probs are what the prompt alone gives."""
    import torch

    engine = build_engine("hf", model_path=tiny_model_path())
    system = tokenizer.encode("You can call these tools: get_order(order_id), list_items(order_id). " * 3,
                              add_special_tokens=False)
    prompts = [system + tokenizer.encode(t, add_special_tokens=False) for t in ("Order 7?", "Order 7?", "Items of 9")]
    prompts.append(tokenizer.encode("a", add_special_tokens=False))  # nothing shared, one token
    params = [SamplingParams(max_tokens=8, temperature=1.0, seed=s) for s in (1, 2, 3, 4)]
    calls = []
    forward = engine.model.forward

    def counting(*args, **kwargs):
        calls.append(kwargs["input_ids"].shape)
        return forward(*args, **kwargs)

    async def together():
        return await asyncio.gather(*(engine.generate(p, s) for p, s in zip(prompts, params)))

    engine.model.forward = counting
    try:
        gens = asyncio.run(together())
    finally:
        engine.model.forward = forward
    assert engine.batches == [4]
    assert calls[0][0] == 2 and calls[0][1] >= len(system)  # one shared prefix, one lone prompt's
    assert calls[1][1] < len(prompts[2]) - len(system) + 2  # each row then encodes only what it does not share
    for prompt, param, gen in zip(prompts, params, gens):
        alone = asyncio.run(engine.generate(prompt, param))
        assert gen.token_ids == alone.token_ids and gen.logprobs == pytest.approx(alone.logprobs, abs=1e-4)
        with torch.no_grad():
            logits = engine.model(torch.tensor([prompt + gen.token_ids])).logits[0, len(prompt) - 1 : -1]
        expected = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(gen.token_ids)[:, None]).squeeze(-1)
        assert torch.allclose(torch.tensor(gen.logprobs), expected, atol=1e-3)


def test_hf_engine_continues_a_stored_conversation_and_samples_as_if_whole(tokenizer):
    """The next turn's prompt is the last prompt, what the engine generated and the tool's reply: it starts from the
    stored keys and values and encodes only the reply, with the answers and log-probs the whole prompt gives. A
    weight update empties the store."""
    import torch

    engine = build_engine("hf", model_path=tiny_model_path())
    whole = build_engine("hf", model_path=tiny_model_path())
    whole.prefix_store = None  # the baseline: every prompt encoded whole
    system = tokenizer.encode("You can call these tools: get_order(order_id), list_items(order_id). " * 3,
                              add_special_tokens=False)
    first = [system + tokenizer.encode(t, add_special_tokens=False) for t in ("Order 7?", "Items of 9")]
    params = [SamplingParams(max_tokens=6, temperature=1.0, seed=s) for s in (1, 2)]

    async def batch(eng, prompts, ps):
        return await asyncio.gather(*(eng.generate(p, s) for p, s in zip(prompts, ps)))

    turn1 = asyncio.run(batch(engine, first, params))
    reply = tokenizer.encode(" -> {\"status\": \"shipped\"}", add_special_tokens=False)
    second = [p + g.token_ids + reply for p, g in zip(first, turn1)]
    other = tokenizer.encode("Other tools here: cancel(order_id), refund(order_id, amount). " * 3,
                             add_special_tokens=False)
    fresh = [other + tokenizer.encode(t, add_special_tokens=False) for t in ("Cancel 8", "Refund 9")]  # not stored
    prompts = second + fresh + [tokenizer.encode("a b", add_special_tokens=False)]
    params2 = [SamplingParams(max_tokens=6, temperature=1.0, seed=s) for s in (3, 4, 5, 6, 7)]
    widths = []
    forward = engine.model.forward

    def counting(*args, **kwargs):
        widths.append(kwargs["input_ids"].shape)
        return forward(*args, **kwargs)

    engine.model.forward = counting
    try:
        turn2 = asyncio.run(batch(engine, prompts, params2))
    finally:
        engine.model.forward = forward
    reused = engine.prefix_store.reused_tokens
    assert reused >= 2 * len(first[0]) - 2  # both conversations' first turns came from the store
    assert widths[0][0] == 1 and widths[0][1] >= len(other)  # the two new prompts' shared beginning, once
    assert widths[1][0] == 5 and widths[1][1] < 16  # then each row encodes only what was neither stored nor shared
    expected = asyncio.run(batch(whole, prompts, params2))
    for got, want, prompt in zip(turn2, expected, prompts):
        assert got.token_ids == want.token_ids and got.logprobs == pytest.approx(want.logprobs, abs=1e-4)
        with torch.no_grad():
            logits = engine.model(torch.tensor([prompt + got.token_ids])).logits[0, len(prompt) - 1 : -1]
        exact = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(got.token_ids)[:, None]).squeeze(-1)
        assert torch.allclose(torch.tensor(got.logprobs), exact, atol=1e-3)

    with torch.no_grad():  # an optimizer step writes the weights in place
        next(engine.model.parameters()).mul_(1.0)
    asyncio.run(engine.generate(second[0], params2[0]))
    assert engine.prefix_store.reused_tokens == reused  # nothing computed with the old weights was used


def test_a_torn_down_run_stops_generating_at_the_next_token(tokenizer):
    """SIGTERM or Ctrl-C ends `asyncio.run`, which cancels its tasks and then waits for their threads: a batch being
    decoded used to run to its token limit first (SIGTERM did not stop `arenaforge eval run`). It stops at once now."""
    engine = build_engine("hf", model_path=tiny_model_path())
    stops = sorted(engine.eos_ids)
    decoded: list[int] = []

    def never_stop(module, args, kwargs, out):  # no stop token: only the limit (or the teardown) ends the answer
        out.logits[..., stops] = float("-inf")
        if kwargs["input_ids"].shape[1] == 1:
            decoded.append(1)
        return out

    engine.model.register_forward_hook(never_stop, with_kwargs=True)
    prompt = tokenizer.encode("def f(x):", add_special_tokens=False)

    async def torn_down() -> None:
        asyncio.create_task(engine.generate(prompt, SamplingParams(max_tokens=20_000, temperature=1.0, seed=1)))
        while len(decoded) < 3:  # decoding has started
            await asyncio.sleep(0.01)
        raise KeyboardInterrupt  # what a signal handler raises in the loop's thread

    with pytest.raises(KeyboardInterrupt):
        asyncio.run(torn_down())  # returns once the generating thread has finished
    assert 3 <= len(decoded) < 100
