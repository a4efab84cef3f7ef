"""Multi-turn rollouts: token bookkeeping, parsing, reward, failure handling, concurrency."""

from __future__ import annotations

import asyncio

import pytest

from arenaforge.testing.scripted_policy import ScriptedEngine
from arenaforge.tracks.train.params import EpisodeParams
from arenaforge.tracks.train.rollout.episodes import parse_tool_calls, render_observations, run_episode, run_rollouts
from tests.support.rl import call_text, dying_before, solving_policy, tiny_env, tiny_model_path, with_pool


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path())


def test_parse_tool_calls_flags_malformed_calls():
    names = ["get_capital"]
    text = (call_text("get_capital", country="X") + "<tool_call>{not json}</tool_call>"
            + call_text("nope") + '<tool_call>{"name": "get_capital", "arguments": "[1]"}</tool_call><tool_call>{')
    calls = parse_tool_calls(text, names)
    assert [c.error is None for c in calls] == [True, False, False, False, False]
    assert calls[0].arguments == {"country": "X"}
    assert "unknown tool 'nope'" in calls[2].error
    assert "unterminated" in calls[4].error


def test_solving_episode_keeps_engine_tokens_and_masks_observations(tokenizer):
    env = tiny_env()
    engine = ScriptedEngine(tokenizer, solving_policy(env), logprob=-0.5)

    async def episode_and_stats(pool):
        return await run_episode(engine, tokenizer, pool, env, EpisodeParams().rollout_config()), pool.stats()

    episode, stats = with_pool(episode_and_stats)
    r = episode.rollout
    assert r.status == "finished" and episode.turns == 3
    assert (r.reward.recall, r.reward.precision, r.reward.f1, r.reward.calls) == (1.0, 1.0, 1.0, 2)
    assert stats["sessions"] == 0 and stats["templates"] == 1  # its one session was opened, then closed
    assert len(r.response_ids) == len(r.response_mask) == len(r.logprobs)
    # model tokens decode to exactly what the engine emitted; masked tokens are the observations
    model_text = tokenizer.decode([t for t, m in zip(r.response_ids, r.response_mask) if m], skip_special_tokens=False)
    tool_text = tokenizer.decode([t for t, m in zip(r.response_ids, r.response_mask) if not m], skip_special_tokens=False)
    assert "get_capital" in model_text and "<tool_response>" not in model_text
    assert "Quaxton" in tool_text and "81234" in tool_text and "<tool_call>" not in tool_text
    assert all(lp == -0.5 for lp, m in zip(r.logprobs, r.response_mask) if m)
    assert all(lp == 0.0 for lp, m in zip(r.logprobs, r.response_mask) if not m)
    # token-in/token-out: the full sequence equals the chat template applied to the final messages
    full = tokenizer.apply_chat_template([m.model_dump(exclude_none=True) for m in r.messages],
                                         tools=[t.as_openai_tool() for t in env.tools], tokenize=False)
    assert tokenizer.decode(r.prompt_ids + r.response_ids, skip_special_tokens=False) == full.rstrip("\n")
    assert [m.role for m in r.messages] == ["system", "user", "assistant", "tool", "assistant", "tool", "assistant"]


def test_malformed_and_failing_calls_count_against_precision(tokenizer):
    env = tiny_env()
    turns = ["<tool_call>{oops}</tool_call>", call_text("get_capital", country="Nowhere"),
             call_text("get_capital", country="Freedonia"), "done"]
    engine = ScriptedEngine(tokenizer, lambda _p, i: turns[i])
    r = with_pool(lambda pool: run_episode(engine, tokenizer, pool, env, EpisodeParams().rollout_config())).rollout
    assert r.status == "finished"
    assert (r.format_errors, r.tool_errors, r.reward.calls, r.reward.solved) == (1, 1, 3, 1)
    assert r.reward.recall == 0.5 and r.reward.precision == pytest.approx(1 / 3)


def test_stops_at_max_turns_and_max_length(tokenizer):
    env = tiny_env()
    loop = ScriptedEngine(tokenizer, lambda _p, _i: call_text("get_capital", country="Freedonia"))

    async def both(pool):
        return [(await run_episode(loop, tokenizer, pool, env, cfg)).rollout
                for cfg in (EpisodeParams(max_turns=2).rollout_config(), EpisodeParams(max_length=20).rollout_config())]

    r, short = with_pool(both)
    assert r.status == "max_turns" and r.reward.calls == 2
    assert short.status == "max_length" and len(short.response_ids) <= 20


def test_sandbox_failure_is_env_failure_not_reward_zero(tokenizer):
    env = tiny_env()
    engine = ScriptedEngine(tokenizer, dying_before(solving_policy(env), {"get_population"}))

    async def episode_and_stats(pool):
        return (await run_episode(engine, tokenizer, pool, env, EpisodeParams().rollout_config())).rollout, pool.stats()

    r, stats = with_pool(episode_and_stats)
    assert r.status == "env_failure" and "sandbox worker" in r.failure_reason
    assert stats["sessions"] == 0  # the session was closed all the same


def test_rollouts_overlap_generation_with_tool_calls(tokenizer):
    envs = [tiny_env(country=f"C{i}") for i in range(4)]
    engine = ScriptedEngine(tokenizer, lambda p, i: "answer", seconds_per_token=0.0)
    episodes = with_pool(lambda pool: run_rollouts(engine, tokenizer, pool, envs, EpisodeParams().rollout_config(), samples=3), size=2)
    assert len(episodes) == 12
    assert [e.rollout.env_id for e in episodes[:3]] == [envs[0].id] * 3
    assert {e.rollout.sample for e in episodes} == {0, 1, 2}


def test_observation_rendering_matches_template(tokenizer):
    rendered = render_observations(["a", "b"])
    assert rendered.startswith("\n<|im_start|>user\n<tool_response>\na\n</tool_response>\n<tool_response>")
    assert rendered.endswith("<|im_end|>\n<|im_start|>assistant\n")


def test_rollouts_against_the_process_sandbox(tokenizer):
    from arenaforge.environments.runtime import create_pool
    from arenaforge.schemas.config import SandboxConfig

    envs = [tiny_env(), tiny_env(country="Sylvania", capital="Ostia", population=5150)]

    async def main():
        pool = await create_pool(SandboxConfig(backend="process", pool_size=2))
        try:
            def respond(prompt, index):
                env = next(e for e in envs if e.question in prompt)
                return solving_policy(env)(prompt, index)
            engine = ScriptedEngine(tokenizer, respond)
            return await run_rollouts(engine, tokenizer, pool, envs, EpisodeParams().rollout_config(), samples=2)
        finally:
            await pool.shutdown()

    episodes = asyncio.run(main())
    assert [e.rollout.reward.f1 for e in episodes] == [1.0] * 4
    assert all(e.rollout.status == "finished" and e.rollout.tool_errors == 0 for e in episodes)


def test_env_failures_become_tagged_rejections(tokenizer):
    from arenaforge.tracks.train.rollout.episodes import env_failure_rejections

    env = tiny_env()
    engine = ScriptedEngine(tokenizer, dying_before(solving_policy(env), {"get_capital"}))

    async def failed_then_ok(pool):  # the pool replaces its dead worker: the second episode runs normally
        return [(await run_episode(engine, tokenizer, pool, env, EpisodeParams().rollout_config())).rollout for _ in range(2)]

    failed, ok = with_pool(failed_then_ok)
    assert (failed.status, ok.status) == ("env_failure", "finished")
    [rejection] = env_failure_rejections([failed, ok])
    assert rejection.environment_failure and rejection.subject == failed.id and "sandbox worker" in rejection.detail


def test_stream_groups_give_each_group_new_seeds(tokenizer):
    from arenaforge.tracks.train.rollout.episodes import GROUP_SEED_STRIDE, stream_groups

    seeds: list[int] = []

    def respond(_prompt, _index):
        seeds.append(engine.params.seed)
        return "no idea"

    engine = ScriptedEngine(tokenizer, respond)

    async def three_groups(pool):
        stream = stream_groups(engine, tokenizer, pool, [tiny_env()], EpisodeParams().rollout_config(7), 2,
                               in_flight_groups=1)
        try:
            return [await anext(stream) for _ in range(3)]
        finally:
            await stream.aclose()

    with_pool(three_groups)
    assert sorted(seeds)[:6] == sorted(7 + k * GROUP_SEED_STRIDE + 1000 * i for k in range(3) for i in range(2))
    assert len(set(seeds)) == len(seeds)  # no group replays another's samples
