"""QA instance synthesis (ASTRA §1b.1): a main question decomposed into a DAG of sub-QAs.

Two implementations of one protocol, picked by `QA_SYNTHESIZERS[cfg.model.backend]`:

* offline — programmatic over the knowledge source's tables. It samples join paths along
  foreign-key links, key lookups and aggregations (count, sum); every sub-answer is the result
  of a query on the source and the SQL is kept as the sub-QA's evidence, in one of three
  canonical forms that environment synthesis reads back:

      SELECT "attr" FROM "table" WHERE "key" = 'v'             (lookup)
      SELECT count(*) FROM "table" WHERE "col" = 'v'           (count)
      SELECT round(sum("attr"), 2) FROM "table" WHERE "col" = 'v'   (sum)

  Structures: single_hop (one lookup/aggregate), parallel_single_hop (the same lookup on
  k entities, compared or listed), multi_hop (a chain of h steps where each step's answer is
  the next step's key), parallel_multi_hop (two chains of h steps joined by a reasoning-only
  comparison). Question-conditioned mode picks the (table, attribute) that best matches a
  seed question's words and builds the chain to end there.

* openai — ASTRA-style prompt (arenaforge/tasks/prompts/envs_decompose.txt) answered as JSON validated
  against `QA_SCHEMA`; when the model gives SQL evidence it is run on the source and must
  reproduce the sub-answer.

Either way the structure label and hop level are computed from the dependency graph, not
trusted from the generator.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import random
import re
from dataclasses import dataclass
from decimal import Decimal
from collections.abc import Callable
from typing import Any, Protocol

from arenaforge.schemas.base import Provenance
from arenaforge.schemas.errors import ParseError, ProviderError
from arenaforge.schemas.models import QAInstance, Rejection, SubQA
from arenaforge.tasks.envs.knowledge import KnowledgeSource, Link
from arenaforge.tasks.prompts import load_prompt

STRUCTURES = ("single_hop", "parallel_single_hop", "multi_hop", "parallel_multi_hop")


@dataclass(frozen=True)
class QASpec:
    """What to synthesize: how many, which structures, the hop budget and the mode."""

    n: int = 20
    min_hops: int = 1
    max_hops: int = 4
    structures: tuple[str, ...] = STRUCTURES
    mode: str = "unconditioned"  # or "conditioned"
    seed_questions: tuple[str, ...] = ()
    parallel_width: int = 2
    seed: int = 0


@dataclass
class QABatch:
    instances: list[QAInstance]
    rejections: list[Rejection]


OnInstance = Callable[[QAInstance], None]


class QASynthesizer(Protocol):
    async def synthesize(self, source: KnowledgeSource, spec: QASpec, on_instance: OnInstance | None = None) -> QABatch:
        """Instances for `spec`; `on_instance` sees each one as soon as it exists (to start verifying it)."""
        ...


# --------------------------------------------------------------------------- graph helpers
def hop_level(subs: list[SubQA]) -> int:
    """Length of the longest dependency path (1 for independent sub-QAs); raises on a cycle."""
    by_index = {s.index: s for s in subs}
    memo: dict[int, int] = {}

    def depth(i: int, stack: frozenset[int]) -> int:
        if i in stack:
            raise ValueError(f"dependency cycle through sub-QA {i}")
        if i not in memo:
            deps = [d for d in by_index[i].depends_on if d in by_index]
            memo[i] = 1 + max((depth(d, stack | {i}) for d in deps), default=0)
        return memo[i]

    return max(depth(s.index, frozenset()) for s in subs)


def is_parallel(subs: list[SubQA]) -> bool:
    """Whether two sub-QAs exist that neither needs (directly or not) the other's answer."""
    by_index = {s.index: s for s in subs}
    ancestors: dict[int, set[int]] = {}

    def anc(i: int) -> set[int]:
        if i not in ancestors:
            ancestors[i] = set()
            for d in by_index[i].depends_on:
                if d in by_index:
                    ancestors[i] |= {d} | anc(d)
        return ancestors[i]

    idx = sorted(by_index)
    return any(b not in anc(a) and a not in anc(b) for k, a in enumerate(idx) for b in idx[k + 1:])


def structure_of(subs: list[SubQA]) -> str:
    multi = hop_level(subs) > 1
    parallel = is_parallel(subs)
    return {(False, False): "single_hop", (False, True): "parallel_single_hop",
            (True, False): "multi_hop", (True, True): "parallel_multi_hop"}[(multi, parallel)]


def make_instance(source: str, main_q: str, main_a: str, subs: list[SubQA], mode: str = "unconditioned",
                  seed_question: str | None = None, provenance: Provenance | None = None) -> QAInstance:
    return QAInstance(source=source, main_question=main_q, main_answer=main_a, sub_qas=subs,
                      hop_level=hop_level(subs), parallel=is_parallel(subs), structure=structure_of(subs),  # type: ignore[arg-type]
                      mode=mode, seed_question=seed_question, provenance=provenance)  # type: ignore[arg-type]


# --------------------------------------------------------------------------- text helpers
def fmt_value(value: Any) -> str | None:
    """A source value as answer text (None for NULL)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (float, Decimal)):
        f = float(value)
        return str(int(f)) if f.is_integer() else f"{f:.2f}".rstrip("0").rstrip(".")
    if isinstance(value, (dt.date, dt.datetime)):
        return value.isoformat()
    return str(value)


def entity(table: str) -> str:
    words = table.replace("_", " ")
    if words.endswith("ies"):
        return words[:-3] + "y"
    return words[:-1] if words.endswith("s") and not words.endswith("ss") else words


def human(column: str) -> str:
    return column.replace("_", " ")


def sql_literal(value: Any) -> str:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return repr(value)
    return "'" + str(value).replace("'", "''") + "'"


# --------------------------------------------------------------------------- offline steps
@dataclass(frozen=True)
class Step:
    """One tool-answerable operation: lookup(table.attr by key), count(table by col), sum(table.attr by col)."""

    op: str
    table: str
    by: str
    attr: str | None = None

    def sql(self, value: Any) -> str:
        lit = sql_literal(value)
        if self.op == "lookup":
            return f'SELECT "{self.attr}" FROM "{self.table}" WHERE "{self.by}" = {lit}'
        if self.op == "count":
            return f'SELECT count(*) FROM "{self.table}" WHERE "{self.by}" = {lit}'
        return f'SELECT round(sum("{self.attr}"), 2) FROM "{self.table}" WHERE "{self.by}" = {lit}'

    def question(self, value: Any) -> str:
        if self.op == "lookup":
            return f"What is the {human(self.attr or '')} of the {entity(self.table)} {value}?"
        if self.op == "count":
            return f"How many {human(self.table)} have {human(self.by)} {value}?"
        return f"What is the total {human(self.attr or '')} of the {human(self.table)} with {human(self.by)} {value}?"

    def describe(self) -> str:
        """The final step as a phrase about 'that <entity>' (for composed main questions)."""
        if self.op == "lookup":
            return f"the {human(self.attr or '')} of that {entity(self.table)}"
        if self.op == "count":
            return f"the number of {human(self.table)} with that {human(self.by)}"
        return f"the total {human(self.attr or '')} of the {human(self.table)} with that {human(self.by)}"


_STEP_SQL = [
    ("lookup", re.compile(r'^SELECT "(?P<attr>\w+)" FROM "(?P<table>\w+)" WHERE "(?P<by>\w+)" = (?P<val>.+)$')),
    ("count", re.compile(r'^SELECT count\(\*\) FROM "(?P<table>\w+)" WHERE "(?P<by>\w+)" = (?P<val>.+)$')),
    ("sum", re.compile(r'^SELECT round\(sum\("(?P<attr>\w+)"\), 2\) FROM "(?P<table>\w+)" WHERE "(?P<by>\w+)" = (?P<val>.+)$')),
]


def parse_evidence(sql: str | None) -> tuple[Step, Any] | None:
    """(Step, argument value) from a canonical evidence SQL, or None."""
    if not sql:
        return None
    for op, pattern in _STEP_SQL:
        m = pattern.match(sql.strip())
        if m:
            raw = m.group("val")
            if raw.startswith("'"):
                value: Any = raw[1:-1].replace("''", "'")
            else:
                value = float(raw) if "." in raw else int(raw)
            return Step(op, m.group("table"), m.group("by"), m.groupdict().get("attr")), value
    return None


class OfflineQASynthesizer:
    """Deterministic, seeded QA synthesis over the source's tables (see module docstring)."""

    def __init__(self, attempts_per_instance: int = 8) -> None:
        self.attempts = attempts_per_instance

    async def synthesize(self, source: KnowledgeSource, spec: QASpec, on_instance: OnInstance | None = None) -> QABatch:
        rng = random.Random(f"{spec.seed}:{source.name}")
        allowed = [s for s in spec.structures if _structure_fits(s, spec)]
        out: dict[str, QAInstance] = {}
        rejections: list[Rejection] = []
        seeds = list(spec.seed_questions or source.seed_questions)
        prov = Provenance(backend="offline", seed=spec.seed)
        if not allowed:
            rejections.append(Rejection(stage="decompose_qa", subject=source.name, reason="hop_budget",
                                        detail=f"no structure fits hops {spec.min_hops}..{spec.max_hops}"))
            return QABatch([], rejections)
        for k in range(spec.n):
            structure = allowed[k % len(allowed)]
            seed_q = seeds[rng.randrange(len(seeds))] if (spec.mode == "conditioned" and seeds) else None
            made = None
            for _ in range(self.attempts):
                made = self._one(source, spec, structure, rng, seed_q)
                if made is not None and made.id not in out:
                    break
                made = None
            if made is None:
                rejections.append(Rejection(
                    stage="decompose_qa", subject=f"{source.name}:{structure}:{k}", reason="no_join_path",
                    detail=f"no {structure} instance with hops {spec.min_hops}..{spec.max_hops} found in {self.attempts} tries",
                    payload={"structure": structure, "seed_question": seed_q}))
                continue
            out[made.id] = made.model_copy(update={"provenance": prov})
            if on_instance is not None:
                on_instance(out[made.id])
        return QABatch(list(out.values()), rejections)

    # ------------------------------------------------------------------ building blocks
    def _one(self, source: KnowledgeSource, spec: QASpec, structure: str, rng: random.Random,
             seed_q: str | None) -> QAInstance | None:
        target = _target_for(source, seed_q, rng) if seed_q else None
        mode = "conditioned" if seed_q else "unconditioned"
        if structure in ("single_hop", "parallel_single_hop"):
            chains = [[]]  # no links: one step on one table
        else:
            lo, hi = max(2, spec.min_hops), spec.max_hops
            if structure == "parallel_multi_hop":  # a final comparison may add one hop
                lo, hi = max(2, lo - 1), max(2, hi - rng.randint(0, 1))
            chains = _paths(source, rng.randint(lo, hi) - 1 if hi >= lo else 0)
            if not chains:
                return None
        path = _pick(chains, rng, target)
        final = _final_step(source, path, rng, target)
        if final is None:
            return None
        start = path[0].table if path else final.table
        width = spec.parallel_width if structure.startswith("parallel") else 1
        starts = _start_values(source, start, path, final, width, rng)
        if starts is None:
            return None
        subs: list[SubQA] = []
        ends: list[tuple[Any, str]] = []  # (start value, final answer) per chain
        for x0 in starts:
            resolved = _run_chain(source, path, final, x0, subs)
            if resolved is not None:
                ends.append((x0, resolved))
            if len(ends) >= (width + 2 if width > 1 else 1):  # spares let parallel chains differ
                break
        made = _compose(source.name, structure, path, final, start, ends, subs, mode, seed_q)
        if made is None or made.structure != structure or not spec.min_hops <= made.hop_level <= spec.max_hops:
            return None  # e.g. a comparison step pushed the hop level past the budget: try another sample
        return made


def _structure_fits(structure: str, spec: QASpec) -> bool:
    if structure in ("single_hop", "parallel_single_hop"):
        return spec.min_hops <= 1 <= spec.max_hops
    return spec.max_hops >= max(2, spec.min_hops)


def _paths(source: KnowledgeSource, length: int) -> list[list[Link]]:
    """Every simple path of `length` links along foreign keys."""
    out: list[list[Link]] = []

    def walk(path: list[Link], seen: set[str]) -> None:
        if len(path) == length:
            out.append(list(path))
            return
        for link in source.links_from(path[-1].ref_table):
            if link.ref_table not in seen and not _identity(source, link):
                walk(path + [link], seen | {link.ref_table})

    for link in source.links:
        if source.tables.get(link.table) and source.tables.get(link.ref_table) and not _identity(source, link):
            walk([link], {link.table, link.ref_table})
    return out


def _identity(source: KnowledgeSource, link: Link) -> bool:
    # a key that is also a foreign key (1:1 tables) makes a hop whose answer is its own question
    return link.column == source.tables[link.table].key


def _tokens(text: str) -> set[str]:
    words = re.findall(r"[a-z]+", text.lower())
    return {w[:-1] if w.endswith("s") and len(w) > 3 else w for w in words}


def _target_for(source: KnowledgeSource, seed_q: str, rng: random.Random) -> tuple[str, str] | None:
    """The (table, attribute) whose words overlap the seed question most."""
    q = _tokens(seed_q)
    scored = []
    for t in source.tables.values():
        for a in t.attributes:
            score = len(q & _tokens(a)) * 2 + len(q & _tokens(t.name))
            scored.append((score, rng.random(), t.name, a))
    if not scored:
        return None
    best = max(scored)
    return (best[2], best[3]) if best[0] > 0 else None


def _pick(chains: list[list[Link]], rng: random.Random, target: tuple[str, str] | None) -> list[Link]:
    if target:
        ending = [c for c in chains if c and c[-1].ref_table == target[0]]
        if ending:
            return ending[rng.randrange(len(ending))]
    return chains[rng.randrange(len(chains))]


def _final_step(source: KnowledgeSource, path: list[Link], rng: random.Random,
                target: tuple[str, str] | None) -> Step | None:
    table = path[-1].ref_table if path else None
    if table is None:
        if target:
            table = target[0]
        else:
            usable = [t for t in source.tables.values() if t.attributes]
            if not usable:
                return None
            table = usable[rng.randrange(len(usable))].name
    t = source.tables[table]
    used = {link.column for link in source.links_from(table)}
    options: list[Step] = []
    if target and target[0] == table:
        options.append(Step("lookup", table, t.key or "", target[1]))
    else:
        options += [Step("lookup", table, t.key or "", a) for a in t.attributes if a not in used]
        if path:  # aggregates over rows that reference this entity
            for link in source.links_to(table):
                child = source.tables[link.table]
                options.append(Step("count", link.table, link.column))
                options += [Step("sum", link.table, link.column, a) for a in child.attributes
                            if child.column(a).numeric and a != link.column]
    if not options:
        return None
    return options[rng.randrange(len(options))]


def _start_values(source: KnowledgeSource, table: str, path: list[Link], final: Step, width: int,
                  rng: random.Random) -> list[Any] | None:
    key = source.tables[table].key
    if final.op != "lookup" and not path:
        values = _distinct(source, final.table, final.by)
    else:
        values = _distinct(source, table, key or "")
    if len(values) < width:
        return None
    return rng.sample(values, min(len(values), width * 8))


_DISTINCT: dict[tuple[int, str, str], list[Any]] = {}


def _distinct(source: KnowledgeSource, table: str, column: str) -> list[Any]:
    key = (id(source.con), table, column)
    if key not in _DISTINCT:
        rows = source.query(f'SELECT DISTINCT "{column}" FROM "{table}" WHERE "{column}" IS NOT NULL ORDER BY 1')
        _DISTINCT[key] = [r[0] for r in rows]
    return _DISTINCT[key]


def _scalar(source: KnowledgeSource, sql: str) -> Any:
    rows = source.query(sql)
    return rows[0][0] if rows else None


def _run_chain(source: KnowledgeSource, path: list[Link], final: Step, x0: Any, subs: list[SubQA]) -> str | None:
    """Append the chain's sub-QAs (lookups along `path`, then `final`) starting at x0; its final answer."""
    value: Any = x0
    prev: int | None = None
    staged: list[SubQA] = []
    base = len(subs)
    for link in path:
        step = Step("lookup", link.table, source.tables[link.table].key or "", link.column)
        sql = step.sql(value)
        nxt = _scalar(source, sql)
        if nxt is None:
            return None
        idx = base + len(staged) + 1
        staged.append(SubQA(index=idx, question=step.question(value), answer=fmt_value(nxt) or "",
                            depends_on=[prev] if prev else [], needs_tool=True, evidence=sql))
        prev, value = idx, nxt
    sql = final.sql(value)
    answer = fmt_value(_scalar(source, sql))
    if answer is None or answer == "":
        return None
    idx = base + len(staged) + 1
    staged.append(SubQA(index=idx, question=final.question(value), answer=answer,
                        depends_on=[prev] if prev else [], needs_tool=True, evidence=sql))
    subs.extend(staged)
    return answer


def _compose(source: str, structure: str, path: list[Link], final: Step, start: str,
             ends: list[tuple[Any, str]], subs: list[SubQA], mode: str, seed_q: str | None) -> QAInstance | None:
    """Trim the over-sampled chains to the structure's width and write the main question."""
    per_chain = len(path) + 1
    width = 1 if structure in ("single_hop", "multi_hop") else 2
    chains = [(x0, ans, subs[i * per_chain:(i + 1) * per_chain]) for i, (x0, ans) in enumerate(ends)]
    numeric = all(_is_number(a) for _, a, _ in chains)
    picked: list[tuple[Any, str, list[SubQA]]] = []
    for chain in chains:  # parallel chains must end in distinct answers (a comparison needs a winner)
        if all(not _same(chain[1], p[1]) for p in picked):
            picked.append(chain)
        if len(picked) == width:
            break
    if len(picked) < width:
        return None
    # re-index the kept chains 1..m
    kept: list[SubQA] = []
    for _, _, chain_subs in picked:
        shift = len(kept) + 1 - chain_subs[0].index
        for s in chain_subs:
            kept.append(s.model_copy(update={"index": s.index + shift, "depends_on": [d + shift for d in s.depends_on]}))
    ent0 = entity(start) if not (final.op != "lookup" and not path) else human(final.by)
    if width == 1:
        x0, answer, _ = picked[0]
        main_q = kept[0].question if not path else _chain_question(ent0, x0, path, final)
        return make_instance(source, main_q, answer, kept, mode, seed_q)
    (xa, aa, _), (xb, ab, _) = picked
    finals = [i * per_chain + per_chain for i in range(width)]
    what = final.describe().replace("that ", "its ", 1) if path else _single_phrase(final)
    if numeric and path:
        winner = xa if float(aa) > float(ab) else xb
        sink = SubQA(index=len(kept) + 1, question=f"Which is larger, {aa} (for {xa}) or {ab} (for {xb})?",
                     answer=fmt_value(winner) or "", depends_on=finals, needs_tool=False,
                     evidence=f"compare: max({aa}, {ab})")
        kept.append(sink)
        main_q = f"Between the {ent0} {xa} and the {ent0} {xb}, which has the larger {_strip_article(what)}?"
        if path:
            main_q = (f"Compare the {ent0} {xa} and the {ent0} {xb}: for each, {_route(path)}; "
                      f"which one leads to the larger {_strip_article(final.describe())}?")
        return make_instance(source, main_q, fmt_value(winner) or "", kept, mode, seed_q)
    main_q = f"What is {what} for the {ent0} {xa} and for the {ent0} {xb}?"
    if path:
        main_q = f"For the {ent0} {xa} and the {ent0} {xb}: {_route(path)}; what is {final.describe()} in each case?"
    return make_instance(source, main_q, f"{aa}; {ab}", kept, mode, seed_q)


def _single_phrase(final: Step) -> str:
    if final.op == "lookup":
        return f"the {human(final.attr or '')}"
    if final.op == "count":
        return f"the number of {human(final.table)}"
    return f"the total {human(final.attr or '')} of the {human(final.table)}"


def _strip_article(text: str) -> str:
    return text[4:] if text.startswith("the ") else text


def _route(path: list[Link]) -> str:
    return ", then ".join(f"follow its {human(link.column)} to the {entity(link.ref_table)}" for link in path)


def _chain_question(ent0: str, x0: Any, path: list[Link], final: Step) -> str:
    return f"Starting from the {ent0} {x0}, {_route(path)}. What is {final.describe()}?"


def _is_number(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False


def _same(a: str, b: str) -> bool:
    if _is_number(a) and _is_number(b):
        return abs(float(a) - float(b)) < 1e-9
    return a.strip().casefold() == b.strip().casefold()


# --------------------------------------------------------------------------- openai
QA_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["main_question", "main_answer", "sub_qas"],
    "properties": {
        "main_question": {"type": "string", "minLength": 5},
        "main_answer": {"type": "string", "minLength": 1},
        "sub_qas": {
            "type": "array", "minItems": 1, "maxItems": 12,
            "items": {
                "type": "object",
                "required": ["index", "question", "answer", "depends_on", "needs_tool"],
                "properties": {
                    "index": {"type": "integer", "minimum": 1},
                    "question": {"type": "string", "minLength": 3},
                    "answer": {"type": "string", "minLength": 1},
                    "depends_on": {"type": "array", "items": {"type": "integer", "minimum": 1}},
                    "needs_tool": {"type": "boolean"},
                    "evidence_sql": {"type": ["string", "null"]},
                },
            },
        },
    },
}


class OpenAIQASynthesizer:
    """ASTRA-style decomposition prompt, JSON-Schema-validated; SQL evidence re-run on the source."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.prompt = load_prompt("envs_decompose")

    async def synthesize(self, source: KnowledgeSource, spec: QASpec, on_instance: OnInstance | None = None) -> QABatch:
        from arenaforge.tasks.models import complete_json

        rng = random.Random(f"{spec.seed}:{source.name}")
        allowed = [s for s in spec.structures if _structure_fits(s, spec)] or list(STRUCTURES)
        summary = source.summary()
        seeds = list(spec.seed_questions or source.seed_questions)
        jobs = []
        for k in range(spec.n):
            structure = allowed[k % len(allowed)]
            seed_q = seeds[rng.randrange(len(seeds))] if (spec.mode == "conditioned" and seeds) else None
            text = self.prompt.render(
                knowledge=summary, structure=structure, min_hops=spec.min_hops, max_hops=spec.max_hops,
                seed_question=seed_q or "(none: write your own question)", variant=k)
            jobs.append((k, structure, seed_q, text))

        async def one(k: int, structure: str, seed_q: str | None, text: str) -> QAInstance | Rejection:
            subject = f"{source.name}:{structure}:{k}"
            try:
                answer = await complete_json(self.model, "envs.decompose", [{"role": "user", "content": text}],
                                             QA_SCHEMA, seed=spec.seed + k)
            except ParseError as err:
                return Rejection(stage="decompose_qa", subject=subject, reason="invalid_model_output", detail=str(err))
            except ProviderError as err:
                return Rejection(stage="decompose_qa", subject=subject, reason="provider_error", detail=str(err),
                                 environment_failure=True)
            args = (source, answer, seed_q, subject, self.prompt.hash, getattr(self.model, "name", None))
            # Evidence SQL that must reach DuckDB (~1 ms each; it releases the GIL) runs off the
            # event loop, where every ms is a ms no request goes out; memoised lookups stay inline,
            # since a thread hop would cost more than they do.
            fresh = any(sub.get("evidence_sql") and not source.memoised(sub["evidence_sql"]) for sub in answer["sub_qas"])
            made = await asyncio.to_thread(_from_model, *args) if fresh else _from_model(*args)
            if on_instance is not None and isinstance(made, QAInstance):
                on_instance(made)
            return made

        results = await asyncio.gather(*(one(*job) for job in jobs))
        instances = {r.id: r for r in results if isinstance(r, QAInstance)}
        return QABatch(list(instances.values()), [r for r in results if isinstance(r, Rejection)])


def _from_model(source: KnowledgeSource, answer: dict[str, Any], seed_q: str | None, subject: str,
                prompt_hash: str, model_name: str | None) -> QAInstance | Rejection:
    subs = []
    for raw in answer["sub_qas"]:
        sql = raw.get("evidence_sql")
        if sql:
            try:
                got = fmt_value(_scalar(source, sql))
            except Exception as err:  # noqa: BLE001 - any SQL failure of model-written evidence is a rejection
                return Rejection(stage="decompose_qa", subject=subject, reason="evidence_error",
                                 detail=f"sub-QA {raw['index']}: {str(err).splitlines()[0]}", payload=answer)
            if got is None or not _same(got, str(raw["answer"])):
                return Rejection(stage="decompose_qa", subject=subject, reason="evidence_mismatch",
                                 detail=f"sub-QA {raw['index']}: SQL gives {got!r}, model says {raw['answer']!r}",
                                 payload=answer)
        subs.append(SubQA(index=raw["index"], question=raw["question"], answer=str(raw["answer"]),
                          depends_on=sorted(set(raw["depends_on"])), needs_tool=raw["needs_tool"], evidence=sql))
    indices = [s.index for s in subs]
    if len(set(indices)) != len(indices) or any(d not in indices for s in subs for d in s.depends_on):
        return Rejection(stage="decompose_qa", subject=subject, reason="bad_dependencies",
                         detail="sub-QA indices repeat or a dependency names no sub-QA", payload=answer)
    try:
        return make_instance(source.name, answer["main_question"], answer["main_answer"], subs,
                             "conditioned" if seed_q else "unconditioned", seed_q,
                             Provenance(backend="openai", model=model_name, prompt_hash=prompt_hash))
    except ValueError as err:
        return Rejection(stage="decompose_qa", subject=subject, reason="cyclic_dependencies", detail=str(err),
                         payload=answer)


QA_SYNTHESIZERS = {"offline": lambda model: OfflineQASynthesizer(), "openai": OpenAIQASynthesizer}


def qa_payload(qa: QAInstance) -> str:
    return json.dumps(qa.model_dump(mode="json", include={"main_question", "main_answer", "sub_qas"}), ensure_ascii=False)
