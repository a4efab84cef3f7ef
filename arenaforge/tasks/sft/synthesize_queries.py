"""User queries ("tasks") for the SFT track: chain-conditioned and server-only, plus augmentations (ASTRA §1a.3).

A `QueryWriter` turns a verified chain (or a server spec alone) into a base query, then writes one
variant per augmentation axis: diversity (new framing and context), complexity (added constraints
from optional parameters), persona (a user voice). Variants keep the language, the intent and
the concrete values of the base query.

Offline (`TemplateQueryWriter`): built from the tools' own descriptions and parameter schemas with
values sampled from the schemas (seeded); every concrete value is written as `<parameter words>
"<value>"`, which the offline agent reads back. openai (`ModelQueryWriter`): prompts
`sft_write_query` and `sft_augment_query`. Scores and acceptance come from `score_queries`.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from arenaforge.schemas.config import Config
from arenaforge.schemas.errors import ParseError, ProviderError
from arenaforge.schemas.models import Rejection, Server, Tool, ToolChain
from arenaforge.tasks.models import ChatModel, complete_json
from arenaforge.tasks.prompts import load_prompt
from arenaforge.tasks.sft.tool_graph import humanize, id_like, output_fields, param_fields
from arenaforge.tasks.sft.tool_simulator import sample_value

AUGMENTATIONS = ("diversity", "complexity", "persona")
_ROLES = ["small-business owner", "graduate student", "travel agent", "software engineer", "retired teacher",
          "operations manager", "journalist", "nurse on night shifts", "event planner", "data analyst"]
_STYLES = ["terse", "polite", "chatty", "precise"]
_CUT = re.compile(r"(,|;|\.|\(| and return| returning| which | that returns| - )", re.IGNORECASE)


@dataclass(frozen=True)
class QueryDraft:
    """A query before scoring: the text plus what it was written from."""

    server: str
    mode: str  # chain | server
    query: str
    tools: tuple[str, ...]
    chain_id: str | None = None
    persona: str | None = None
    augmentation: str = "none"
    values: dict[str, Any] = field(default_factory=dict, hash=False)  # parameter -> value stated in the query
    base: str | None = None  # the base query of an augmentation


def clause(tool: Tool) -> str:
    """The tool's purpose as an imperative clause: its description's first phrase, lower-cased."""
    text = tool.function.description.strip()
    first = _CUT.split(text, maxsplit=1)[0].strip() or humanize(tool.function.name)
    first = first[0].lower() + first[1:] if first else first
    if first.lower().startswith(("gets ", "returns ", "retrieves ", "creates ", "lists ", "searches ", "fetches ")):
        first = first.split(" ", 1)[0][:-1].lower() + " " + first.split(" ", 1)[1]
    return first.rstrip(".")


def mention(name: str, value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return f'{humanize(name)} "{text}"'


def user_values(chain: Sequence[Tool], rng: random.Random, optional_share: float = 0.0) -> dict[str, dict[str, Any]]:
    """Values the user must state: required parameters not fed by an earlier call (per tool)."""
    produced: set[str] = set()
    values: dict[str, dict[str, Any]] = {}
    for i, tool in enumerate(chain):
        props = tool.function.parameters.get("properties") or {}
        chosen = {}
        for p in param_fields(tool):
            fed = re.sub(r"[^a-z0-9]", "", p.name.lower()) in produced
            if fed and i > 0:
                continue
            if p.required or (optional_share and rng.random() < optional_share):
                if i > 0 and id_like(p.name) and not p.required:
                    continue
                chosen[p.name] = sample_value(props.get(p.name, {}), p.name, rng, hint=tool.function.description)
        values[tool.function.name] = chosen
        produced |= {re.sub(r"[^a-z0-9]", "", f.name.lower()) for f in output_fields(tool)}
    return values


class QueryWriter(Protocol):
    async def write(self, server: Server, tools: Sequence[Tool], chain: ToolChain | None,
                    rng: random.Random) -> list[QueryDraft]: ...


class TemplateQueryWriter:
    """Offline: compose from descriptions + schema-sampled values; augment programmatically."""

    def __init__(self, augmentations: Sequence[str]) -> None:
        self.augmentations = [a for a in augmentations if a in AUGMENTATIONS]

    async def write(self, server: Server, tools: Sequence[Tool], chain: ToolChain | None,
                    rng: random.Random) -> list[QueryDraft]:
        by_name = {t.function.name: t for t in tools}
        if chain is not None:
            steps = [by_name[n] for n in chain.tools]
            mode = "chain"
        else:
            steps = [rng.choice(list(tools))]
            mode = "server"
        values = user_values(steps, rng)
        base = self._compose(steps, values, rng, style=None)
        flat = {k: v for vs in values.values() for k, v in vs.items()}
        drafts = [QueryDraft(server.name, mode, base, tuple(t.function.name for t in steps),
                             chain.id if chain else None, values=flat)]
        for aug in self.augmentations:
            drafts.append(self._augment(aug, server, steps, values, base, drafts[0], rng))
        return drafts

    def _compose(self, steps: Sequence[Tool], values: dict[str, dict[str, Any]], rng: random.Random,
                 style: str | None, connectors: Sequence[str] = ("First", "Then", "After that", "Finally")) -> str:
        parts = []
        for i, tool in enumerate(steps):
            vals = values.get(tool.function.name, {})
            text = clause(tool)
            if vals:
                text += " for " + ", ".join(mention(k, v) for k, v in vals.items())
            if len(steps) > 1:
                word = connectors[min(i, len(connectors) - 2)] if i < len(steps) - 1 else connectors[-1]
                text = f"{word}, {text}"
            parts.append(text)
        body = ". ".join(p[0].upper() + p[1:] for p in parts) + "."
        opener = {"polite": "Could you please help me? ", "chatty": "Hi there! I have a few things to sort out. ",
                  "terse": "", "precise": "Task: "}.get(style or "", "Please help me with this. ")
        return opener + body

    def _augment(self, aug: str, server: Server, steps: Sequence[Tool], values: dict[str, dict[str, Any]],
                 base: str, draft: QueryDraft, rng: random.Random) -> QueryDraft:
        persona = None
        if aug == "diversity":
            context = server.description or server.title or server.name
            query = (f"I'm using {server.title or server.name}" + (f" ({context.rstrip('.')})" if context else "") + ". "
                     + self._compose(steps, values, rng, style="precise",
                                     connectors=("To begin", "Next", "Following that", "Lastly"))[len("Task: "):])
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
            query = self._compose(steps, richer, rng, style=None) + constraint
            values = richer
        else:  # persona
            persona = f"{rng.choice(_ROLES)}, {rng.choice(_STYLES)}"
            role, style = persona.split(", ")
            body = self._compose(steps, values, rng, style=style)
            article = "an" if role[0] in "aeiou" else "a"
            query = f"As {article} {role}, " + body[0].lower() + body[1:]
            if style == "polite":
                query += " Thank you!"
        flat = {k: v for vs in values.values() for k, v in vs.items()}
        return QueryDraft(draft.server, draft.mode, query, draft.tools, draft.chain_id, persona, aug, flat, base)


QUERY_SCHEMA = {"type": "object", "properties": {"query": {"type": "string", "minLength": 1}}, "required": ["query"]}
AUGMENT_SCHEMA = {
    "type": "object",
    "properties": {"query": {"type": "string", "minLength": 1}, "persona": {"type": ["string", "null"]}},
    "required": ["query"],
}


class ModelQueryWriter:
    """openai: the model writes the base query and each augmentation."""

    def __init__(self, model: ChatModel, augmentations: Sequence[str]) -> None:
        self.model = model
        self.augmentations = [a for a in augmentations if a in AUGMENTATIONS]
        self.write_prompt = load_prompt("sft_write_query")
        self.augment_prompt = load_prompt("sft_augment_query")

    async def write(self, server: Server, tools: Sequence[Tool], chain: ToolChain | None,
                    rng: random.Random) -> list[QueryDraft]:
        from arenaforge.tasks.sft.tool_graph import _tool_lines

        by_name = {t.function.name: t for t in tools}
        steps = [by_name[n] for n in chain.tools] if chain else list(tools)
        mode = "chain" if chain else "server"
        instruction = (f"The request must need these tools in this order: {' -> '.join(chain.tools)}." if chain
                       else "Pick whichever of the tools a realistic request would need.")
        text = self.write_prompt.render(server=server.title or server.name, description=server.description,
                                        tools=_tool_lines(steps), instruction=instruction)
        answer = await complete_json(self.model, "write_query", [{"role": "user", "content": text}], QUERY_SCHEMA)
        names = tuple(t.function.name for t in steps) if chain else ()
        base = QueryDraft(server.name, mode, answer["query"], names, chain.id if chain else None)
        drafts = [base]
        for aug in self.augmentations:
            prompt = self.augment_prompt.render(axis=aug, query=base.query, server=server.title or server.name)
            out = await complete_json(self.model, "augment_query", [{"role": "user", "content": prompt}], AUGMENT_SCHEMA)
            drafts.append(QueryDraft(server.name, mode, out["query"], names, base.chain_id,
                                     out.get("persona") if aug == "persona" else None, aug, {}, base.query))
        return drafts


def query_writer(cfg: Config, model: ChatModel | None) -> QueryWriter:
    writers: dict[str, Callable[[], QueryWriter]] = {
        "offline": lambda: TemplateQueryWriter(cfg.sft.augmentations),
        "openai": lambda: ModelQueryWriter(model, cfg.sft.augmentations),  # type: ignore[arg-type]
    }
    return writers[cfg.model.backend]()


async def write_queries(jobs: Sequence[tuple[Server, Sequence[Tool], ToolChain | None, random.Random]],
                        writer: QueryWriter) -> tuple[list[QueryDraft], list[Rejection]]:
    """Drafts for every (server, tools, chain-or-None, rng) job; model failures become rejections."""
    results = await asyncio.gather(*[writer.write(s, t, c, r) for s, t, c, r in jobs], return_exceptions=True)
    drafts: list[QueryDraft] = []
    rejections: list[Rejection] = []
    for (server, _, chain, _), result in zip(jobs, results, strict=True):
        if isinstance(result, (ParseError, ProviderError)):
            rejections.append(Rejection(stage="write_query", subject=chain.id if chain else server.name,
                                        reason="model_failed", detail=str(result)[:1000]))
        elif isinstance(result, BaseException):
            raise result
        else:
            drafts += result
    return drafts, rejections
