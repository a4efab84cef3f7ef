"""Distractor tools (ASTRA §1b.5): task-irrelevant tools from three similarity bands.

Every tool document in the batch is embedded (all-MiniLM-L6-v2 through `arenaforge.tasks.embeddings.embed`,
rows L2-normalised, so a dot product is the cosine similarity). For one environment, each
candidate tool (any tool of another environment whose name and signature differ from the
environment's own tools, so it cannot answer the task) scores its highest similarity to the
environment's tools; candidates sorted by that score are cut into terciles — high, medium,
low — and `mix` tools are drawn (seeded) from each. Distractors carry their code and mock
data, so an agent that calls one gets a real observation.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from arenaforge.schemas.kinds_envs import DistractorPick
from arenaforge.schemas.models import FunctionDoc
from arenaforge.tasks.envs.synthesize_env import EnvDraft, ToolImpl

Embedder = Callable[[list[str]], np.ndarray]
BANDS = ("high", "medium", "low")


@dataclass(frozen=True)
class DistractorMix:
    high: int = 1
    medium: int = 1
    low: int = 1

    def as_dict(self) -> dict[str, int]:
        return {"high": self.high, "medium": self.medium, "low": self.low}

    @classmethod
    def parse(cls, text: str) -> "DistractorMix":
        """'high=1,medium=1,low=1' or '1,1,1'."""
        parts = [p.strip() for p in text.split(",") if p.strip()]
        if all("=" not in p for p in parts) and len(parts) == 3:
            return cls(*(int(p) for p in parts))
        values = {k.strip(): int(v) for k, v in (p.split("=", 1) for p in parts)}
        return cls(**values)


def tool_text(doc: FunctionDoc) -> str:
    params = ", ".join(f"{k} ({v.get('type', 'any')}): {v.get('description', '')}"
                       for k, v in doc.parameters.get("properties", {}).items())
    return f"{doc.name}: {doc.description} Parameters: {params}"


def default_embedder() -> Embedder:
    from arenaforge.tasks.embeddings import embed

    return embed


@dataclass
class Chosen:
    tools: list[ToolImpl]
    picks: list[DistractorPick]


def choose_distractors(drafts: list[EnvDraft], mix: DistractorMix, embed: Embedder | None = None,
                       seed: int = 0) -> list[Chosen]:
    """Distractors for every draft (same order), drawn from the other drafts' tools."""
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
        ordered = sorted(cands, key=lambda n: (-score[n], n))
        third = len(ordered) / 3
        bands = {"high": ordered[: round(third)], "medium": ordered[round(third): round(2 * third)],
                 "low": ordered[round(2 * third):]}
        rng = random.Random(f"{seed}:{d.qa.id}")
        tools, picks = [], []
        for band in BANDS:
            pool = bands[band]
            for n in rng.sample(pool, min(len(pool), mix.as_dict()[band])):
                tool, src = catalog[n]
                tools.append(_as_distractor(tool))
                picks.append(DistractorPick(name=n, band=band, similarity=round(score[n], 4),  # type: ignore[arg-type]
                                            source_env=drafts[src].qa.id))
        out.append(Chosen(tools, picks))
    return out


def _as_distractor(tool: ToolImpl) -> ToolImpl:
    """The tool without its gold calls (it answers nothing in this environment)."""
    return ToolImpl(tool.doc, tool.source, tool.data, tool.signature, [], [], tool.origin)


def describe_bands(chosen: list[Chosen]) -> dict[str, Any]:
    counts = {b: 0 for b in BANDS}
    for c in chosen:
        for p in c.picks:
            counts[p.band] += 1
    return counts
