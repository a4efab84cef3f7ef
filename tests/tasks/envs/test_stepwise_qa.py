"""The stepwise decomposition: the program plans the facts, a writer fills in sub-QAs and the main question.

Offline (rules write every part) it yields the three structures it plans, grounded and saying the program wrote
them; the per-request schemas only admit the planned table's columns; a writer whose answers are not the row's
gets the QA rejected by grounding, with the source's value as the reason.
"""

from __future__ import annotations

import asyncio
import json
import random

import pytest

from arenaforge.testing.scripted_openai import chat_completion
from arenaforge.tracks.envs.decompose_qa import QASpec
from arenaforge.tracks.envs.grounding import check_qa
from arenaforge.tracks.envs.knowledge import load_sample
from arenaforge.tracks.envs.stepwise_qa import STRUCTURES, StepwiseQASynthesizer, plan_facts, subqa_schema
from tests.support.envs_fakes import model_cfg
from tests.support.models import http_model as chat_model
from tests.support.models import offline_model


@pytest.fixture(scope="module")
def sample():
    src = load_sample()
    yield src
    src.close()


def test_offline_writes_the_three_structures_grounded(sample) -> None:
    batch = asyncio.run(StepwiseQASynthesizer(offline_model()).synthesize(sample, QASpec(n=12, seed=1)))
    assert not batch.rejections, batch.rejections[:2]
    assert {qa.structure for qa in batch.instances} == set(STRUCTURES)
    for qa in batch.instances:
        check_qa(sample, qa)
        assert set(qa.provenance.written_by.values()) == {"program"}  # rules wrote the model's parts too
        chain = [s for s in qa.sub_qas if s.depends_on]
        for sub in chain:  # a chain's second fact is keyed by the first fact's answer
            assert sub.evidence.value == qa.sub_qas[sub.depends_on[0] - 1].answer


def test_only_the_planned_rows_columns_are_admitted(sample) -> None:
    for structure in STRUCTURES:
        facts = next(f for f in (plan_facts(sample, structure, random.Random(k)) for k in range(20)) if f)
        for fact in facts:
            schema = subqa_schema(fact)["properties"]["column"]
            admitted = [schema["const"]] if "const" in schema else schema["enum"]
            assert set(admitted) <= set(fact.row) and fact.key not in admitted
            assert str(fact.row[fact.key]) == fact.value


def test_a_writer_that_misreads_the_row_gets_nothing_kept(sample, scripted_openai) -> None:
    def misread(req):
        prompt = req["messages"][-1]["content"]
        if "main question" in prompt:
            names = prompt.split("starting from ", 1)[1].split(". It must", 1)[0]
            return chat_completion(content=json.dumps({"main_question": f"What about {names}?"}))
        schema = req["response_format"]["json_schema"]["schema"]["properties"]["column"]
        column = schema.get("const") or schema["enum"][0]
        value = prompt.split('contains the ', 1)[1].split('"')[1]
        return chat_completion(content=json.dumps({"column": column, "question": f"What is the {column} of {value}?",
                                                   "answer": "Atlantis"}))

    scripted_openai.responder = misread
    with chat_model(model_cfg(scripted_openai.url)) as model:
        batch = asyncio.run(StepwiseQASynthesizer(model).synthesize(sample, QASpec(n=4, seed=0)))
    assert not batch.instances
    assert {r.reason for r in batch.rejections} == {"evidence_mismatch"}
    assert all("the source gives" in r.detail for r in batch.rejections)
