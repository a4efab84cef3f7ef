"""BFCL single-turn: loading the real data, the AST matcher, and the whole evaluation with a scripted policy."""

from __future__ import annotations

import asyncio
import json
import re
import types

import pytest

from arenaforge.schemas.models import FunctionDoc
from arenaforge.testing.scripted_policy import ScriptedEngine
from arenaforge.tracks.train.rollout.bfcl import BfclUnavailable, ParsedCall, calls_match, evaluate_bfcl, load_bfcl
from tests.support.requirements import require_bfcl_checker, require_shared_data
from tests.support.rl import tiny_model_path

AREA = FunctionDoc(name="calculate_triangle_area", parameters={
    "type": "object", "properties": {"base": {"type": "integer"}, "height": {"type": "integer"},
                                     "unit": {"type": "string"}}, "required": ["base", "height"]})
TRUTH = [{"calculate_triangle_area": {"base": [10], "height": [5], "unit": ["units", ""]}}]


def _items(limit):
    try:
        return load_bfcl(limit=limit)
    except BfclUnavailable:
        return load_bfcl(limit=limit, shared_data=require_shared_data())


def test_ast_match_follows_bfcl_rules():
    ok = ParsedCall("calculate_triangle_area", {"base": 10, "height": 5.0})
    assert calls_match([ok], TRUTH, [AREA])  # optional param omitted; 5.0 == 5
    assert calls_match([ParsedCall("calculate_triangle_area", {"base": 10, "height": 5, "unit": "Units"})], TRUTH, [AREA])
    assert not calls_match([ParsedCall("calculate_triangle_area", {"base": 10})], TRUTH, [AREA])  # required missing
    assert not calls_match([ParsedCall("calculate_triangle_area", {"base": 10, "height": 6})], TRUTH, [AREA])
    assert not calls_match([ParsedCall("calculate_triangle_area", {"base": 10, "height": 5, "color": "red"})],
                           TRUTH, [AREA])  # unknown parameter
    assert not calls_match([ok, ok], TRUTH, [AREA])  # an extra call
    two = [{"calculate_triangle_area": {"base": [1], "height": [2]}}, {"calculate_triangle_area": {"base": [3], "height": [4]}}]
    swapped = [ParsedCall("calculate_triangle_area", {"base": 3, "height": 4}),
               ParsedCall("calculate_triangle_area", {"base": 1, "height": 2})]
    assert calls_match(swapped, two, [AREA]) and not calls_match(swapped[:1] * 2, two, [AREA])


def _gold_answers(items):
    """A policy answering each question with the first possible value of every non-optional parameter."""
    by_prompt: dict[str, str] = {}

    def first_option(values):
        return next(v for v in values if v != "")

    for item in items:
        calls = []
        for expected in item.ground_truth:
            (name, params), = expected.items()
            args = {p: first_option(v) for p, v in params.items() if "" not in v}
            calls.append(f'<tool_call>\n{json.dumps({"name": name, "arguments": args})}\n</tool_call>')
        by_prompt[item.messages[-1]["content"]] = "\n".join(calls)

    def respond(prompt: str, _index: int) -> str:
        return next(answer for question, answer in by_prompt.items() if question in prompt)

    return respond


def test_real_data_loads_and_a_gold_answering_policy_scores_one():
    from transformers import AutoTokenizer

    items, origin = _items(limit=5)
    assert origin and sorted({i.category for i in items}) == ["multiple", "parallel", "simple"] and len(items) == 15
    tok = AutoTokenizer.from_pretrained(tiny_model_path())
    respond = _gold_answers(items)
    engine = ScriptedEngine(tok, respond)
    result = asyncio.run(evaluate_bfcl(engine, tok, items, max_tokens=4096, max_prompt_tokens=100_000))
    assert result["accuracy"] == 1.0 and all(c["items"] == 5 for c in result["categories"].values())
    wrong = ScriptedEngine(tok, lambda prompt, i: "I do not know.")
    assert asyncio.run(evaluate_bfcl(wrong, tok, items, max_prompt_tokens=100_000))["accuracy"] == 0.0


def test_bfcl_s_own_checker_scores_the_answers_and_our_matcher_agrees(monkeypatch):
    """bfcl-eval's decoder and AST checker (its own venv) give the verdicts; one wrong value per answer flips them."""
    from transformers import AutoTokenizer

    require_bfcl_checker()
    items, _ = _items(limit=5)
    tok = AutoTokenizer.from_pretrained(tiny_model_path())
    respond = _gold_answers(items)
    result = asyncio.run(evaluate_bfcl(ScriptedEngine(tok, respond), tok, items, max_tokens=4096,
                                       max_prompt_tokens=100_000))
    assert result["scorer"] == "bfcl-eval ast_checker" and result["accuracy"] == 1.0
    assert result["matcher_agrees"] == len(items)

    def off_by_one(prompt: str, index: int) -> str:  # the first number of each answer changed: a wrong value
        answer = respond(prompt, index)
        return re.sub(r"(?<=: )(-?\d+)", lambda m: str(int(m.group(1)) + 1), answer, count=1)

    changed = [i.id for i in items if off_by_one(i.messages[-1]["content"], 0) != respond(i.messages[-1]["content"], 0)]
    result = asyncio.run(evaluate_bfcl(ScriptedEngine(tok, off_by_one), tok, items, max_tokens=4096,
                                       max_prompt_tokens=100_000))
    assert changed and all(result["per_item"][i] is False for i in changed)
    assert result["matcher_agrees"] == len(items)


def test_missing_data_is_reported_not_raised_elsewhere(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("ARENAFORGE_SHARED_DATA", str(tmp_path / "nowhere"))
    import arenaforge.tracks.train.rollout.bfcl as bfcl_module

    def no_package(name):  # scripts/setup.sh installs bfcl-eval: hide it, as on a machine without it
        raise ModuleNotFoundError(name)

    monkeypatch.setattr(bfcl_module, "resources", types.SimpleNamespace(files=no_package))
    with pytest.raises(BfclUnavailable, match="no BFCL data"):
        load_bfcl(shared_data=tmp_path / "nowhere")
