"""QA synthesis in short steps, for small models (`envs synth --decomposition stepwise`).

The one-request decomposition (`decompose_qa.py`) asks a model for a whole DAG of sub-QAs with typed
evidence at once: a 135M model gets none of it right. Here the program plans the facts and the model
writes the parts it can be held to, one short request each:

  program  the structure, the rows the facts come from (a row of a table; for multi_hop, the row a
           link column leads to), the dependencies, the main answer (the final sub-answer, or all of
           them for parallel facts)
  model    per fact (`envs.write_subqa`): which field of the row to ask about (an enum of the table's
           attribute columns), the sub-question, and the answer read off the row; for a chain, the main
           question over the sub-questions (`envs.write_main_question`; independent facts' main question
           is their questions joined by the program)

The schemas are built per request from the source: a model's answer names a real column by
construction. Nothing is trusted: the sub-question must name the value it is about, the answer is the
model's own text and is held to the source (`grounding.check_qa`), so an endpoint that answers
schema-valid filler gets nothing kept. The instance records who wrote which part (`Provenance.written_by`).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, replace
from types import ModuleType
from typing import Any

from arenaforge.schemas.base import Provenance
from arenaforge.schemas.errors import ProviderError
from arenaforge.schemas.models import Evidence, QAInstance, Rejection, SubQA
from arenaforge.services.models import NoAnswer, Step, complete_json
from arenaforge.services.models.text_schemas import text_naming
from arenaforge.tracks.envs.answers import entity, fmt_value, human
from arenaforge.tracks.envs.decompose_qa import DecomposeInputs, QASpec, QASynthesizer, make_instance, model_written
from arenaforge.tracks.envs.grounding import Ungrounded, check_qa
from arenaforge.tracks.envs.knowledge import KnowledgeSource, Link
from arenaforge.tracks.envs.prompts import load_prompt
from arenaforge.tracks.envs.tool_data import json_value, table_rows


def _offline_rules() -> ModuleType:
    from arenaforge.tracks.envs import offline_stepwise  # its rules read this module's types: loaded after it

    return offline_stepwise


STRUCTURES = ("single_hop", "parallel_single_hop", "multi_hop")
WRITTEN_BY = {"structure": "program", "rows": "program", "columns": "model", "sub_questions": "model",
              "sub_answers": "model", "main_question": "model", "main_answer": "program"}
PLAN_TRIES = 8


@dataclass(frozen=True)
class Fact:
    """One planned sub-QA: a row of `table` found by `key` = `value`; `column` fixed by the plan or the model's."""

    table: str
    key: str
    value: str
    row: dict[str, Any]
    columns: tuple[str, ...]  # what the model may ask about
    depends_on: tuple[int, ...] = ()


@dataclass(frozen=True)
class SubQAInputs:
    """What one `envs.write_subqa` request is rendered from."""

    fact: Fact
    source: str


def _askable(source: KnowledgeSource, table: str) -> list[str]:
    profile = source.tables[table]
    return [c for c in profile.attributes if c != profile.key]


def _row_dict(source: KnowledgeSource, table: str, row: tuple[Any, ...]) -> dict[str, Any]:
    return {c: json_value(v) for c, v in zip(table_rows(source, table).columns, row, strict=True)}


def _pick_row(source: KnowledgeSource, table: str, rng: random.Random, need: str | None = None
              ) -> tuple[Any, ...] | None:
    profile = source.tables[table]
    rows = table_rows(source, table)
    key_at = rows.columns.index(profile.key) if profile.key else -1
    pool = [r for r in rows.rows if key_at >= 0 and r[key_at] is not None
            and (need is None or r[rows.columns.index(need)] is not None)]
    # a key value that names one row only: a lookup must have one answer
    unique = [r for r in pool if len(rows.by(profile.key or "").get(str(r[key_at]), [])) == 1]
    return rng.choice(unique) if unique else None


def plan_facts(source: KnowledgeSource, structure: str, rng: random.Random) -> list[Fact] | None:
    """The facts of one instance of `structure`, or None when this draw found none (the caller draws again)."""
    tables = [t for t, p in source.tables.items() if p.key and _askable(source, t)]
    if not tables:
        return None
    if structure in ("single_hop", "parallel_single_hop"):
        table = rng.choice(tables)
        key = source.tables[table].key or ""
        rows = [_pick_row(source, table, rng) for _ in range(2 if structure == "parallel_single_hop" else 1)]
        if any(r is None for r in rows):
            return None
        facts = []
        for row in rows:
            as_dict = _row_dict(source, table, row)  # type: ignore[arg-type]
            facts.append(Fact(table, key, str(fmt_value(as_dict[key])), as_dict, tuple(_askable(source, table))))
        if len({f.value for f in facts}) < len(facts):
            return None
        return facts
    links: list[Link] = [ln for ln in source.links if ln.table in source.tables and ln.ref_table in tables
                         and source.tables[ln.table].key]
    if not links:
        return None
    link = rng.choice(links)
    first = _pick_row(source, link.table, rng, need=link.column)
    if first is None:
        return None
    a = _row_dict(source, link.table, first)
    target = str(fmt_value(a[link.column]))
    matches = table_rows(source, link.ref_table).by(link.ref_key).get(target, [])
    if len(matches) != 1:
        return None
    b = _row_dict(source, link.ref_table, matches[0])
    key_a = source.tables[link.table].key or ""
    return [Fact(link.table, key_a, str(fmt_value(a[key_a])), a, (link.column,)),
            Fact(link.ref_table, link.ref_key, target, b, tuple(_askable(source, link.ref_table)), (1,))]


def subqa_schema(fact: Fact) -> dict[str, Any]:
    column = {"const": fact.columns[0]} if len(fact.columns) == 1 else {"enum": list(fact.columns)}
    # question before answer: measured on SmolLM2-135M (12 customer rows), 10 right answers and 12 questions naming
    # the value, against 9 and 9 with the answer first (it then rambled until the value came up)
    return {"type": "object", "additionalProperties": False, "required": ["column", "question", "answer"],
            "properties": {"column": column, "question": text_naming([fact.value]),
                           "answer": {"type": "string", "minLength": 1, "maxLength": 80}}}


def main_schema(names: list[str]) -> dict[str, Any]:
    return {"type": "object", "additionalProperties": False, "required": ["main_question"],
            "properties": {"main_question": text_naming(names, max_length=300)}}


# each call's schema names its own fact's values: subqa_schema, main_schema
WRITE_SUBQA = Step("envs.write_subqa", prompt="envs_write_subqa", schema=None, max_tokens=120,
                   offline=lambda: _offline_rules().write_subqa)
WRITE_MAIN_QUESTION = Step("envs.write_main_question", prompt="envs_write_main_question", schema=None,
                           max_tokens=160, offline=lambda: _offline_rules().write_main_question)


class StepwiseQASynthesizer(QASynthesizer):
    """`QASynthesizer` with the decomposition written in short steps (see module docstring)."""

    def __init__(self, model: Any) -> None:
        super().__init__(model)
        self.p_sub = load_prompt(WRITE_SUBQA.prompt)
        self.p_main = load_prompt(WRITE_MAIN_QUESTION.prompt)

    def plan(self, source: KnowledgeSource, spec: QASpec) -> list[DecomposeInputs] | Rejection:
        kept = tuple(s for s in spec.structures if s in STRUCTURES)
        if not kept:
            return Rejection(stage="decompose_qa", subject=source.name, reason="structure_unsupported",
                             detail=f"stepwise decomposition writes {', '.join(STRUCTURES)}")
        return super().plan(source, replace(spec, structures=kept, max_hops=max(spec.max_hops, 1)))

    async def decompose(self, inputs: DecomposeInputs) -> QAInstance | Rejection:
        source, spec = inputs.source, inputs.spec
        subject = f"{source.name}:{inputs.structure}:{inputs.k}"
        rng = random.Random(f"{spec.seed}:{source.name}:stepwise:{inputs.k}")
        facts = None
        for _ in range(PLAN_TRIES):
            facts = plan_facts(source, inputs.structure, rng)
            if facts is not None:
                break
        if facts is None:
            return Rejection(stage="decompose_qa", subject=subject, reason="no_join_path",
                             detail=f"no {inputs.structure} facts found in {source.name}")
        try:
            subs = []
            for i, fact in enumerate(facts, start=1):
                made = await self._write_sub(source.name, fact, i, spec.seed + inputs.k)
                if isinstance(made, Rejection):
                    return made.model_copy(update={"subject": subject})
                subs.append(made)
            starts = [facts[0].value] if facts[-1].depends_on else [f.value for f in facts]
            if facts[-1].depends_on:  # a chain: one question that hides the intermediate answer, the model's
                main = await complete_json(self.model, WRITE_MAIN_QUESTION, lambda: self.p_main.render(
                    sub_questions="\n".join(f"{s.index}. {s.question}" for s in subs), names=", ".join(starts)),
                    main_schema(starts), seed=spec.seed + inputs.k, inputs=(inputs, subs))
            else:  # independent facts: their (model-written) questions, joined by the program
                main = {"main_question": " ".join(s.question.strip() for s in subs)}
        except NoAnswer as err:
            return Rejection(stage="decompose_qa", subject=subject, reason=err.reason, detail=err.detail)
        except ProviderError as err:
            return Rejection.of_error("decompose_qa", subject, err)
        finals = [s.answer for s in subs if not any(s.index in t.depends_on for t in subs)]
        main_answer = finals[0] if len(finals) == 1 else " and ".join(finals)
        question = str(main["main_question"]).strip()
        missing = [v for v in starts if v.casefold() not in question.casefold()]
        if missing:
            return Rejection(stage="decompose_qa", subject=subject, reason="question_missing_value",
                             detail=f"the main question does not name {', '.join(missing)}",
                             payload={"main_question": question})
        by_model = model_written(self.model)  # the offline provider's rules write the model's parts
        parts = {**WRITTEN_BY, "main_question": "model" if facts[-1].depends_on else "program"}
        provenance = Provenance(backend=self.model.kind, model=self.model.name, prompt_hash=self.p_sub.hash,
                                written_by={part: who if by_model else "program" for part, who in parts.items()})
        try:
            qa = make_instance(source.name, question, main_answer, subs, provenance=provenance)
            check_qa(source, qa)
        except Ungrounded as err:
            return Rejection(stage="decompose_qa", subject=subject, reason=err.reason, detail=err.detail,
                             payload={"sub_qas": [s.model_dump(mode="json") for s in subs]})
        return qa

    async def _write_sub(self, source: str, fact: Fact, index: int, seed: int) -> SubQA | Rejection:
        def text() -> str:
            return self.p_sub.render(table=fact.table, entity=entity(fact.table), key=fact.key, value=fact.value,
                                     row=json.dumps(fact.row, ensure_ascii=False),
                                     fields=", ".join(fact.columns))

        got = await complete_json(self.model, WRITE_SUBQA, text, subqa_schema(fact), seed=seed * 31 + index,
                                  inputs=SubQAInputs(fact, source))
        column, question, answer = got["column"], str(got["question"]).strip(), str(got["answer"]).strip()
        if column not in fact.columns:
            return Rejection(stage="decompose_qa", subject=source, reason="evidence_error",
                             detail=f"{column!r} is not a field of {fact.table} to ask about", payload=got)
        if fact.value.casefold() not in question.casefold():
            return Rejection(stage="decompose_qa", subject=source, reason="question_missing_value",
                             detail=f"sub-question {index} does not name {human(fact.key)} {fact.value}", payload=got)
        # the answer stays as the model wrote it: grounding holds it to the source
        evidence = Evidence(kind="lookup", table=fact.table, key=fact.key, value=fact.value, column=column)
        return SubQA(index=index, question=question, answer=answer, depends_on=list(fact.depends_on),
                     needs_tool=True, evidence=evidence)
