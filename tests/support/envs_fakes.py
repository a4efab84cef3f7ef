"""Test helpers for the RL environment track: a cheap embedder, configs, and the scripted envs "model"
(`EnvsResponder`, which lives in the package so that `arenaforge bench envs` can use it)."""

from __future__ import annotations

import hashlib
import re
from typing import Any

import numpy as np

from arenaforge.schemas.config import ModelConfig, SandboxConfig
from arenaforge.tasks.benchmarks.envs_responder import EnvsResponder  # noqa: F401  (re-exported for tests)


def fake_embed(texts: list[str]) -> np.ndarray:
    """Hashed bag of words, L2-normalised: similar wording -> similar vectors (no model load)."""
    out = np.zeros((len(texts), 64), dtype=np.float32)
    for i, text in enumerate(texts):
        for word in re.findall(r"[a-z]+", text.lower()):
            out[i, int(hashlib.md5(word.encode()).hexdigest(), 16) % 64] += 1.0
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    return out / np.where(norms == 0, 1, norms)


def sandbox_cfg(**kw: Any) -> SandboxConfig:
    base: dict[str, Any] = dict(backend="process", pool_size=2, call_timeout_s=2.0)
    base.update(kw)
    return SandboxConfig(**base)


def model_cfg(url: str, **kw: Any) -> ModelConfig:
    base: dict[str, Any] = dict(backend="openai", base_url=url, model="scripted", max_retries=1, backoff_base_s=0.01,
                                backoff_max_s=0.02, max_reasks=1, cache=False)
    base.update(kw)
    return ModelConfig(**base)
