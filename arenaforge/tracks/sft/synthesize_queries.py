"""User queries ("tasks") for the SFT track: chain-conditioned and server-only, plus augmentations (ASTRA §1a.3).

A `QueryWriter` asks the run's model to turn a verified chain (or a server spec alone) into a base
query (prompt `sft_write_query`), then one variant per augmentation axis (`sft_augment_query`):
diversity (new framing and context), complexity (added constraints from optional parameters),
persona (a user voice). Variants keep the language, the intent and the concrete values of the base
query. An answer may also say which tools the query needs and which parameter values it states
(the offline provider always does: `tracks/sft/offline_queries.py` composes queries from the tools'
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
from types import ModuleType
from typing import Any

from arenaforge.schemas.errors import ParseError, ProviderError
from arenaforge.schemas.models import Rejection, Server, Tool, ToolChain
from arenaforge.services.models import ChatModel, Step, complete_json
from arenaforge.services.models.text_schemas import nameable, sentence_naming
from arenaforge.tracks.sft.prompts import load_prompt
from arenaforge.tracks.sft.tool_graph import humanize, id_like, output_fields, param_fields
from arenaforge.tracks.sft.tool_simulator import sample_value


def _offline_rules() -> ModuleType:
    from arenaforge.tracks.sft import offline_queries  # its rules read this module's types: loaded after it

    return offline_queries


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


def value_text(value: Any) -> str:
    """A value as a query states it: a string as is, anything else as JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def mention(name: str, value: Any, marks: str = '""') -> str:
    """`<parameter words> "<value>"`; `marks` other quotes (a query whose schema names values holds no `"`)."""
    return f"{humanize(name)} {marks[0]}{value_text(value)}{marks[1]}"


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


QUERY_SCHEMA = {
    "type": "object",
    "properties": {"query": {"type": "string", "minLength": 1},
                   "tools": {"type": "array", "items": {"type": "string"},
                             "description": "The tools the request needs, in order (optional)."},
                   "values": {"type": "object", "description": "Parameter -> value the request states (optional)."}},
    "required": ["query"],
}
# with program values (sft.query_values = program) the query prompt is sft_write_query_values
WRITE_QUERY = Step("sft.write_query", prompt="sft_write_query", schema=QUERY_SCHEMA, max_tokens=250,
                   offline=lambda: _offline_rules().write_query)
AUGMENT_SCHEMA = {
    "type": "object",
    "properties": {"query": {"type": "string", "minLength": 1}, "persona": {"type": ["string", "null"]},
                   "values": {"type": "object"}},
    "required": ["query"],
}
AUGMENT_QUERY = Step("sft.augment_query", prompt="sft_augment_query", schema=AUGMENT_SCHEMA, max_tokens=250,
                     offline=lambda: _offline_rules().augment_query)


@dataclass(frozen=True)
class WriteInputs:
    """What the query prompt is rendered from, plus the job's random stream (offline values are drawn from it).
    `planned`/`values`: the tools and the values the program chose (sft.query_values = program), else None/{}."""

    server: Server
    tools: tuple[Tool, ...]
    chain: ToolChain | None
    rng: random.Random = field(compare=False)
    planned: tuple[str, ...] | None = None
    values: dict[str, dict[str, Any]] = field(default_factory=dict, compare=False)


def naming_schema(values: Sequence[Any]) -> dict[str, Any]:
    """An answer that is only `query`: one sentence that names each value, in the order given (see
    `sentence_naming`); values a JSON string cannot hold unescaped are left to the words. No other key: given
    QUERY_SCHEMA's optional `tools` and `values`, a 135M model went on writing them until its budget cut the JSON."""
    texts = [t for t in (value_text(v) for v in values) if nameable(t)]
    return {"type": "object", "properties": {"query": sentence_naming(texts)}, "required": ["query"],
            "additionalProperties": False}


@dataclass(frozen=True)
class AugmentInputs:
    axis: str
    base: QueryDraft
    server: Server
    tools: tuple[Tool, ...]
    rng: random.Random = field(compare=False)


class QueryWriter:
    """The run's model writes the base query and each augmentation."""

    def __init__(self, model: ChatModel, augmentations: Sequence[str], program_values: bool = False) -> None:
        self.model = model
        self.augmentations = [a for a in augmentations if a in AUGMENTATIONS]
        # program values: the program draws what the user states from the parameter schemas and the schema makes
        # the model's query name each value (a 135M model otherwise writes "..." or the server's name)
        self.program_values = program_values
        self.write_prompt = load_prompt("sft_write_query_values" if program_values else WRITE_QUERY.prompt)
        self.augment_prompt = load_prompt(AUGMENT_QUERY.prompt)

    async def write(self, server: Server, tools: Sequence[Tool], chain: ToolChain | None,
                    rng: random.Random) -> list[QueryDraft]:
        from arenaforge.tracks.sft.tool_graph import tool_lines

        by_name = {t.function.name: t for t in tools}
        steps = [by_name[n] for n in chain.tools] if chain else list(tools)
        if self.program_values:
            return [await self._write_clauses(server, tools, chain, steps if chain else [rng.choice(steps)], rng)]
        mode = "chain" if chain else "server"
        instruction = (f"The request must need these tools in this order: {' -> '.join(chain.tools)}." if chain
                       else "Pick whichever of the tools a realistic request would need.")
        inputs = WriteInputs(server, tuple(tools), chain, rng)
        render = functools.partial(self.write_prompt.render, server=server.title or server.name,
                                   description=server.description, tools=tool_lines(steps), instruction=instruction)
        answer = await complete_json(self.model, WRITE_QUERY, render, inputs=inputs)
        names = tuple(chain.tools) if chain else tuple(n for n in answer.get("tools") or [] if n in by_name)
        values = dict(answer.get("values") or {})
        base = QueryDraft(server.name, mode, answer["query"], names, chain.id if chain else None, values=values)
        drafts = [base]
        for aug in self.augmentations:
            out = await complete_json(self.model, AUGMENT_QUERY, lambda aug=aug: self.augment_prompt.render(
                axis=aug, query=base.query, server=server.title or server.name),
                inputs=AugmentInputs(aug, base, server, tuple(tools), rng))
            drafts.append(QueryDraft(server.name, mode, out["query"], names, base.chain_id,
                                     out.get("persona") if aug == "persona" else None, aug,
                                     dict(out.get("values") or {}), base.query))
        return drafts

    async def _write_clauses(self, server: Server, tools: Sequence[Tool], chain: ToolChain | None,
                             steps: Sequence[Tool], rng: random.Random) -> QueryDraft:
        """sft.query_values = program: the program draws the values the user states, and the model writes one
        sentence per tool that names that tool's values, asked apart (a 135M model asked for a whole chain at once
        copied the prompt's example and ran on; per tool, its sentences finished and named their values). The
        query is the sentences in chain order. No augmentations: their schema would have to name every value again."""
        per_tool = user_values(steps, rng)
        sentences = []
        for tool in steps:
            values = per_tool[tool.function.name]
            gives = ("The user gives: " + ", ".join(mention(k, v) for k, v in values.items()) + ".") if values else ""
            render = functools.partial(self.write_prompt.render, server=server.title or server.name,
                                       wants=clause(tool), gives=gives)
            schema = naming_schema(list(values.values()))
            inputs = WriteInputs(server, tuple(tools), chain, rng, (tool.function.name,), {tool.function.name: values})
            sentences.append((await complete_json(self.model, WRITE_QUERY, render, schema, inputs=inputs))["query"])
        planned = {k: v for vs in per_tool.values() for k, v in vs.items()}  # two tools may share a parameter name
        return QueryDraft(server.name, "chain" if chain else "server", " ".join(sentences),
                          tuple(t.function.name for t in steps), chain.id if chain else None, values=planned)


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
