"""User queries ("tasks") for the SFT track: chain-conditioned and server-only, plus augmentations (ASTRA §1a.3).

A `QueryWriter` asks the run's model to turn a verified chain (or a server spec alone) into a base
query (prompt `sft_write_query`), then one variant per augmentation axis (`sft_augment_query`):
diversity (new framing and context), complexity (added constraints from optional parameters),
persona (a user voice). Variants keep the language, the intent and the concrete values of the base
query. An answer may also say which tools the query needs and which parameter values it states
(the offline provider always does: `tasks/offline/sft_queries.py` composes queries from the tools'
descriptions and schema-sampled values, each written as `<parameter words> "<value>"`). Scores and
acceptance come from `score_queries`.
"""

from __future__ import annotations

import asyncio
import functools
import json
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from arenaforge.schemas.errors import ParseError, ProviderError
from arenaforge.schemas.models import Rejection, Server, Tool, ToolChain
from arenaforge.tasks.models import ChatModel, complete_json
from arenaforge.tasks.prompts import load_prompt
from arenaforge.tasks.sft.tool_graph import humanize

AUGMENTATIONS = ("diversity", "complexity", "persona")
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
    return _clause(tool.function.description, tool.function.name)


@functools.lru_cache(maxsize=65536)  # offline planning looks for every tool's clause in every query it reads
def _clause(description: str, name: str) -> str:
    text = description.strip()
    first = _CUT.split(text, maxsplit=1)[0].strip() or humanize(name)
    first = first[0].lower() + first[1:] if first else first
    if first.lower().startswith(("gets ", "returns ", "retrieves ", "creates ", "lists ", "searches ", "fetches ")):
        first = first.split(" ", 1)[0][:-1].lower() + " " + first.split(" ", 1)[1]
    return first.rstrip(".")


def mention(name: str, value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return f'{humanize(name)} "{text}"'


QUERY_SCHEMA = {
    "type": "object",
    "properties": {"query": {"type": "string", "minLength": 1},
                   "tools": {"type": "array", "items": {"type": "string"},
                             "description": "The tools the request needs, in order (optional)."},
                   "values": {"type": "object", "description": "Parameter -> value the request states (optional)."}},
    "required": ["query"],
}
AUGMENT_SCHEMA = {
    "type": "object",
    "properties": {"query": {"type": "string", "minLength": 1}, "persona": {"type": ["string", "null"]},
                   "values": {"type": "object"}},
    "required": ["query"],
}


@dataclass(frozen=True)
class WriteInputs:
    """What the query prompt is rendered from, plus the job's random stream (offline values are drawn from it)."""

    server: Server
    tools: tuple[Tool, ...]
    chain: ToolChain | None
    rng: random.Random = field(compare=False)


@dataclass(frozen=True)
class AugmentInputs:
    axis: str
    base: QueryDraft
    server: Server
    tools: tuple[Tool, ...]
    rng: random.Random = field(compare=False)


class QueryWriter:
    """The run's model writes the base query and each augmentation."""

    def __init__(self, model: ChatModel, augmentations: Sequence[str]) -> None:
        self.model = model
        self.augmentations = [a for a in augmentations if a in AUGMENTATIONS]
        self.write_prompt = load_prompt("sft_write_query")
        self.augment_prompt = load_prompt("sft_augment_query")

    async def write(self, server: Server, tools: Sequence[Tool], chain: ToolChain | None,
                    rng: random.Random) -> list[QueryDraft]:
        from arenaforge.tasks.sft.tool_graph import tool_lines

        by_name = {t.function.name: t for t in tools}
        steps = [by_name[n] for n in chain.tools] if chain else list(tools)
        mode = "chain" if chain else "server"
        instruction = (f"The request must need these tools in this order: {' -> '.join(chain.tools)}." if chain
                       else "Pick whichever of the tools a realistic request would need.")
        answer = await complete_json(self.model, "sft.write_query", lambda: self.write_prompt.render(
            server=server.title or server.name, description=server.description, tools=tool_lines(steps),
            instruction=instruction), QUERY_SCHEMA, inputs=WriteInputs(server, tuple(tools), chain, rng))
        names = tuple(chain.tools) if chain else tuple(n for n in answer.get("tools") or [] if n in by_name)
        base = QueryDraft(server.name, mode, answer["query"], names, chain.id if chain else None,
                          values=dict(answer.get("values") or {}))
        drafts = [base]
        for aug in self.augmentations:
            out = await complete_json(self.model, "sft.augment_query", lambda aug=aug: self.augment_prompt.render(
                axis=aug, query=base.query, server=server.title or server.name),
                AUGMENT_SCHEMA, inputs=AugmentInputs(aug, base, server, tuple(tools), rng))
            drafts.append(QueryDraft(server.name, mode, out["query"], names, base.chain_id,
                                     out.get("persona") if aug == "persona" else None, aug,
                                     dict(out.get("values") or {}), base.query))
        return drafts


async def write_queries(jobs: Sequence[tuple[Server, Sequence[Tool], ToolChain | None, random.Random]],
                        writer: QueryWriter) -> tuple[list[QueryDraft], list[Rejection]]:
    """Drafts for every (server, tools, chain-or-None, rng) job; model failures become rejections."""
    results = await asyncio.gather(*[writer.write(s, t, c, r) for s, t, c, r in jobs], return_exceptions=True)
    drafts: list[QueryDraft] = []
    rejections: list[Rejection] = []
    for (server, _, chain, _), result in zip(jobs, results, strict=True):
        if isinstance(result, (ParseError, ProviderError)):
            rejections.append(Rejection.of_error("write_query", chain.id if chain else server.name, result))
        elif isinstance(result, BaseException):
            raise result
        else:
            drafts += result
    return drafts, rejections
