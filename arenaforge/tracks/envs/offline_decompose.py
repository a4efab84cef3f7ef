"""Offline answers of `envs.decompose`: QA instances built by querying the knowledge source's tables.

It samples join paths along foreign-key links, key lookups and aggregations (count, sum); every
sub-answer is the result of a query on the source and that query is the sub-QA's evidence, in one of
the canonical forms of `tracks/envs/decompose_qa.py` (`Step.sql`).

Structures: single_hop (one lookup/aggregate), parallel_single_hop (the same lookup on k entities,
compared or listed), multi_hop (a chain of h steps where each step's answer is the next step's key),
parallel_multi_hop (two chains of h steps joined by a reasoning-only comparison). Question-conditioned
mode picks the (table, attribute) that best matches the seed question's words and builds the chain to
end there.

One random stream per (source, spec) and run, consumed in request order; an instance already given
in this run is never given again (up to `ATTEMPTS` tries, then `NoAnswer("no_join_path")`).
"""

from __future__ import annotations

import random
import re
import weakref
from dataclasses import dataclass, field
from typing import Any

from arenaforge.schemas.models import Evidence, QAInstance, SubQA
from arenaforge.services.models import ChatRequest, NoAnswer
from arenaforge.services.models.providers.offline import OfflineModel
from arenaforge.tracks.envs.answers import entity, fmt_value, human, is_number, same_answer
from arenaforge.tracks.envs.decompose_qa import DecomposeInputs, QASpec, make_instance
from arenaforge.tracks.envs.grounding import Ungrounded, source_answer
from arenaforge.tracks.envs.knowledge import KnowledgeSource, Link

ATTEMPTS = 8


@dataclass(frozen=True)
class Step:
    """One tool-answerable operation: lookup(table.attr by key), count(table by col), sum(table.attr by col)."""

    op: str
    table: str
    by: str
    attr: str | None = None

    def evidence(self, value: Any) -> Evidence:
        return Evidence(kind=self.op, table=self.table, key=self.by, value=fmt_value(value), column=self.attr)  # type: ignore[arg-type]

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


@dataclass
class _Stream:
    rng: random.Random
    given: set[str] = field(default_factory=set)


def decompose(request: ChatRequest, model: OfflineModel) -> dict[str, Any]:
    inputs: DecomposeInputs = request.inputs
    source, spec = inputs.source, inputs.spec
    # one random stream per loaded source (keyed by the source object itself) and spec
    per_source = model.state.setdefault("envs.decompose", weakref.WeakKeyDictionary()).setdefault(source, {})
    stream = per_source.get(spec)
    if stream is None:
        stream = per_source[spec] = _Stream(random.Random(f"{spec.seed}:{source.name}"))
    for _ in range(ATTEMPTS):
        made = _one(source, spec, inputs.structure, stream.rng, inputs.seed_question)
        if made is not None and made.id not in stream.given:
            stream.given.add(made.id)
            return {"main_question": made.main_question, "main_answer": made.main_answer,
                    "sub_qas": [{"index": s.index, "question": s.question, "answer": s.answer,
                                 "depends_on": s.depends_on, "needs_tool": s.needs_tool,
                                 "evidence": s.evidence.model_dump(mode="json") if s.evidence else None}
                                for s in made.sub_qas]}
    raise NoAnswer("no_join_path",
                   f"no {inputs.structure} instance with hops {spec.min_hops}..{spec.max_hops} found in {ATTEMPTS} tries",
                   payload={"structure": inputs.structure, "seed_question": inputs.seed_question})


def _one(source: KnowledgeSource, spec: QASpec, structure: str, rng: random.Random,
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


def _distinct(source: KnowledgeSource, table: str, column: str) -> list[Any]:
    # the source memoises its queries (it owns the cache; no module-level cache keyed by id())
    return [r[0] for r in source.query(f'SELECT DISTINCT "{column}" FROM "{table}" WHERE "{column}" IS NOT NULL ORDER BY 1')]


def _answer(source: KnowledgeSource, evidence: Evidence) -> str | None:
    """What the source answers for the evidence (None where it has no single answer: try another sample)."""
    try:
        return source_answer(source, evidence)
    except Ungrounded:
        return None


def _run_chain(source: KnowledgeSource, path: list[Link], final: Step, x0: Any, subs: list[SubQA]) -> str | None:
    """Append the chain's sub-QAs (lookups along `path`, then `final`) starting at x0; its final answer."""
    value: Any = x0
    prev: int | None = None
    staged: list[SubQA] = []
    base = len(subs)
    for link in path:
        step = Step("lookup", link.table, source.tables[link.table].key or "", link.column)
        evidence = step.evidence(value)
        nxt = _answer(source, evidence)
        if nxt is None:
            return None
        idx = base + len(staged) + 1
        staged.append(SubQA(index=idx, question=step.question(value), answer=nxt,
                            depends_on=[prev] if prev else [], needs_tool=True, evidence=evidence))
        prev, value = idx, nxt
    evidence = final.evidence(value)
    answer = _answer(source, evidence)
    if answer is None or answer == "":
        return None
    idx = base + len(staged) + 1
    staged.append(SubQA(index=idx, question=final.question(value), answer=answer,
                        depends_on=[prev] if prev else [], needs_tool=True, evidence=evidence))
    subs.extend(staged)
    return answer


def _compose(source: str, structure: str, path: list[Link], final: Step, start: str,
             ends: list[tuple[Any, str]], subs: list[SubQA], mode: str, seed_q: str | None) -> QAInstance | None:
    """Trim the over-sampled chains to the structure's width and write the main question."""
    per_chain = len(path) + 1
    width = 1 if structure in ("single_hop", "multi_hop") else 2
    chains = [(x0, ans, subs[i * per_chain:(i + 1) * per_chain]) for i, (x0, ans) in enumerate(ends)]
    numeric = all(is_number(a) for _, a, _ in chains)
    picked: list[tuple[Any, str, list[SubQA]]] = []
    for chain in chains:  # parallel chains must end in distinct answers (a comparison needs a winner)
        if all(not same_answer(chain[1], p[1]) for p in picked):
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
                     evidence=Evidence(kind="compare", of=finals, labels=[fmt_value(xa) or "", fmt_value(xb) or ""],
                                       op="max"))
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
