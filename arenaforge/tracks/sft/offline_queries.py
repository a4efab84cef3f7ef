"""Offline answers of `sft.write_query` and `sft.augment_query`: queries composed from the tools themselves.

A query states each tool's purpose (the first phrase of its description) in chain order, with the values
the user must give (required parameters no earlier call feeds) sampled from the parameter schemas and
written as `<parameter words> "<value>"`, which the offline agent reads back. Server-only tasks pick one
tool. Augmentations: diversity (the service's context, other connectives), complexity (optional
parameters added, a constraint sentence), persona (a role and a style). Values come from the job's
random stream, in request order.
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence
from typing import Any

from arenaforge.schemas.models import Server, Tool
from arenaforge.services.models import ChatRequest
from arenaforge.services.models.providers.offline import OfflineModel
from arenaforge.services.models.text_schemas import SENTENCE_WORD, SentenceBounds
from arenaforge.tracks.sft.synthesize_queries import (
    AugmentInputs,
    QueryDraft,
    WriteInputs,
    clause,
    mention,
    user_values,
)
from arenaforge.tracks.sft.tool_graph import humanize, param_fields
from arenaforge.tracks.sft.tool_simulator import sample_value

_ROLES = ["small-business owner", "graduate student", "travel agent", "software engineer", "retired teacher",
          "operations manager", "journalist", "nurse on night shifts", "event planner", "data analyst"]
_STYLES = ["terse", "polite", "chatty", "precise"]


def write_query(request: ChatRequest, model: OfflineModel) -> dict[str, Any]:
    inputs: WriteInputs = request.inputs
    by_name = {t.function.name: t for t in inputs.tools}
    rng = inputs.rng
    if inputs.planned is not None:  # the program chose the tools and values (sft.query_values = program): the
        # schema asks for one sentence and nothing but `query`, and bars `"`
        return {"query": one_sentence([by_name[n] for n in inputs.planned], inputs.values, "''")}
    steps = [by_name[n] for n in inputs.chain.tools] if inputs.chain is not None else [rng.choice(list(inputs.tools))]
    values, marks = user_values(steps, rng), '""'
    query = compose(steps, values, rng, style=None, marks=marks)
    model.state[("sft.query", inputs.server.name, query)] = (steps, values, marks)  # what the augmentations start from
    return {"query": query, "tools": [t.function.name for t in steps],
            "values": {k: v for vs in values.values() for k, v in vs.items()}}


def augment_query(request: ChatRequest, model: OfflineModel) -> dict[str, Any]:
    inputs: AugmentInputs = request.inputs
    steps, values, marks = model.state[("sft.query", inputs.server.name, inputs.base.query)]
    draft = _augment(inputs.axis, inputs.server, steps, values, inputs.base.query, inputs.base, inputs.rng, marks)
    return {"query": draft.query, "persona": draft.persona, "values": draft.values}


def compose(steps: Sequence[Tool], values: dict[str, dict[str, Any]], rng: random.Random,
            style: str | None, connectors: Sequence[str] = ("First", "Then", "After that", "Finally"),
            marks: str = '""') -> str:
    parts = []
    for i, tool in enumerate(steps):
        vals = values.get(tool.function.name, {})
        text = clause(tool)
        if vals:
            text += " for " + ", ".join(mention(k, v, marks) for k, v in vals.items())
        if len(steps) > 1:
            word = connectors[min(i, len(connectors) - 2)] if i < len(steps) - 1 else connectors[-1]
            text = f"{word}, {text}"
        parts.append(text)
    body = ". ".join(p[0].upper() + p[1:] for p in parts) + "."
    opener = {"polite": "Could you please help me? ", "chatty": "Hi there! I have a few things to sort out. ",
              "terse": "", "precise": "Task: "}.get(style or "", "Please help me with this. ")
    return opener + body


def one_sentence(steps: Sequence[Tool], values: dict[str, dict[str, Any]], marks: str) -> str:
    """The sentence a program-values schema asks for (`sentence_naming`: an opener, at most `before` plain words
    before the first value, each value in single quotes): the tool's purpose in its plain words, cut short, then its values."""
    bounds = SentenceBounds()
    parts = []
    for tool in steps:
        vals = values.get(tool.function.name, {})
        room = bounds.before - 1 - (len(humanize(next(iter(vals))).split()) if vals else -bounds.after)
        words = [w for w in clause(tool).split() if re.fullmatch(SENTENCE_WORD, w)][:max(room, 1)]
        mentions = ", ".join(mention(k, v, marks) for k, v in vals.items())
        parts.append(" ".join(words) + (" for " + mentions if vals else ""))
    return "Please " + " and then ".join(parts) + "."


def _augment(aug: str, server: Server, steps: Sequence[Tool], values: dict[str, dict[str, Any]],
             base: str, draft: QueryDraft, rng: random.Random, marks: str = '""') -> QueryDraft:
    persona = None
    if aug == "diversity":
        context = server.description or server.title or server.name
        query = (f"I'm using {server.title or server.name}" + (f" ({context.rstrip('.')})" if context else "") + ". "
                 + compose(steps, values, rng, style="precise", connectors=("To begin", "Next", "Following that", "Lastly"),
                           marks=marks)[len("Task: "):])
    elif aug == "complexity":
        extra = {}
        for tool in steps[:1]:
            props = tool.function.parameters.get("properties") or {}
            for p in param_fields(tool):
                if not p.required and p.name not in values.get(tool.function.name, {}):
                    extra[p.name] = sample_value(props.get(p.name, {}), p.name, rng, hint=tool.function.description)
        richer = {k: dict(v) for k, v in values.items()}
        richer[steps[0].function.name].update(extra)
        constraint = " Only report results that match every value I gave, and tell me if any step fails."
        query = compose(steps, richer, rng, style=None, marks=marks) + constraint
        values = richer
    else:  # persona
        persona = f"{rng.choice(_ROLES)}, {rng.choice(_STYLES)}"
        role, style = persona.split(", ")
        body = compose(steps, values, rng, style=style, marks=marks)
        article = "an" if role[0] in "aeiou" else "a"
        query = f"As {article} {role}, " + body[0].lower() + body[1:]
        if style == "polite":
            query += " Thank you!"
    flat = {k: v for vs in values.values() for k, v in vs.items()}
    return QueryDraft(draft.server, draft.mode, query, draft.tools, draft.chain_id, persona, aug, flat, base)
