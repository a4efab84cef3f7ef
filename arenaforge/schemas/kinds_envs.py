"""Record kinds of the RL environment track (issue 4): QA verification, merges, distractor sets.

QA instances and environments themselves are foundation kinds (`arenaforge.schemas.models`); these
records hold what the `envs` flow decided about them, so every decision can be browsed and
traced back (parents = the QA / environment ids it judged).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from arenaforge.schemas.base import Frozen, Record
from arenaforge.schemas.models import FunctionDoc, GoldCall
from arenaforge.schemas.registry import register


@register
class QAVerification(Record):
    """The verdict on one QA instance: ASTRA's four checks, structure and tool necessity."""

    KIND = "qa_verification"
    ID_PREFIX = "qav"
    TABLE = "qa_verifications"

    qa_id: str
    verifier: Literal["rules", "model"] = Field(description="rules: offline programmatic checks; model: LLM judge.")
    checks: dict[str, bool] = Field(
        description="dependency_consistency, sub_question_atomicity, sequential_rationality, task_completeness."
    )
    qs: float = Field(ge=0, le=1, description="QS: mean of the four checks.")
    structural: dict[str, bool] = Field(
        default_factory=dict, description="acyclic, hops_within_budget, intermediate_needs_tool, answers_hidden."
    )
    tool_necessity: dict[str, bool] = Field(
        default_factory=dict, description="Sub-QA index (as text) -> whether answering it needs a tool."
    )
    keep_rule: str = Field(description="The keep rule applied, e.g. 'qs>=0.75' or 'qs>=p85 (0.75)'.")
    kept: bool
    reasons: list[str] = Field(default_factory=list, description="Failed checks, when not kept.")


class MergeMember(Frozen):
    env_id: str = Field(description="Environment (before merging) that owned the tool.")
    qa_id: str | None = None
    tool: str = Field(description="Tool name in that environment.")


@register
class EnvMerge(Record):
    """One group of functionally equivalent tools and whether merging them kept every QA correct."""

    KIND = "env_merge"
    ID_PREFIX = "merge"
    TABLE = "env_merges"

    signature: str = Field(description="Operation + argument and return types that made the tools equivalent.")
    merged_tool: str = Field(description="Name of the merged tool.")
    members: list[MergeMember] = Field(min_length=2)
    method: Literal["signature", "model"] = "signature"
    merged: bool = Field(description="False when re-verification failed and the tools were kept apart.")
    rows: int = Field(default=0, ge=0, description="Mock-data rows of the merged tool.")
    reasons: list[str] = Field(default_factory=list)


class MergeProbe(Frozen):
    arguments: dict[str, Any]
    answer: str | None = Field(default=None, description="What the source gives for these arguments (None: any but gold).")


@register
class MergeCandidate(Record):
    """One sandbox-verified tool of a QA's draft as merging saw it, and its place in the merge groups.

    Written with its window's environments. A later window or run looks candidates up by signature
    (`lookups.merge_candidates`) and goes on with the greedy grouping where it stopped, so it makes the
    merges a batch merge over all of them would (docs/ENVS.md, merging)."""

    KIND = "merge_candidate"
    ID_PREFIX = "mcand"
    TABLE = "merge_candidates"
    ID_EXCLUDE = frozenset({"written_by"})  # how it was made, not what it is

    qa_id: str
    env_id: str = Field(description="The QA's environment before merging (as in `MergeMember`).")
    group: str = Field(description="Its group of equivalent tools: '<qa_id>/<tool>' of the group's first tool.")
    subset: str = Field(description="Its greedy subset (members whose gold answers do not collide): its first tool's key.")
    position: int = Field(ge=0, description="Order of arrival in the group.")
    served_by: int = Field(default=0, ge=0, description="Members of its subset the merged tool in its environment was "
                                                        "built from (the first ones); 0: it kept its own tool.")
    signature: str
    doc: FunctionDoc
    source: str
    data: Any = None
    calls: list[GoldCall] = Field(default_factory=list)
    probes: list[MergeProbe] = Field(default_factory=list)
    origin: str = "offline"
    written_by: dict[str, Literal["model", "program"]] | None = Field(
        default=None, description="Who wrote its document and its code (tool_docs, tool_code: model or program).")


class DistractorPick(Frozen):
    name: str
    band: Literal["high", "medium", "low"]
    similarity: float = Field(description="Cosine similarity of the tool doc to the closest task tool.")
    source_env: str | None = Field(default=None, description="Environment the distractor's code came from.")


@register
class DistractorSet(Record):
    """The task-irrelevant tools added to one environment, with their similarity bands."""

    KIND = "distractor_set"
    ID_PREFIX = "dset"
    TABLE = "distractor_sets"

    env_id: str = Field(description="The environment that carries these distractors.")
    mix: dict[str, int] = Field(description="Requested count per band (high/medium/low).")
    picks: list[DistractorPick] = Field(default_factory=list)
    embedder: str = Field(default="all-MiniLM-L6-v2")
