"""The evidence-kind registry: one class per kind of `Evidence`, asked instead of comparing `evidence.kind`."""

from __future__ import annotations

import hashlib
import json
import typing

import pytest

from arenaforge.schemas.models import Evidence
from arenaforge.tracks.envs.evidence import KINDS, kind_of
from arenaforge.tracks.envs.tool_impl import BuildError


def test_every_kind_the_record_allows_has_its_class() -> None:
    allowed = typing.get_args(Evidence.model_fields["kind"].annotation)
    assert list(KINDS) == list(allowed)
    assert all(KINDS[name].name == name for name in allowed)


def test_the_decomposition_schema_lists_the_registered_kinds_in_the_requests_bytes() -> None:
    """The answer schema's kind enum comes from `KINDS`; the request (its hash is the LLM cache key) is the one the
    hand-written enum made. A new kind changes the requests on purpose: then this hash changes with it."""
    from arenaforge.tracks.envs.decompose_qa import DECOMPOSE, EVIDENCE_SCHEMA

    assert EVIDENCE_SCHEMA["properties"]["kind"] == {"enum": list(KINDS)}
    sent = json.dumps(DECOMPOSE.schema, ensure_ascii=False).encode()
    assert hashlib.sha256(sent).hexdigest() == "995b591a30bed3ae382a5153e32cde03d19b6eb44640fab9233b1b090602b4c5"


@pytest.mark.parametrize(("evidence", "line"), [
    (Evidence(kind="lookup", table="customers", key="customer_id", value="CU107", column="city"),
     "lookup customers.city by customer_id = CU107"),
    (Evidence(kind="count", table="orders", key="customer_id", value="CU107"), "count orders by customer_id = CU107"),
    (Evidence(kind="sum", table="orders", key="customer_id", value="CU107", column="amount"),
     "sum orders.amount by customer_id = CU107"),
    (Evidence(kind="span", passage="p3", text="in 1912"), "span of passage p3: 'in 1912'"),
    (Evidence(kind="compare", of=[1, 2], labels=["a", "b"], op="max"), "max of sub-QAs [1, 2] (a, b)"),
])
def test_each_kind_summarises_itself(evidence: Evidence, line: str) -> None:
    assert kind_of(evidence).summary(evidence) == line


def test_a_reasoning_step_makes_no_tool() -> None:
    from arenaforge.schemas.models import QAInstance, SubQA

    sub = SubQA(index=3, question="which?", answer="a", depends_on=[1, 2], needs_tool=False,
                evidence=Evidence(kind="compare", of=[1, 2], labels=["a", "b"], op="max"))
    qa = QAInstance.model_construct(sub_qas=[sub])
    with pytest.raises(BuildError, match="no evidence a tool can be built from"):
        kind_of(sub.evidence).data(None, qa, sub, None)  # type: ignore[arg-type]
    assert [KINDS[k].returns for k in ("lookup", "count", "sum")] == ["object", "integer", "number"]
