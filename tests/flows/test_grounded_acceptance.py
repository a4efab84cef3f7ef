"""A model that is confident and consistent but wrong gets nothing accepted: the knowledge source decides.

`arenaforge envs synth` runs as a user runs it (the CLI in a subprocess, a real Prefect server, the
bundled sample source) against an OpenAI-compatible endpoint whose every answer is schema-valid: QAs
whose answers are not in the source, evidence that does not reproduce them or names what the source
lacks, reasoning that does not follow, a judge that passes everything, and tools that return the
model's answers. Nothing may be kept, and every rejection says why.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from arenaforge.schemas.models import Environment, QAInstance, Rejection
from arenaforge.testing.scripted_openai import chat_completion
from arenaforge.warehouse import Warehouse

_LIES: list[dict[str, Any]] = [
    # an answer that is nowhere in the source, with evidence that names a real record
    {"main_question": "Which city does customer CU107 live in?", "main_answer": "Atlantis",
     "sub_qas": [{"index": 1, "question": "What is the city of customer CU107?", "answer": "Atlantis",
                  "depends_on": [], "needs_tool": True,
                  "evidence": {"kind": "lookup", "table": "customers", "key": "customer_id", "value": "CU107",
                               "column": "city"}}]},
    # evidence about a table the source does not have
    {"main_question": "What colour is the dragon of customer CU107?", "main_answer": "green",
     "sub_qas": [{"index": 1, "question": "What colour is the dragon of customer CU107?", "answer": "green",
                  "depends_on": [], "needs_tool": True,
                  "evidence": {"kind": "lookup", "table": "dragons", "key": "customer_id", "value": "CU107",
                               "column": "colour"}}]},
    # a record the source does not have
    {"main_question": "Which city does customer CU999 live in?", "main_answer": "Ghent",
     "sub_qas": [{"index": 1, "question": "What is the city of customer CU999?", "answer": "Ghent",
                  "depends_on": [], "needs_tool": True,
                  "evidence": {"kind": "lookup", "table": "customers", "key": "customer_id", "value": "CU999",
                               "column": "city"}}]},
    # no evidence at all for a looked-up answer
    {"main_question": "How many orders did customer CU107 place?", "main_answer": "41",
     "sub_qas": [{"index": 1, "question": "How many orders did customer CU107 place?", "answer": "41",
                  "depends_on": [], "needs_tool": True}]},
    # a wrong count
    {"main_question": "How many orders did customer CU107 place?", "main_answer": "41",
     "sub_qas": [{"index": 1, "question": "How many orders did customer CU107 place?", "answer": "41",
                  "depends_on": [], "needs_tool": True,
                  "evidence": {"kind": "count", "table": "orders", "key": "customer_id", "value": "CU107"}}]},
    # grounded sub-answers, but a main answer that does not follow from them
    {"main_question": "Which city does customer CU107 live in?", "main_answer": "Paris",
     "sub_qas": [{"index": 1, "question": "What is the city of customer CU107?", "answer": "{city}",
                  "depends_on": [], "needs_tool": True,
                  "evidence": {"kind": "lookup", "table": "customers", "key": "customer_id", "value": "CU107",
                               "column": "city"}}]},
    # a comparison whose winner is not the larger one
    {"main_question": "Which of CU107 and CU109 joined later?", "main_answer": "CU107",
     "sub_qas": [{"index": 1, "question": "In which year did customer CU107 join?", "answer": "{joined107}",
                  "depends_on": [], "needs_tool": True,
                  "evidence": {"kind": "lookup", "table": "customers", "key": "customer_id", "value": "CU107",
                               "column": "joined_year"}},
                 {"index": 2, "question": "In which year did customer CU109 join?", "answer": "{joined109}",
                  "depends_on": [], "needs_tool": True,
                  "evidence": {"kind": "lookup", "table": "customers", "key": "customer_id", "value": "CU109",
                               "column": "joined_year"}},
                 {"index": 3, "question": "Which is later, {joined107} (for CU107) or {joined109} (for CU109)?",
                  "answer": "CU107", "depends_on": [1, 2], "needs_tool": False,
                  "evidence": {"kind": "compare", "of": [1, 2], "labels": ["CU107", "CU109"], "op": "max"}}]},
    # the truth, but the tool written for it returns the model's answer whatever it is asked
    {"main_question": "Which city does customer CU107 live in?", "main_answer": "{city}",
     "sub_qas": [{"index": 1, "question": "What is the city of customer CU107?", "answer": "{city}",
                  "depends_on": [], "needs_tool": True,
                  "evidence": {"kind": "lookup", "table": "customers", "key": "customer_id", "value": "CU107",
                               "column": "city"}}]},
    # a quote that is not in any passage (the sample source has no passages at all)
    {"main_question": "What does the manual say about returns?", "main_answer": "never",
     "sub_qas": [{"index": 1, "question": "What does the manual say about returns?", "answer": "never",
                  "depends_on": [], "needs_tool": True,
                  "evidence": {"kind": "span", "passage": "DOC00001", "text": "returns are never accepted"}}]},
]


class Liar:
    """Schema-valid, self-consistent, false: every step answers as if its lie were true."""

    def __init__(self, truth: dict[str, str]) -> None:
        self.truth = truth

    def __call__(self, req: dict[str, Any]) -> dict[str, Any]:
        step = ((req.get("response_format") or {}).get("json_schema") or {}).get("name", "")
        prompt = req["messages"][0]["content"]
        if step == "envs_decompose":
            k = int(re.search(r"Variant number[^:]*: (\d+)", prompt).group(1))  # type: ignore[union-attr]
            lie = json.dumps(_LIES[k % len(_LIES)])
            for name, value in self.truth.items():  # the true sub-answers where a lie needs them to look right
                lie = lie.replace("{" + name + "}", value)
            return chat_completion(content=lie)
        if step == "envs_verify_qa":  # a judge that passes everything
            qa = json.loads(prompt.split("Task:\n", 1)[1].split("\n\nChecks:", 1)[0])
            return chat_completion(content=json.dumps({
                "dependency_consistency": 1, "sub_question_atomicity": 1, "sequential_rationality": 1,
                "task_completeness": 1, "reasons": [],
                "tool_necessity": [{"index": s["index"], "needs_tool": s["needs_tool"]} for s in qa["sub_qas"]]}))
        if step in ("envs_tool_doc", "envs_augment_tool"):
            return chat_completion(content=json.dumps({"name": "lookup_customer", "description": "Look a customer up.",
                                                       "parameters": {"type": "object", "properties": {
                                                           "customer_id": {"type": "string"}},
                                                           "required": ["customer_id"]}}))
        if step == "envs_implement_tool":  # a tool that returns the model's answer, whatever it is asked
            answer = re.search(r"Gold answer the call must return: (.*)", prompt).group(1)  # type: ignore[union-attr]
            code = f"def lookup_customer(customer_id):\n    return {{'answer': {answer!r}}}\n"
            return chat_completion(content=json.dumps({"code": code, "call": {"arguments": {"customer_id": "CU107"}}}))
        return chat_completion(content="{}")


def test_consistent_but_false_model_gets_nothing_accepted(prefect_server, scripted_openai, tmp_path: Path) -> None:
    from arenaforge.tracks.envs.knowledge import load_sample

    sample = load_sample()
    truth = {"city": sample.query("SELECT city FROM customers WHERE customer_id = 'CU107'")[0][0],
             "joined107": str(sample.query("SELECT joined_year FROM customers WHERE customer_id = 'CU107'")[0][0]),
             "joined109": str(sample.query("SELECT joined_year FROM customers WHERE customer_id = 'CU109'")[0][0])}
    sample.close()
    assert int(truth["joined107"]) < int(truth["joined109"]), "the comparison lie needs CU107 to have joined earlier"
    scripted_openai.responder = Liar(truth)
    db = tmp_path / "liar.duckdb"
    done = subprocess.run(
        [sys.executable, "-m", "arenaforge.flows.cli", "--db", str(db), "--backend", "openai", "--base-url",
         scripted_openai.url, "--model", "liar", "envs", "synth", "--source", "sample", "--n", str(len(_LIES)),
         "--seed", "0"],
        cwd=tmp_path, env={**os.environ, "ARENAFORGE_MODEL__MAX_RETRIES": "0", "ARENAFORGE_SANDBOX__BACKEND": "process",
                                     "ARENAFORGE_SANDBOX__PROCESS_ALLOWS_MODEL_CODE": "true"},
        capture_output=True, text=True, timeout=600)
    # nothing survives, so the run says so and exits 2 (nothing produced), naming the commonest refusal
    assert done.returncode == 2, done.stderr[-2000:]
    assert f"no environments: all {len(_LIES)} inputs refused" in done.stderr and "evidence_mismatch" in done.stderr
    wh = Warehouse(db)
    qas = wh.load(QAInstance)
    assert [q.main_answer for q in qas] == [truth["city"]], "only the true QA is kept: no false one"
    assert wh.count("environments") == 0, "the true QA's tool answers a constant: it fails on the source's other records"
    rejections = wh.load(Rejection)
    assert len(rejections) == len(_LIES) and all(r.detail for r in rejections)
    assert sorted(r.reason for r in rejections) == sorted([
        "evidence_mismatch",  # Atlantis
        "evidence_error",  # no table dragons
        "evidence_mismatch",  # no customer CU999
        "no_evidence",
        "evidence_mismatch",  # 41 orders
        "ungrounded_main_answer",  # Paris
        "evidence_mismatch",  # the comparison
        "wrong_answer",  # the constant tool of the true QA
        "evidence_error",  # the sample source has no passages
    ])
    assert all(r.kind == "quality_rejection" for r in rejections)
    tool = next(r for r in rejections if r.reason == "wrong_answer")
    assert "the source says" in tool.detail and not wh.load(Environment)


def minimal_instance(schema: dict[str, Any], prompt: str) -> Any:
    """The plainest answer `schema` admits: the first enum or const, the minimum items, and text that agrees
    ("yes") and names the value the prompt asks the text to contain, so a lexical check passes."""
    if "const" in schema:
        return schema["const"]
    if "enum" in schema:
        return schema["enum"][0]
    if "anyOf" in schema:
        return minimal_instance(schema["anyOf"][0], prompt)
    kind = schema.get("type", "object")
    kind = next(k for k in kind if k != "null") if isinstance(kind, list) else kind
    if kind == "object":
        props = schema.get("properties", {})
        return {k: minimal_instance(props.get(k, {}), prompt) for k in schema.get("required", props)}
    if kind == "array":
        return [minimal_instance(schema.get("items", {}), prompt) for _ in range(schema.get("minItems", 0))]
    if kind in ("number", "integer"):
        return schema.get("maximum", 1)
    if kind == "boolean":
        return True
    named = re.findall(r'contains the [\w ]+ "([^"]+)"', prompt) or re.findall(r"starting from ([^.\n]+)\.", prompt)
    text = ("yes " + " ".join(named)).strip()
    return (text + " " + "yes" * schema.get("minLength", 0))[:schema.get("maxLength", 10_000)]


def yes_man(req: dict[str, Any]) -> dict[str, Any]:
    """Schema-obedient and agreeable: every answer is the minimal instance of the request's schema."""
    schema = ((req.get("response_format") or {}).get("json_schema") or {}).get("schema") or {"type": "object"}
    prompt = "\n".join(str(m.get("content") or "") for m in req["messages"])
    return chat_completion(content=json.dumps(minimal_instance(schema, prompt)))


def test_schema_obedient_yes_man_gets_nothing_kept_stepwise(prefect_server, scripted_openai, tmp_path: Path) -> None:
    """The small-model route (stepwise decomposition, tool code from evidence) keeps nothing a model that agrees
    with everything writes: its questions name the planned value, but its answers are not the source's."""
    scripted_openai.responder = yes_man
    db = tmp_path / "yes.lake"
    done = subprocess.run(
        [sys.executable, "-m", "arenaforge.flows.cli", "--db", str(db), "--backend", "openai", "--base-url",
         scripted_openai.url, "--model", "yes-man", "envs", "synth", "--source", "sample", "--n", "6", "--seed", "0",
         "--decomposition", "stepwise", "--tool-code", "evidence"],
        cwd=tmp_path, env={**os.environ, "ARENAFORGE_MODEL__MAX_RETRIES": "0", "ARENAFORGE_SANDBOX__BACKEND": "process"},
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 2, done.stderr[-2000:]
    assert "no environments: all 6 inputs refused" in done.stderr and "evidence_mismatch" in done.stderr
    wh = Warehouse(db)
    assert wh.count("qa_instances") == 0 and wh.count("environments") == 0
    rejections = wh.load(Rejection)
    assert len(rejections) == 6 and {r.reason for r in rejections} == {"evidence_mismatch"}
    asked = {(r.get("response_format") or {}).get("json_schema", {}).get("name") for r in scripted_openai.requests}
    assert {"envs_write_subqa", "envs_write_main_question"} <= asked, asked
