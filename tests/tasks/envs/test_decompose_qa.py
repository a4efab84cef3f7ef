"""QA synthesis: the four structures over tables (answers grounded on the source), hop budget, modes, a model."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from arenaforge.testing.scripted_openai import Reply, chat_completion
from arenaforge.tracks.envs.decompose_qa import STRUCTURES, QASpec, QASynthesizer, hop_level
from arenaforge.tracks.envs.grounding import check_qa, source_answer
from arenaforge.tracks.envs.knowledge import load_sample, load_tau2_retail
from tests.support.envs_fakes import EnvsResponder, model_cfg
from tests.support.models import http_model as chat_model
from tests.support.models import offline_model


@pytest.fixture(scope="module")
def sample():
    src = load_sample()
    yield src
    src.close()


def _check_grounded(src, qa) -> None:
    check_qa(src, qa)  # raises when any answer does not follow from the source
    for sub in qa.sub_qas:
        if sub.needs_tool:  # every tool-needing sub-answer is what its typed evidence gives on the source
            assert sub.evidence is not None and sub.evidence.kind in ("lookup", "count", "sum")
            assert source_answer(src, sub.evidence) == sub.answer
        for d in sub.depends_on:  # the dependency's answer is used by the dependent question
            dep = qa.sub_qas[d - 1]
            assert dep.answer in sub.question


def test_offline_makes_all_four_structures_grounded_in_sql(sample) -> None:
    batch = asyncio.run(QASynthesizer(offline_model()).synthesize(sample, QASpec(n=16, max_hops=4, seed=3)))
    assert not batch.rejections
    assert {qa.structure for qa in batch.instances} == set(STRUCTURES)
    for qa in batch.instances:
        _check_grounded(sample, qa)
        assert qa.hop_level == hop_level(qa.sub_qas) <= 4
        if qa.structure == "multi_hop":
            assert qa.hop_level >= 2 and not qa.parallel
        if qa.structure.startswith("parallel"):
            assert qa.parallel
        assert qa.provenance is not None and qa.provenance.backend == "offline"


def test_hop_budget_and_determinism(sample) -> None:
    spec = QASpec(n=8, min_hops=3, max_hops=3, structures=("multi_hop",), seed=5)
    a = asyncio.run(QASynthesizer(offline_model()).synthesize(sample, spec))
    b = asyncio.run(QASynthesizer(offline_model()).synthesize(sample, spec))
    assert [q.id for q in a.instances] == [q.id for q in b.instances]
    assert a.instances and all(q.hop_level == 3 for q in a.instances)
    none = asyncio.run(QASynthesizer(offline_model()).synthesize(sample, QASpec(n=2, min_hops=2, max_hops=1)))
    assert not none.instances and none.rejections[0].reason == "hop_budget"


def test_no_join_path_is_a_rejection_not_a_crash(tmp_path: Path) -> None:
    from arenaforge.tracks.envs.knowledge import load_tables

    (tmp_path / "planets.csv").write_text("planet,moons\nMars,2\nEarth,1\nVenus,0\n")
    src = load_tables("lonely", [tmp_path / "planets.csv"])
    batch = asyncio.run(QASynthesizer(offline_model()).synthesize(src, QASpec(n=4, seed=1)))
    assert any(q.structure == "single_hop" for q in batch.instances)  # the lone table still serves lookups
    assert {r.reason for r in batch.rejections} == {"no_join_path"}


def test_conditioned_mode_follows_the_seed_question(sample) -> None:
    spec = QASpec(n=4, structures=("single_hop", "multi_hop"), mode="conditioned",
                  seed_questions=("Which supplier rating should I trust?",), seed=2)
    batch = asyncio.run(QASynthesizer(offline_model()).synthesize(sample, spec))
    assert batch.instances
    for qa in batch.instances:
        assert qa.mode == "conditioned" and qa.seed_question
        assert "rating" in qa.sub_qas[-1].question


@pytest.mark.shared_data
def test_tau2_retail_instances(shared_data: Path) -> None:
    src = load_tau2_retail(shared_data / "tau2_retail")
    batch = asyncio.run(QASynthesizer(offline_model()).synthesize(src, QASpec(n=8, max_hops=4, seed=1)))
    assert len(batch.instances) == 8
    for qa in batch.instances:
        _check_grounded(src, qa)


def test_openai_backend_validates_and_grounds_answers(sample, scripted_openai) -> None:
    scripted_openai.responder = EnvsResponder()
    with chat_model(model_cfg(scripted_openai.url)) as model:
        batch = asyncio.run(QASynthesizer(model).synthesize(sample, QASpec(n=4, seed=0)))
    assert len(batch.instances) == 4 and not batch.rejections
    assert {q.structure for q in batch.instances} == {"single_hop", "multi_hop"}
    assert all(q.provenance.backend == "openai" and q.provenance.prompt_hash for q in batch.instances)
    prompt = scripted_openai.chat_requests()[0]["messages"][0]["content"]
    assert "table customers" in prompt and "Hop budget" in prompt


def test_openai_bad_answers_become_rejections(sample, scripted_openai) -> None:
    good = EnvsResponder()
    wrong = {"main_question": "Where?", "main_answer": "Mars",
             "sub_qas": [{"index": 1, "question": "Which city is CU100 in?", "answer": "Mars", "depends_on": [],
                          "needs_tool": True, "evidence": {"kind": "lookup", "table": "customers", "key": "customer_id",
                                                           "value": "CU100", "column": "city"}}]}
    cyclic = {"main_question": "Loop?", "main_answer": "x",
              "sub_qas": [{"index": 1, "question": "What is a?", "answer": "x", "depends_on": [2], "needs_tool": True},
                          {"index": 2, "question": "What is b?", "answer": "y", "depends_on": [1], "needs_tool": True}]}

    def responder(req):
        text = req["messages"][0]["content"]
        k = int(text.split("Variant number (make it differ from other variants): ")[1].split()[0])
        if k == 0:
            return Reply(body=chat_completion(content="I think the answer is Lyon."))  # never JSON, even re-asked
        if k == 1:
            return chat_completion(content=__import__("json").dumps(wrong))
        if k == 2:
            return chat_completion(content=__import__("json").dumps(cyclic))
        return good(req)

    scripted_openai.responder = responder
    with chat_model(model_cfg(scripted_openai.url)) as model:
        batch = asyncio.run(QASynthesizer(model).synthesize(sample, QASpec(n=4, seed=0)))
    reasons = sorted(r.reason for r in batch.rejections)
    assert reasons == ["cyclic_dependencies", "evidence_mismatch", "invalid_model_output"]
    assert len(batch.instances) == 1  # the flow carries on with the good one
