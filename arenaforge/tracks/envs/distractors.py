"""Distractor tools (ASTRA §1b.5): task-irrelevant tools from three similarity bands.

Every tool document in the batch is embedded (all-MiniLM-L6-v2 through `arenaforge.services.embeddings.embed`,
rows L2-normalised, so a dot product is the cosine similarity). For one environment, each
candidate tool (any tool of another environment whose name and signature differ from the
environment's own tools, so it cannot answer the task) scores its highest similarity to the
environment's tools; candidates sorted by that score are cut into terciles — high, medium,
low — and `mix` tools are drawn (seeded) from each. Distractors carry their code and mock
data, so an agent that calls one gets a real observation.

With a `pool` (merging across windows and runs), the candidates also include the tools of the run's
earlier windows and of earlier runs, filtered and banded the same way; embeddings are cached per tool
text, so a window embeds only tools not seen before.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from arenaforge.schemas.kinds_envs import DistractorPick
from arenaforge.schemas.models import FunctionDoc
from arenaforge.tracks.envs.synthesize_env import EnvDraft, ToolImpl

Embedder = Callable[[list[str]], np.ndarray]
BANDS = ("high", "medium", "low")


@dataclass(frozen=True)
class DistractorMix:
    """Distractor tools per similarity band; the defaults are `EnvsSpec`'s (`EnvsSpec.mix`)."""

    high: int
    medium: int
    low: int

    def as_dict(self) -> dict[str, int]:
        return {"high": self.high, "medium": self.medium, "low": self.low}


def tool_text(doc: FunctionDoc) -> str:
    params = ", ".join(f"{k} ({v.get('type', 'any')}): {v.get('description', '')}"
                       for k, v in doc.parameters.get("properties", {}).items())
    return f"{doc.name}: {doc.description} Parameters: {params}"


def default_embedder() -> Embedder:
    from arenaforge.services.embeddings import embed

    return embed


@dataclass
class Chosen:
    tools: list[ToolImpl]
    picks: list[DistractorPick]


@dataclass
class Pool:
    """Tools earlier windows and runs built, in arrival order, with their source environment (QA id), and the
    embeddings computed so far, by tool text (shared by the snapshots `window` hands out)."""

    tools: list[tuple[ToolImpl, str]] = field(default_factory=list)
    vectors: dict[str, np.ndarray] = field(default_factory=dict)

    def window(self, drafts: list[EnvDraft]) -> "Pool":
        """What a window draws from (everything before it); then adds the window's tools for later windows."""
        before = Pool(list(self.tools), self.vectors)
        self.tools += [(t, d.qa.id) for d in drafts for t in d.tools]
        return before

    def embedded(self, texts: list[str], embed: Embedder) -> dict[str, np.ndarray]:
        missing = sorted(set(texts) - self.vectors.keys())
        if missing:
            self.vectors.update(zip(missing, embed(missing), strict=True))
        return {t: self.vectors[t] for t in texts}


def choose_distractors(drafts: list[EnvDraft], mix: DistractorMix, embed: Embedder | None = None,
                       seed: int = 0, pool: Pool | None = None) -> list[Chosen]:
    """Distractors for every draft (same order), drawn from the other drafts' tools (and the pool's)."""
    if pool is not None:
        return _choose_with_pool(drafts, mix, embed or default_embedder(), seed, pool)
    catalog: dict[str, tuple[ToolImpl, int]] = {}
    for i, d in enumerate(drafts):
        for t in d.tools:
            catalog.setdefault(t.name, (t, i))
    names = sorted(catalog)
    if not names or sum(mix.as_dict().values()) == 0:
        return [Chosen([], []) for _ in drafts]
    vectors = (embed or default_embedder())([tool_text(catalog[n][0].doc) for n in names])
    row = {n: k for k, n in enumerate(names)}
    sims = vectors @ vectors.T
    out = []
    for i, d in enumerate(drafts):
        own = {t.name for t in d.tools}
        own_sigs = {t.signature for t in d.tools}
        cands = [n for n in names if n not in own and catalog[n][0].signature not in own_sigs]
        if not cands:
            out.append(Chosen([], []))
            continue
        own_rows = [row[n] for n in own]
        score = {n: float(sims[row[n], own_rows].max()) for n in cands}
        out.append(_pick(d, score, mix, seed, {n: (catalog[n][0], drafts[catalog[n][1]].qa.id) for n in cands}))
    return out


def _choose_with_pool(drafts: list[EnvDraft], mix: DistractorMix, embed: Embedder, seed: int,
                      pool: Pool) -> list[Chosen]:
    """As `choose_distractors`, the catalog being the pool's tools then the drafts' (first tool of a name wins,
    as in one batch); each draft's own tools are scored by their own text."""
    catalog: dict[str, tuple[ToolImpl, str]] = {}
    for t, src in pool.tools + [(t, d.qa.id) for d in drafts for t in d.tools]:
        catalog.setdefault(t.name, (t, src))
    names = sorted(catalog)
    if not names or sum(mix.as_dict().values()) == 0:
        return [Chosen([], []) for _ in drafts]
    own_texts = [tool_text(t.doc) for d in drafts for t in d.tools]
    vec = pool.embedded([tool_text(catalog[n][0].doc) for n in names] + own_texts, embed)
    out = []
    for d in drafts:
        own = {t.name for t in d.tools}
        own_sigs = {t.signature for t in d.tools}
        cands = [n for n in names if n not in own and catalog[n][0].signature not in own_sigs]
        if not cands or not d.tools:
            out.append(Chosen([], []))
            continue
        own_vecs = np.stack([vec[tool_text(t.doc)] for t in d.tools])
        score = {n: float((own_vecs @ vec[tool_text(catalog[n][0].doc)]).max()) for n in cands}
        out.append(_pick(d, score, mix, seed, {n: catalog[n] for n in cands}))
    return out


def _pick(d: EnvDraft, score: dict[str, float], mix: DistractorMix, seed: int,
          catalog: dict[str, tuple[ToolImpl, str]]) -> Chosen:
    """Candidates by score cut into terciles; `mix` drawn from each, seeded by the QA id."""
    ordered = sorted(score, key=lambda n: (-score[n], n))
    third = len(ordered) / 3
    bands = {"high": ordered[: round(third)], "medium": ordered[round(third): round(2 * third)],
             "low": ordered[round(2 * third):]}
    rng = random.Random(f"{seed}:{d.qa.id}")
    tools, picks = [], []
    for band in BANDS:
        members = bands[band]
        for n in rng.sample(members, min(len(members), mix.as_dict()[band])):
            tool, src = catalog[n]
            tools.append(_as_distractor(tool))
            picks.append(DistractorPick(name=n, band=band, similarity=round(score[n], 4),  # type: ignore[arg-type]
                                        source_env=src))
    return Chosen(tools, picks)


def _as_distractor(tool: ToolImpl) -> ToolImpl:
    """The tool without its gold calls (it answers nothing in this environment)."""
    return ToolImpl(tool.doc, tool.source, tool.data, tool.signature, [], [], tool.origin, tool.written_by)


def describe_bands(chosen: list[Chosen]) -> dict[str, Any]:
    counts = {b: 0 for b in BANDS}
    for c in chosen:
        for p in c.picks:
            counts[p.band] += 1
    return counts
