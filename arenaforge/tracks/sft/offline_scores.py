"""Offline answer of `sft.score_query`: clarity, realism and tool necessity by rules.

  clarity         the values the first step needs are stated; the length is reasonable
  realism         no API identifiers, values of a plausible shape, not a wall of steps
  tool_necessity  the request asks for what the tools do (their purpose words appear)
"""

from __future__ import annotations

import re
from typing import Any

from arenaforge.services.models import ChatRequest
from arenaforge.services.models.providers.offline import OfflineModel
from arenaforge.tracks.sft.score_queries import ScoreInputs, _clip
from arenaforge.tracks.sft.synthesize_queries import clause
from arenaforge.tracks.sft.tool_graph import humanize, id_like, param_fields

_SNAKE = re.compile(r"\b[a-z]+_[a-z_]+\b")
_TOKENS = re.compile(r"[a-z]{3,}")


def _tokens(text: str) -> set[str]:
    return set(_TOKENS.findall(text.lower()))


def score_query(request: ChatRequest, model: OfflineModel) -> dict[str, Any]:
    inputs: ScoreInputs = request.inputs
    draft, tools = inputs.draft, inputs.tools
    by_name = {t.function.name: t for t in tools}
    steps = [by_name[n] for n in draft.tools if n in by_name]
    q = draft.query
    ql = q.lower()
    notes = []
    # clarity: the values the first step needs are stated; length is reasonable.
    clarity = 1.0
    first_required = [p for p in param_fields(steps[0]) if p.required] if steps else []
    unstated = [p.name for p in first_required if p.name not in draft.values and humanize(p.name) not in ql]
    if unstated:
        clarity -= 0.25 * len(unstated)
        notes.append(f"unstated values: {', '.join(unstated)}")
    if len(q) < 25:
        clarity -= 0.4
        notes.append("very short")
    if len(q) > 900:
        clarity -= 0.2
        notes.append("very long")
    # realism: no API identifiers, values of the right shape, not a wall of steps.
    realism = 0.9
    names_said = [n for n in _SNAKE.findall(q) if n in by_name]
    if names_said:
        realism -= 0.3
        notes.append(f"names tools: {', '.join(names_said)}")
    if len(steps) > 4:
        realism -= 0.1 * (len(steps) - 4)
    if draft.persona or draft.augmentation == "diversity":
        realism += 0.1
    fake_ids = [k for k, v in draft.values.items() if id_like(k) and isinstance(v, str) and "_" in v]
    if len(fake_ids) > 1:
        realism -= 0.15
        notes.append("user quotes several opaque ids")
    # tool necessity: the request asks for what the tools do (their purpose words appear).
    if steps:
        hits = [len(_tokens(clause(t)) & _tokens(ql)) / max(1, len(_tokens(clause(t)))) for t in steps]
        necessity = sum(min(1.0, h * 1.5) for h in hits) / len(hits)
    else:
        words = set().union(*(_tokens(t.function.description) for t in tools)) if tools else set()
        necessity = min(1.0, 3 * len(words & _tokens(ql)) / max(1, len(_tokens(ql))))
    scores = {"clarity": _clip(clarity), "realism": _clip(realism), "tool_necessity": _clip(necessity)}
    return {**scores, "rationale": "; ".join(notes)}
