"""The engine protocol, its value types and what an engine declares about itself (`EngineKind`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

FinishReason = Literal["stop", "length"]


@dataclass(frozen=True)
class SamplingParams:
    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    stop_token_ids: tuple[int, ...] = ()
    seed: int | None = None
    # Tool calls may only name these tools and their argument keys (hf engine: constrained decoding,
    # see policy/constrained.py); None leaves the model free.
    tools: tuple[Any, ...] | None = None
    # With `tools`: top-level argument values of a call are copied from the prompt's text (spans, numbers;
    # grounded decoding, policy/constrained.py `Ground`); False leaves them any JSON.
    ground_arguments: bool = True


@dataclass(frozen=True)
class Generation:
    """What one engine call produced: exact token ids and their log-probs under the sampler."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: FinishReason
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if len(self.token_ids) != len(self.logprobs):
            raise ValueError(f"{len(self.token_ids)} token ids but {len(self.logprobs)} log-probs")


class PolicyEngine(Protocol):
    name: str
    policy: str

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation: ...


@dataclass(frozen=True)
class EngineKind:
    """An engine as the jobs see it: how to build one and what it can do, declared in the engine's own module
    (`ENGINE`) and registered in `policy/registry.py`; the jobs ask these traits, never the engine's name."""

    name: str
    build: Callable[..., PolicyEngine]  # a standalone engine from model_path / base_url / served_model / device
    # (model, tokenizer, policy=, device=) -> an engine on the trainer's in-process model; None: the engine has its own
    around_trainer_model: Callable[..., PolicyEngine] | None = None
    url_for: str | None = None  # what --policy-url points at, for an engine that talks to a server
    warm_start: bool = True  # serves a local copy, so a warm start can train it first
    skips_forced_tokens: bool = False  # constrained decoding marks the tokens it forced (the loss may leave them out)

    @property
    def shares_trainer_model(self) -> bool:
        return self.around_trainer_model is not None
