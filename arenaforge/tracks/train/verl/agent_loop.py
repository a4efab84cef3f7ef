"""verl agent loop core: one arenaforge episode per verl sample, driven by verl's LLM servers.

verl 0.9's contract (verl.experimental.agent_loop): an `AgentLoopBase` subclass implements
`async run(sampling_params, **kwargs) -> AgentLoopOutput` and generates through
`server_manager.generate(request_id, *, prompt_ids, sampling_params, image_data=None)`, which
returns a `TokenOutput` (`token_ids`, `log_probs`) — older releases returned bare ids. The
output carries prompt_ids, response_ids, response_mask (1 model / 0 tool), response_logprobs,
reward_score, num_turns, metrics and extra_fields.

`ArenaAgentCore` is that logic without verl: it wraps the server manager as a `PolicyEngine`
and reuses `arenaforge.tracks.train.rollout.episodes.run_episode`, so verl training sees exactly the tokens, masks and
F1 reward of our one-node trainer. It returns a plain dict; `verl_adapter.ArenaAgentLoop`
turns it into verl's `AgentLoopOutput`.

Each sample names its environment by id (`extra_info.env_id`); the record comes from the
`environments.jsonl` written beside the Parquet (`dataset.write_dataset_dir`).

Environment failures cannot be dropped inside verl's fixed-size batch, so they are neutralised:
response_mask all 0 (no gradient), reward 0, `extra_fields["env_failure"] = 1`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from arenaforge.schemas.models import Environment
from arenaforge.services.policy.base import Generation, SamplingParams
from arenaforge.tracks.train.rollout.episodes import RolloutConfig, SandboxPool, run_episode
from arenaforge.tracks.train.verl.dataset import load_environment


class ServerManagerEngine:
    """verl's AsyncLLMServerManager (or a scripted stand-in) as a PolicyEngine for one request id."""

    name = "verl"

    def __init__(self, server_manager: Any, request_id: str, sampling_params: dict[str, Any], policy: str = "verl"):
        self.server_manager = server_manager
        self.request_id = request_id
        self.sampling_params = dict(sampling_params)
        self.policy = policy

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
        sampling = {**self.sampling_params, "max_tokens": params.max_tokens, "logprobs": True}
        if params.stop_token_ids:
            sampling["stop_token_ids"] = list(params.stop_token_ids)
        out = await self.server_manager.generate(self.request_id, prompt_ids=list(prompt_ids),
                                                 sampling_params=sampling)
        ids = list(getattr(out, "token_ids", out))
        logprobs = getattr(out, "log_probs", None) or [0.0] * len(ids)
        stops = set(params.stop_token_ids)
        finish = "stop" if (ids and ids[-1] in stops) or len(ids) < params.max_tokens else "length"
        return Generation(token_ids=ids, logprobs=[float(x) for x in logprobs], finish_reason=finish)


def environment_from_kwargs(kwargs: dict[str, Any], environments: str | Path) -> Environment:
    """The Environment a verl sample names (`extra_info.env_id`), from the export's environments.jsonl."""
    env_id = (kwargs.get("extra_info") or {}).get("env_id")
    if not env_id:
        raise ValueError("verl sample has no extra_info.env_id (write the dataset with arenaforge envs export)")
    return load_environment(environments, env_id)


class ArenaAgentCore:
    """The CPU-testable body of the verl agent loop."""

    def __init__(self, server_manager: Any, tokenizer: Any, pool: SandboxPool, rollout: RolloutConfig,
                 environments: str | Path, policy: str = "verl") -> None:
        self.environments = environments
        self.server_manager = server_manager
        self.tokenizer = tokenizer
        self.pool = pool
        self.rollout = rollout
        self.policy = policy

    async def run(self, sampling_params: dict[str, Any], request_id: str, **kwargs: Any) -> dict[str, Any]:
        env = environment_from_kwargs(kwargs, self.environments)
        engine = ServerManagerEngine(self.server_manager, request_id, sampling_params, self.policy)
        cfg = RolloutConfig(**{**asdict(self.rollout), "temperature": float(sampling_params.get("temperature", 1.0)),
                               "top_p": float(sampling_params.get("top_p", 1.0))})
        episode = await run_episode(engine, self.tokenizer, self.pool, env, cfg)
        r = episode.rollout
        failed = r.status == "env_failure"
        return {
            "prompt_ids": r.prompt_ids,
            "response_ids": r.response_ids,
            "response_mask": [0] * len(r.response_mask) if failed else r.response_mask,
            "response_logprobs": r.logprobs,
            "reward_score": 0.0 if failed else r.reward.f1,
            "num_turns": len(r.messages),
            "metrics": {"generate_sequences": episode.generate_s, "tool_calls": episode.tool_s},
            "extra_fields": {
                "recall": r.reward.recall, "precision": r.reward.precision, "calls": r.reward.calls,
                "status": r.status, "env_failure": int(failed), "tool_errors": r.tool_errors,
                "format_errors": r.format_errors, "env_id": env.id,
                "failure_reason": r.failure_reason or "",
            },
        }
