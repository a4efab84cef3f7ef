"""Contracts: JSON files agree with the typed models; content ids are stable and content-only."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from arenaforge.schemas import ContractError, FunctionDoc, Rejection, Tool
from arenaforge.schemas.contracts import (
    DIALECT,
    build_schema,
    check_json_schema,
    load_schema,
    schema_id,
    schema_path,
    validate,
)
from arenaforge.schemas.ids import canonical_json, content_id
from arenaforge.schemas.registry import kinds

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.text(max_size=20))
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12,
)
names = st.from_regex(r"[A-Za-z][A-Za-z0-9_]{0,20}", fullmatch=True)


@pytest.mark.parametrize("kind", sorted(kinds()))
def test_schema_file_matches_model(kind):
    model = kinds()[kind]
    on_disk = json.loads(schema_path(kind).read_text())
    assert on_disk == json.loads(json.dumps(build_schema(model))), "run `python -m arenaforge.schemas.generate`"
    assert on_disk["$schema"] == DIALECT and on_disk["$id"] == schema_id(kind)
    assert check_json_schema(on_disk) is None


def test_every_foundation_kind_has_a_contract():
    expected = {"tool", "server", "tool_chain", "task", "trajectory", "judge_score", "qa_instance", "environment",
                "rollout", "run", "rejection"}
    assert expected <= set(kinds())


@settings(max_examples=60, deadline=None)
@given(name=names, desc=st.text(max_size=40), server=st.text(min_size=1, max_size=10))
def test_valid_records_pass_their_contract_and_round_trip(name, desc, server):
    tool = Tool(server=server, function=FunctionDoc(name=name, description=desc), source="openai")
    validate("tool", tool.content())
    again = Tool.model_validate_json(tool.model_dump_json())
    assert again == tool and again.id == tool.id


@settings(max_examples=60, deadline=None)
@given(payload=json_values, run_a=st.text(max_size=5), run_b=st.text(max_size=5))
def test_content_id_ignores_run_and_depends_on_content(payload, run_a, run_b):
    a = Rejection(stage="s", subject="x", reason="malformed_json", payload=payload, run_id=run_a)
    b = Rejection(stage="s", subject="x", reason="malformed_json", payload=payload, run_id=run_b)
    assert a.id == b.id
    c = Rejection(stage="s", subject="x", reason="invalid_schema", payload=payload)
    assert c.id != a.id


@settings(max_examples=80, deadline=None)
@given(data=st.dictionaries(st.text(max_size=6), json_values, max_size=6))
def test_canonical_json_is_order_independent(data):
    reordered = dict(reversed(list(data.items())))
    assert canonical_json(data) == canonical_json(reordered)
    assert content_id("x", data) == content_id("x", reordered)


@settings(max_examples=60, deadline=None)
@given(bad_name=st.one_of(st.integers(), st.none(), st.text(alphabet=" !@#", min_size=1, max_size=5)))
def test_invalid_records_are_rejected_by_the_contract(bad_name):
    data = Tool(server="s", function=FunctionDoc(name="ok"), source="openai").content()
    data["function"]["name"] = bad_name
    with pytest.raises(ContractError, match="function/name"):
        validate("tool", data)


def test_extra_fields_are_forbidden_by_contract_and_model():
    data = Tool(server="s", function=FunctionDoc(name="ok"), source="openai").content()
    data["surprise"] = 1
    with pytest.raises(ContractError):
        validate("tool", data)
    with pytest.raises(ValueError):
        Tool.model_validate(data)


def test_check_json_schema_flags_non_schemas():
    assert check_json_schema({"type": "object"}) is None
    assert check_json_schema({"type": "dict"}) is not None
    assert load_schema("environment")["title"] == "Environment"
