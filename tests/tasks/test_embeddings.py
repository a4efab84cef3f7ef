"""The shared MiniLM embedding helper: shape, normalisation, cache, semantic ordering."""

from __future__ import annotations

import numpy as np

from arenaforge.services import embeddings


def test_embed_is_normalised_cached_and_semantic():
    texts = ["current weather in a city", "forecast temperature for a location", "delete a git branch"]
    vecs = embeddings.embed(texts)
    assert vecs.shape == (3, embeddings.DIM) and vecs.dtype == np.float32
    assert np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    before = embeddings.cache_size()
    again = embeddings.embed([texts[1], texts[0]])
    assert embeddings.cache_size() == before
    assert np.array_equal(again[1], vecs[0])
    sim = embeddings.similarity(texts[:1], texts[1:])
    assert sim[0, 0] > sim[0, 1] + 0.2
    assert embeddings.embed([]).shape == (0, embeddings.DIM)
