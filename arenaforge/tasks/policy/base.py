"""The engine protocol, its value types and the factory table."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

from arenaforge.schemas.errors import ConfigError

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


def _hf(**kw: Any) -> PolicyEngine:
    from arenaforge.tasks.policy.hf import HfEngine

    return HfEngine.from_pretrained(kw["model_path"], device=kw.get("device", "cpu"))


def _vllm(**kw: Any) -> PolicyEngine:
    from arenaforge.tasks.policy.vllm_http import VllmHttpEngine

    if not kw.get("base_url"):
        raise ConfigError("engine vllm needs a base_url (the `vllm serve` endpoint, e.g. http://127.0.0.1:8000/v1)")
    return VllmHttpEngine(kw["base_url"], model=kw.get("served_model") or kw.get("model_path") or "policy",
                          api_key=kw.get("api_key"))


def _vllm_local(**kw: Any) -> PolicyEngine:
    from arenaforge.tasks.policy.vllm_local import VllmLocalEngine

    return VllmLocalEngine(kw["model_path"])


ENGINES: dict[str, Callable[..., PolicyEngine]] = {"hf": _hf, "vllm": _vllm, "vllm-local": _vllm_local}


def build_engine(name: str, **kwargs: Any) -> PolicyEngine:
    """The engine called `name`; `scripted` is built by tests directly (it needs a function)."""
    try:
        factory = ENGINES[name]
    except KeyError:
        raise ConfigError(f"unknown engine {name!r}; choose one of {sorted(ENGINES)}") from None
    return factory(**kwargs)
