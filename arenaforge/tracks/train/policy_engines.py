"""The policy a job rolls out: its engine built from the params by the engine's declared traits, never its name."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from arenaforge.schemas.errors import ConfigError
from arenaforge.services.policy.base import PolicyEngine
from arenaforge.services.policy.registry import engine_kind
from arenaforge.tracks.train.params import PolicyParams


def engine_factory(params: PolicyParams) -> Callable[[Any, Any], PolicyEngine]:
    """(model, tokenizer) -> engine: one that shares the trainer's model wraps it; the others build their own."""
    kind = engine_kind(params.engine)
    if kind.around_trainer_model is not None:
        around = kind.around_trainer_model
        return lambda model, tok: around(model, tok, policy=params.model_path or "tiny", device=params.device)
    if kind.url_for and not params.policy_url:
        raise ConfigError(f"engine {kind.name} needs --policy-url ({kind.url_for})")
    return lambda model, tok: kind.build(model_path=params.model_path, base_url=params.policy_url,
                                         served_model=params.served_model)


def load_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def policy_engine(params: PolicyParams, path: str, tokenizer: Any) -> PolicyEngine:
    """The engine for the policy at `path`; an engine that shares the trainer's model gets it loaded here."""
    model = None
    if engine_kind(params.engine).shares_trainer_model:
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_pretrained(path).to(params.device)
    return engine_factory(params.model_copy(update={"model_path": path}))(model, tokenizer)
