"""QA instance synthesis (ASTRA §1b.1): a main question decomposed into a DAG of sub-QAs.

One step for every provider: the ASTRA-style prompt (tracks/envs/prompts/envs_decompose.txt) is rendered per
instance with the knowledge source's summary, the wanted structure, the hop budget and (conditioned
mode) a seed question, and the run's `ChatModel` answers it as JSON validated against `QA_SCHEMA` (the
offline provider from `tracks/envs/offline_decompose.py`, which queries the source's tables). The
answer is then held to the source (`tracks/envs/grounding.py`): every tool-needing sub-QA must carry
typed evidence that reproduces its answer on the source, every reasoning step must follow from the
answers it combines, and the main answer must follow from the final sub-answers; the structure label
and hop level are computed from the dependency graph. A model may propose evidence; only the source
decides.
"""

from __future__ import annotations

import asyncio
import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from arenaforge.schemas.base import Provenance
from arenaforge.schemas.errors import ProviderError
from arenaforge.schemas.models import Evidence, QAInstance, Rejection, SubQA
from arenaforge.services.models import ChatModel, NoAnswer, Step, complete_json, graded_by
from arenaforge.tracks.envs.evidence import KINDS
from arenaforge.tracks.envs.grounding import Ungrounded, check_qa
from arenaforge.tracks.envs.knowledge import KnowledgeSource
from arenaforge.tracks.envs.prompts import load_prompt


def _offline_rules() -> ModuleType:
    from arenaforge.tracks.envs import offline_decompose  # its rules read this module's types: loaded after it

    return offline_decompose


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


# --------------------------------------------------------------------------- the step
EVIDENCE_SCHEMA: dict[str, Any] = {
    "type": ["object", "null"],
    "required": ["kind"],
    "properties": {
        "kind": {"enum": list(KINDS)},  # in registration order: the request's bytes (the cache key) depend on it
        "table": {"type": ["string", "null"]}, "key": {"type": ["string", "null"]}, "value": {},
        "column": {"type": ["string", "null"]}, "text": {"type": ["string", "null"]},
        "passage": {"type": ["string", "null"]},
        "of": {"type": "array", "items": {"type": "integer"}}, "labels": {"type": "array", "items": {"type": "string"}},
        "op": {"enum": ["max", "min", None]},
    },
}
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
                    "evidence": EVIDENCE_SCHEMA,
                },
            },
        },
    },
}


DECOMPOSE = Step("envs.decompose", prompt="envs_decompose", schema=QA_SCHEMA, max_tokens=900,
                 offline=lambda: _offline_rules().decompose)


@dataclass(frozen=True)
class DecomposeInputs:
    """What one instance's decomposition prompt is rendered from (the offline provider answers from these)."""

    source: KnowledgeSource
    spec: QASpec
    structure: str
    k: int
    seed_question: str | None


def structure_fits(structure: str, spec: QASpec) -> bool:
    if structure in ("single_hop", "parallel_single_hop"):
        return spec.min_hops <= 1 <= spec.max_hops
    return spec.max_hops >= max(2, spec.min_hops)


class QASynthesizer:
    """One decomposition request per instance; answers grounded on the source (see module docstring)."""

    def __init__(self, model: ChatModel) -> None:
        self.model = model
        self.prompt = load_prompt(DECOMPOSE.prompt)
        self._summaries: dict[str, str] = {}  # per source name: rendered once per run

    def plan(self, source: KnowledgeSource, spec: QASpec) -> list[DecomposeInputs] | Rejection:
        """One decomposition per instance to synthesize, in order; a rejection when no structure fits the hops."""
        allowed = [s for s in spec.structures if structure_fits(s, spec)]
        if not allowed:
            return Rejection(stage="decompose_qa", subject=source.name, reason="hop_budget",
                             detail=f"no structure fits hops {spec.min_hops}..{spec.max_hops}")
        seeds = list(spec.seed_questions or source.seed_questions)
        pick_seed = random.Random(f"{spec.seed}:{source.name}:seed-questions")
        jobs = []
        for k in range(spec.n):
            structure = allowed[k % len(allowed)]
            seed_q = seeds[pick_seed.randrange(len(seeds))] if (spec.mode == "conditioned" and seeds) else None
            jobs.append(DecomposeInputs(source, spec, structure, k, seed_q))
        return jobs

    async def synthesize(self, source: KnowledgeSource, spec: QASpec, on_instance: OnInstance | None = None) -> QABatch:
        jobs = self.plan(source, spec)
        if isinstance(jobs, Rejection):
            return QABatch([], [jobs])

        async def one(inputs: DecomposeInputs) -> QAInstance | Rejection:
            made = await self.decompose(inputs)
            if on_instance is not None and isinstance(made, QAInstance):
                on_instance(made)
            return made

        results = await asyncio.gather(*(one(job) for job in jobs))
        instances = {r.id: r for r in results if isinstance(r, QAInstance)}
        return QABatch(list(instances.values()), [r for r in results if isinstance(r, Rejection)])

    async def decompose(self, inputs: DecomposeInputs) -> QAInstance | Rejection:
        """One planned decomposition: the model's answer held to the source."""
        source, spec = inputs.source, inputs.spec
        subject = f"{source.name}:{inputs.structure}:{inputs.k}"
        if source.name not in self._summaries:
            self._summaries[source.name] = source.summary()
        summary = self._summaries[source.name]

        def text() -> str:
            return self.prompt.render(
                knowledge=summary, structure=inputs.structure, min_hops=spec.min_hops, max_hops=spec.max_hops,
                seed_question=inputs.seed_question or "(none: write your own question)", variant=inputs.k)

        try:
            answer = await complete_json(self.model, DECOMPOSE, text, seed=spec.seed + inputs.k, inputs=inputs)
        except NoAnswer as err:
            return Rejection(stage="decompose_qa", subject=subject, reason=err.reason, detail=err.detail,
                             payload=err.payload)
        except ProviderError as err:  # invalid output or a failed endpoint: the error's kind says which
            return Rejection.of_error("decompose_qa", subject, err)
        args = (source, answer, inputs.seed_question, subject, self.prompt.hash, self.model)
        # Grounding queries that must reach DuckDB (~1 ms each; it releases the GIL) run off the event
        # loop, where every ms is a ms no request goes out; when the source has answered every one of
        # them before (the offline provider's instances), grounding stays inline.
        return await asyncio.to_thread(_from_answer, *args) if model_written(self.model) else _from_answer(*args)


def _from_answer(source: KnowledgeSource, answer: dict[str, Any], seed_q: str | None, subject: str,
                 prompt_hash: str, model: ChatModel) -> QAInstance | Rejection:
    """The instance of one answer, held to the source; a rejection with its reason otherwise."""
    try:
        subs = [SubQA(index=raw["index"], question=raw["question"], answer=str(raw["answer"]),
                      depends_on=sorted(set(raw["depends_on"])), needs_tool=raw["needs_tool"],
                      evidence=Evidence.model_validate(raw["evidence"]) if raw.get("evidence") else None)
                for raw in answer["sub_qas"]]
    except ValueError as err:  # pydantic's ValidationError: evidence of the wrong shape
        return Rejection(stage="decompose_qa", subject=subject, reason="evidence_error",
                         detail=str(err).splitlines()[0], payload=answer)
    indices = [s.index for s in subs]
    if len(set(indices)) != len(indices) or any(d not in indices for s in subs for d in s.depends_on):
        return Rejection(stage="decompose_qa", subject=subject, reason="bad_dependencies",
                         detail="sub-QA indices repeat or a dependency names no sub-QA", payload=answer)
    try:
        qa = make_instance(source.name, answer["main_question"], answer["main_answer"], subs,
                           "conditioned" if seed_q else "unconditioned", seed_q,
                           Provenance(backend=model.kind, model=model.name, prompt_hash=prompt_hash,
                                      written_by={"decomposition": "model" if model_written(model) else "program"}))
    except ValueError as err:
        return Rejection(stage="decompose_qa", subject=subject, reason="cyclic_dependencies", detail=str(err),
                         payload=answer)
    try:
        check_qa(source, qa)
    except Ungrounded as err:
        return Rejection(stage="decompose_qa", subject=subject, reason=err.reason, detail=err.detail, payload=answer)
    except Exception as err:  # noqa: BLE001 - the source refusing a model's evidence (a DuckDB error) is a rejection
        return Rejection(stage="decompose_qa", subject=subject, reason="evidence_error",
                         detail=str(err).splitlines()[0], payload=answer)
    return qa


def qa_payload(qa: QAInstance) -> str:
    return json.dumps(qa.model_dump(mode="json", include={"main_question", "main_answer", "sub_qas"}), ensure_ascii=False)


def model_written(model: ChatModel) -> bool:
    """Whether answers come from a model (whose evidence the source has not answered yet) rather than the rules."""
    return graded_by(model) == "model"
