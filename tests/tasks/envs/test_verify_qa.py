"""QA verification: the four checks, QS, keep rules, structural checks, tool necessity, model judge."""

from __future__ import annotations

import asyncio

import pytest

from arenaforge.schemas.models import Evidence, QAInstance, SubQA
from arenaforge.tracks.envs.decompose_qa import make_instance
from arenaforge.tracks.envs.offline_verify import rule_checks
from arenaforge.tracks.envs.verify_qa import VERIFY, KeepRule, QAJudge, structural_checks, verify_batch
from tests.support.envs_fakes import EnvsResponder, model_cfg
from tests.support.models import http_model as chat_model
from tests.support.models import offline_model


def _chain(**changes) -> QAInstance:
    subs = [SubQA(index=1, question="What is the customer id of the order OR5001?", answer="CU107",
                  evidence=Evidence(kind="lookup", table="orders", key="order_id", value="OR5001", column="customer_id")),
            SubQA(index=2, question="What is the city of the customer CU107?", answer="Ghent", depends_on=[1],
                  evidence=Evidence(kind="lookup", table="customers", key="customer_id", value="CU107", column="city"))]
    base = dict(main_question="Starting from the order OR5001, follow its customer id; what is the city?",
                main_answer="Ghent", subs=subs)
    base.update(changes)
    return make_instance("t", base["main_question"], base["main_answer"], base["subs"])


def test_good_instance_passes_everything() -> None:
    qa = _chain()
    assert all(rule_checks(qa)[0].values())
    structural, necessity, reasons = structural_checks(qa, 1, 3)
    assert all(structural.values()) and reasons == []
    assert necessity == {"1": True, "2": True}


@pytest.mark.parametrize(("subs", "failed"), [
    # sub-QA 2 lists a dependency whose answer it never uses
    ([SubQA(index=1, question="What is the customer id of the order OR5001?", answer="CU107"),
      SubQA(index=2, question="What is the city of the customer CU100?", answer="Ghent", depends_on=[1])],
     "dependency_consistency"),
    # two questions in one
    ([SubQA(index=1, question="What is the customer id of order OR5001? And its store?", answer="CU107"),
      SubQA(index=2, question="What is the city of the customer CU107?", answer="Ghent", depends_on=[1])],
     "sub_question_atomicity"),
    # the main answer does not follow from the final sub-answer
    ([SubQA(index=1, question="What is the customer id of the order OR5001?", answer="CU107"),
      SubQA(index=2, question="What is the tier of the customer CU107?", answer="gold", depends_on=[1])],
     "task_completeness"),
])
def test_each_check_fails_on_its_defect(subs, failed) -> None:
    qa = make_instance("t", "Where does the customer of order OR5001 live?", "Ghent", subs)
    checks = rule_checks(qa)[0]
    assert checks[failed] is False


def test_structural_failures_and_tool_necessity() -> None:
    leaked = _chain(main_question="The customer CU107 placed order OR5001; what is the city?")
    structural, necessity, reasons = structural_checks(leaked, 1, 3)
    assert not structural["answers_hidden"] and necessity["1"] is False
    too_deep = _chain()
    assert not structural_checks(too_deep, 1, 1)[0]["hops_within_budget"]
    reasoning_middle = _chain(subs=[
        SubQA(index=1, question="What is 2 + 2?", answer="4", needs_tool=False),
        SubQA(index=2, question="What is the name of the store ST34?", answer="Ghent Central", depends_on=[1])])
    assert not structural_checks(reasoning_middle, 1, 3)[0]["intermediate_needs_tool"]
    cyclic = _chain().model_copy(update={"sub_qas": [
        SubQA(index=1, question="a?", answer="x", depends_on=[2]), SubQA(index=2, question="b?", answer="y", depends_on=[1])]})
    assert structural_checks(cyclic, 1, 3)[0]["acyclic"] is False


def test_keep_rules_and_rejection_rows() -> None:
    good = _chain()
    bad = make_instance("t", "Where does the customer of order OR5001 live?", "Ghent", [
        SubQA(index=1, question="What is the customer id of the order OR5001?", answer="CU107"),
        SubQA(index=2, question="What is the tier of the customer CU107?", answer="gold", depends_on=[1])])
    leaked = _chain(main_question="The customer CU107 placed order OR5001; what is the city?")
    out = asyncio.run(verify_batch(QAJudge(offline_model()), [good, bad, leaked], KeepRule("threshold", 1.0), 1, 3, run_id="r1"))
    assert [q.id for q in out.kept] == [good.id]
    by_subject = {r.subject: r for r in out.rejections}
    assert by_subject[bad.id].reason == "low_quality_score" and "task_completeness" in by_subject[bad.id].detail
    assert by_subject[leaked.id].reason == "structure:answers_hidden"
    assert {v.qa_id: v.qs for v in out.verifications}[bad.id] == 0.75
    assert all(v.run_id == "r1" and v.parents for v in out.verifications)
    # percentile: the cut-off comes from the batch's scores
    rule = KeepRule("percentile", percentile=50.0)
    assert rule.cutoff([0.5, 0.75, 1.0]) == 0.75
    lenient = asyncio.run(verify_batch(QAJudge(offline_model()), [good, bad], KeepRule("percentile", percentile=0.0), 1, 3))
    assert len(lenient.kept) == 2 and lenient.verifications[0].keep_rule.startswith("qs>=p0")


def test_model_judge_over_http(scripted_openai) -> None:
    scripted_openai.responder = EnvsResponder()
    with chat_model(model_cfg(scripted_openai.url)) as model:
        out = asyncio.run(verify_batch(QAJudge(model), [_chain()], KeepRule(), 1, 3))
    assert len(out.kept) == 1 and out.verifications[0].verifier == "model"
    assert "dependency_consistency" in scripted_openai.chat_requests()[0]["messages"][0]["content"]


def test_model_judge_non_json_is_a_rejection(scripted_openai) -> None:
    scripted_openai.responder = EnvsResponder(not_json_steps=(VERIFY,))
    with chat_model(model_cfg(scripted_openai.url)) as model:
        out = asyncio.run(verify_batch(QAJudge(model), [_chain()], KeepRule(), 1, 3))
    assert not out.kept and out.rejections[0].reason == "invalid_model_output"
