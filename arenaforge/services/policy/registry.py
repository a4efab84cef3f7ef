"""The engines by name: each engine module declares its `EngineKind` (`ENGINE`); adding one is its file plus a line
here. `scripted` is not listed: tests build it directly (it needs a function)."""

from __future__ import annotations

from typing import Any

from arenaforge.schemas.errors import ConfigError
from arenaforge.services.policy import hf, vllm_http, vllm_local
from arenaforge.services.policy.base import EngineKind, PolicyEngine

ENGINES: dict[str, EngineKind] = {kind.name: kind for kind in (hf.ENGINE, vllm_http.ENGINE, vllm_local.ENGINE)}


def engine_kind(name: str) -> EngineKind:
    try:
        return ENGINES[name]
    except KeyError:
        raise ConfigError(f"unknown engine {name!r}; choose one of {sorted(ENGINES)}") from None


def build_engine(name: str, **kwargs: Any) -> PolicyEngine:
    """A standalone engine called `name` (model_path, base_url, served_model, device, api_key as it needs)."""
    return engine_kind(name).build(**kwargs)
