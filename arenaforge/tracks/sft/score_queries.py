"""Quality scores for synthesized queries and the accept/reject decision (ASTRA §1a.3).

Three scores in 0..1: clarity (the request says what is wanted and gives the values needed),
realism (reads like a user, not like an API call), tool necessity (it cannot be answered without
the tools). A task is accepted only when every score reaches its threshold (`cfg.sft.min_*`);
rejected tasks are kept (`Task.accepted = False`) with one reason per failed threshold.

The run's model scores with the `sft_score_query` judge prompt (the offline provider by rules over the
query text, the tools' schemas and the values it states: `tracks/sft/offline_scores.py`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from dataclasses import dataclass
from types import ModuleType

from arenaforge.schemas.base import Provenance
from arenaforge.schemas.config import SftConfig
from arenaforge.schemas.errors import ParseError, ProviderError
from arenaforge.schemas.models import Rejection, Task, Tool
from arenaforge.services.models import ChatModel, Step, complete_json
from arenaforge.tracks.sft.prompts import load_prompt
from arenaforge.tracks.sft.synthesize_queries import QueryDraft


def _offline_rules() -> ModuleType:
    from arenaforge.tracks.sft import offline_scores  # its rules read this module's types: loaded after it

    return offline_scores


SCORES = ("clarity", "realism", "tool_necessity")


def _clip(x: float) -> float:
    return round(max(0.0, min(1.0, x)), 4)


SCORE_SCHEMA = {
    "type": "object",
    "properties": {**{k: {"type": "number", "minimum": 0, "maximum": 1} for k in SCORES}, "rationale": {"type": "string"}},
    "required": list(SCORES),
}


SCORE_QUERY = Step("sft.score_query", prompt="sft_score_query", schema=SCORE_SCHEMA, max_tokens=150,
                   offline=lambda: _offline_rules().score_query)


@dataclass(frozen=True)
class ScoreInputs:
    draft: QueryDraft
    tools: tuple[Tool, ...]


class QueryScorer:
    """Clarity, realism and tool necessity of a query, from the run's model."""

    def __init__(self, model: ChatModel) -> None:
        self.model = model
        self.prompt = load_prompt(SCORE_QUERY.prompt)

    async def score(self, draft: QueryDraft, tools: Sequence[Tool]) -> tuple[dict[str, float], str]:
        from arenaforge.tracks.sft.tool_graph import tool_lines

        out = await complete_json(self.model, SCORE_QUERY,
                                  lambda: self.prompt.render(query=draft.query, tools=tool_lines(tools)),
                                  inputs=ScoreInputs(draft, tuple(tools)))
        return {k: _clip(float(out[k])) for k in SCORES}, str(out.get("rationale", ""))


def decide(scores: dict[str, float], cfg: SftConfig) -> list[str]:
    """Reasons the task fails its thresholds ([] = accepted)."""
    limits = {"clarity": cfg.min_clarity, "realism": cfg.min_realism, "tool_necessity": cfg.min_tool_necessity}
    return [f"{k} {scores.get(k, 0.0):.2f} < {limit:.2f}" for k, limit in limits.items() if scores.get(k, 0.0) < limit]


async def score_drafts(drafts: Sequence[QueryDraft], tools: dict[str, list[Tool]], scorer: QueryScorer,
                       cfg: SftConfig, run_id: str | None, provenance: Provenance,
                       parents: dict[str, list[str]] | None = None) -> tuple[list[Task], list[Rejection]]:
    """Task records (accepted or not, with reasons) for scored drafts; model failures become rejections."""
    results = await asyncio.gather(*[scorer.score(d, tools[d.server]) for d in drafts], return_exceptions=True)
    tasks: list[Task] = []
    rejections: list[Rejection] = []
    for draft, result in zip(drafts, results, strict=True):
        if isinstance(result, (ParseError, ProviderError)):
            rejections.append(Rejection.of_error("score_query", draft.query[:200], result, run_id=run_id))
            continue
        if isinstance(result, BaseException):
            raise result
        scores, note = result
        reasons = decide(scores, cfg)
        if reasons and note:
            reasons.append(note)
        chain_parents = [draft.chain_id] if draft.chain_id else (parents or {}).get(draft.server, [])
        tasks.append(Task(server=draft.server, chain_id=draft.chain_id, mode=draft.mode,  # type: ignore[arg-type]
                          query=draft.query, persona=draft.persona, augmentation=draft.augmentation,  # type: ignore[arg-type]
                          scores=scores, accepted=not decide(scores, cfg), reasons=reasons,
                          parents=chain_parents, run_id=run_id, provenance=provenance))
    return tasks, rejections
