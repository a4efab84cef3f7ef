"""Quality scores for synthesized queries and the accept/reject decision (ASTRA §1a.3).

Three scores in 0..1: clarity (the request says what is wanted and gives the values needed),
realism (reads like a user, not like an API call), tool necessity (it cannot be answered without
the tools). A task is accepted only when every score reaches its threshold (`cfg.sft.min_*`);
rejected tasks are kept (`Task.accepted = False`) with one reason per failed threshold.

Offline (`RuleQueryScorer`): rules over the query text, the tools' schemas and the values it
states. openai (`ModelQueryScorer`): the `sft_score_query` judge prompt.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable, Sequence
from typing import Protocol

from arenaforge.schemas.base import Provenance
from arenaforge.schemas.config import Config, SftConfig
from arenaforge.schemas.errors import ParseError, ProviderError
from arenaforge.schemas.models import Rejection, Task, Tool
from arenaforge.tasks.models import ChatModel, complete_json
from arenaforge.tasks.prompts import load_prompt
from arenaforge.tasks.sft.synthesize_queries import QueryDraft, clause
from arenaforge.tasks.sft.tool_graph import humanize, id_like, param_fields

SCORES = ("clarity", "realism", "tool_necessity")
_SNAKE = re.compile(r"\b[a-z]+_[a-z_]+\b")
_TOKENS = re.compile(r"[a-z]{3,}")


def _tokens(text: str) -> set[str]:
    return set(_TOKENS.findall(text.lower()))


class QueryScorer(Protocol):
    async def score(self, draft: QueryDraft, tools: Sequence[Tool]) -> tuple[dict[str, float], str]: ...


class RuleQueryScorer:
    async def score(self, draft: QueryDraft, tools: Sequence[Tool]) -> tuple[dict[str, float], str]:
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
        return scores, "; ".join(notes)


def _clip(x: float) -> float:
    return round(max(0.0, min(1.0, x)), 4)


SCORE_SCHEMA = {
    "type": "object",
    "properties": {**{k: {"type": "number", "minimum": 0, "maximum": 1} for k in SCORES}, "rationale": {"type": "string"}},
    "required": list(SCORES),
}


class ModelQueryScorer:
    def __init__(self, model: ChatModel) -> None:
        self.model = model
        self.prompt = load_prompt("sft_score_query")

    async def score(self, draft: QueryDraft, tools: Sequence[Tool]) -> tuple[dict[str, float], str]:
        from arenaforge.tasks.sft.tool_graph import _tool_lines

        text = self.prompt.render(query=draft.query, tools=_tool_lines(tools))
        out = await complete_json(self.model, "score_query", [{"role": "user", "content": text}], SCORE_SCHEMA)
        return {k: _clip(float(out[k])) for k in SCORES}, str(out.get("rationale", ""))


def query_scorer(cfg: Config, model: ChatModel | None) -> QueryScorer:
    scorers: dict[str, Callable[[], QueryScorer]] = {
        "offline": lambda: RuleQueryScorer(),
        "openai": lambda: ModelQueryScorer(model),  # type: ignore[arg-type]
    }
    return scorers[cfg.model.backend]()


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
            rejections.append(Rejection(stage="score_query", subject=draft.query[:200], reason="model_failed",
                                        detail=str(result)[:1000], run_id=run_id))
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
