"""Test helpers for the RL environment track: configs and the scripted envs "model"
(`EnvsResponder`, which lives in the package so that `arenaforge bench envs` can use it)."""

from __future__ import annotations

from typing import Any

from arenaforge.schemas.config import ModelConfig, SandboxConfig
from arenaforge.testing.envs_responder import EnvsResponder  # noqa: F401  (re-exported for tests)


def sandbox_cfg(**kw: Any) -> SandboxConfig:
    # the scripted model's code is ours, but it is marked model-written: opt in to the process backend
    base: dict[str, Any] = dict(backend="process", pool_size=2, call_timeout_s=2.0, process_allows_model_code=True)
    base.update(kw)
    return SandboxConfig(**base)


def model_cfg(url: str, **kw: Any) -> ModelConfig:
    base: dict[str, Any] = dict(backend="openai", base_url=url, model="scripted", max_retries=1, backoff_base_s=0.01,
                                backoff_max_s=0.02, max_reasks=1, cache=False)
    base.update(kw)
    return ModelConfig(**base)
