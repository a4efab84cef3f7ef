"""Typed mirrors of the JSON Schema contracts in `arenaforge/schemas/json/`.

One `Record` subclass per record kind. The JSON files are generated from these classes
(`python -m arenaforge.schemas.generate`) and a test fails if the two drift apart, so outside readers
(trainers, exports) can rely on the files while code uses the classes.
"""

from __future__ import annotations

import re
from typing import Any, ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from arenaforge.schemas.base import Frozen, Provenance, Record
from arenaforge.schemas.errors import ArenaforgeError, FailureKind
from arenaforge.schemas.reasons import RejectReason

JsonSchema = dict[str, Any]


# --------------------------------------------------------------------------- OpenAI wire shapes
class FunctionDoc(Frozen):
    """An OpenAI function definition: what the model sees of a tool."""

    name: str = Field(description="Function name, [A-Za-z0-9_.-], at most 64 characters.", pattern=r"^[A-Za-z0-9_.\-]{1,64}$")
    description: str = Field(default="", description="What the tool does, in natural language.")
    parameters: JsonSchema = Field(
        default_factory=lambda: {"type": "object", "properties": {}},
        description="JSON Schema (type object) of the arguments.",
    )

    def as_openai_tool(self) -> dict[str, Any]:
        return {"type": "function", "function": self.model_dump(mode="json")}


class FunctionCall(Frozen):
    name: str = Field(description="Name of the called function.")
    arguments: str = Field(description="Arguments as a JSON-encoded string, as OpenAI sends them.")


class ToolCall(Frozen):
    id: str = Field(description="Call id, echoed by the tool message that answers it.")
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(Frozen):
    """One OpenAI chat message, possibly carrying tool calls or a tool result."""

    role: Literal["system", "user", "assistant", "tool"]
    content: str | None = Field(default=None, description="Text content; null for a pure tool-calling turn.")
    tool_calls: list[ToolCall] | None = Field(default=None, description="Calls made by an assistant turn.")
    tool_call_id: str | None = Field(default=None, description="For role=tool: the call this message answers.")
    name: str | None = Field(default=None, description="For role=tool: the tool's name.")


class Usage(Frozen):
    prompt_tokens: int = 0
    completion_tokens: int = 0
    total_tokens: int = 0


# --------------------------------------------------------------------------- SFT track
class Tool(Record):
    """A normalised tool document (OpenAI function schema) belonging to one server."""

    KIND = "tool"
    ID_PREFIX = "tool"
    TABLE = "tools"
    ID_EXCLUDE = frozenset({"source_ref"})  # an absolute path: the same document from two checkouts is one tool

    server: str = Field(description="Name of the server (service) the tool belongs to.")
    function: FunctionDoc
    returns: JsonSchema | None = Field(default=None, description="JSON Schema of the tool's output, when known.")
    source: str = Field(description="Where the document came from: openai, astra, bfcl, acebench, stabletoolbench, mcp.")
    source_ref: str | None = Field(default=None, description="File and record (or MCP command) it was read from.")
    code: str | None = Field(default=None, description="Python source implementing the tool, when it has code.")


class Server(Record):
    """A group of tools offered by one service (an MCP server, a RapidAPI tool, a BFCL record)."""

    KIND = "server"
    ID_PREFIX = "srv"
    TABLE = "servers"

    name: str = Field(description="Unique server name.")
    title: str = Field(default="", description="Human title.")
    description: str = Field(default="", description="What the service offers.")
    domain: str = Field(default="general", description="Domain label, e.g. finance, travel.")
    source: str = Field(description="Source kind, as for Tool.source.")
    tool_names: list[str] = Field(description="Names of the server's tools, sorted.")
    launch: list[str] | None = Field(default=None, description="Command that starts the live MCP server over stdio.")


class ToolChain(Record):
    """A sampled sequence of legal consecutive tool calls on one server."""

    KIND = "tool_chain"
    ID_PREFIX = "chain"
    TABLE = "tool_chains"

    server: str
    tools: list[str] = Field(min_length=1, description="Tool names in call order.")
    verified: bool = Field(description="Whether the chain passed verification.")
    reasons: list[str] = Field(default_factory=list, description="Why verification failed, if it did.")


class Task(Record):
    """A synthesized user query (an SFT 'task'), with its quality scores."""

    KIND = "task"
    ID_PREFIX = "task"
    TABLE = "tasks"

    server: str
    chain_id: str | None = Field(default=None, description="The chain it was conditioned on (chain mode).")
    mode: Literal["chain", "server"]
    query: str = Field(min_length=1)
    persona: str | None = None
    augmentation: Literal["none", "diversity", "complexity", "persona"] = "none"
    scores: dict[str, float] = Field(default_factory=dict, description="clarity, realism, tool_necessity in 0..1.")
    accepted: bool
    reasons: list[str] = Field(default_factory=list)


class Trajectory(Record):
    """A multi-turn agent conversation in OpenAI tool-calling form."""

    KIND = "trajectory"
    ID_PREFIX = "traj"
    TABLE = "trajectories"

    task_id: str
    server: str
    messages: list[ChatMessage] = Field(min_length=2)
    tools: list[FunctionDoc]
    executor: Literal["mcp", "sandbox", "simulator", "mixed"] = "simulator"
    fault_rate: float = Field(default=0.0, ge=0, le=1, description="Configured fault-injection rate.")
    faults_injected: int = Field(default=0, ge=0)
    tool_calls: int = Field(default=0, ge=0)
    final_answer: str | None = None


class JudgeScore(Record):
    """Seven-dimension trajectory score (ASTRA §1a.5), each in 0..1."""

    KIND = "judge_score"
    ID_PREFIX = "score"
    TABLE = "judge_scores"

    trajectory_id: str
    judge: Literal["rules", "model"]
    query_understanding: float = Field(ge=0, le=1)
    planning: float = Field(ge=0, le=1)
    tool_response_understanding: float = Field(ge=0, le=1)
    context_conditioned_planning: float = Field(ge=0, le=1)
    tool_call_status: float = Field(ge=0, le=1)
    tool_conciseness: float = Field(ge=0, le=1)
    final_answer_quality: float = Field(ge=0, le=1)
    mean: float = Field(ge=0, le=1)
    keep: bool
    rationale: str | None = None

    DIMENSIONS: ClassVar[tuple[str, ...]] = (
        "query_understanding",
        "planning",
        "tool_response_understanding",
        "context_conditioned_planning",
        "tool_call_status",
        "tool_conciseness",
        "final_answer_quality",
    )


# --------------------------------------------------------------------------- RL track
class Evidence(Frozen):
    """How a sub-answer follows from the knowledge source. A model may propose it; only the source decides.
    Each kind's behaviour (summary, grounding, tool data and code) is its class in `tracks/envs/evidence/`.

    lookup   the `column` of the `table` row whose `key` column holds `value`
    count    how many rows of `table` have `value` in `key`
    sum      the total of `column` over the rows of `table` with `value` in `key` (rounded to 2 places)
    span     `text`, found verbatim in passage `passage` of a text source (its `passages` table)
    compare  a reasoning step: of the sub-QAs `of`, the `labels` entry of the one whose answer is largest
             (op max) or smallest (op min)
    """

    kind: Literal["lookup", "count", "sum", "span", "compare"]
    table: str | None = Field(default=None, description="lookup/count/sum: the table.")
    key: str | None = Field(default=None, description="lookup/count/sum: the column the question names a value of.")
    value: Any = Field(default=None, description="lookup/count/sum: that value.")
    column: str | None = Field(default=None, description="lookup: the column answered; sum: the column totalled.")
    text: str | None = Field(default=None, description="span: the exact words of the source that state the answer.")
    passage: str | None = Field(default=None, description="span: id of the passage holding `text`.")
    of: list[int] = Field(default_factory=list, description="compare: indices of the sub-QAs compared.")
    labels: list[str] = Field(default_factory=list, description="compare: the name each compared sub-QA stands for.")
    op: Literal["max", "min"] | None = Field(default=None, description="compare: which one wins.")


class SubQA(Frozen):
    index: int = Field(ge=1, description="1-based index; 0 is reserved for the main question.")
    question: str
    answer: str
    depends_on: list[int] = Field(default_factory=list, description="Indices of sub-QAs whose answers this one needs.")
    needs_tool: bool = True
    evidence: Evidence | None = Field(default=None, description="How the answer follows from the knowledge source "
                                                                "(every tool-needing sub-QA has it, checked on the source).")


class QAInstance(Record):
    """A main question decomposed into a DAG of sub-QAs (ASTRA §1b.1)."""

    KIND = "qa_instance"
    ID_PREFIX = "qa"
    TABLE = "qa_instances"

    source: str = Field(description="Knowledge source name.")
    main_question: str
    main_answer: str
    sub_qas: list[SubQA] = Field(min_length=1)
    hop_level: int = Field(ge=1, description="Length of the longest dependency path.")
    parallel: bool = Field(description="Whether some sub-QAs are independent of each other.")
    structure: Literal["single_hop", "parallel_single_hop", "multi_hop", "parallel_multi_hop"]
    mode: Literal["conditioned", "unconditioned"] = "unconditioned"
    seed_question: str | None = None


class GoldCall(Frozen):
    """A call statement that must reproduce a gold sub-answer."""

    tool: str
    arguments: dict[str, Any]
    sub_qa: int | None = Field(default=None, description="Index of the sub-QA this call answers.")
    answer: str | None = Field(default=None, description="Gold answer the call must return (normalised match).")


class Verification(Frozen):
    passed: bool
    checks: dict[str, bool] = Field(default_factory=dict)
    details: list[str] = Field(default_factory=list)


class ToolModule(Frozen):
    """One namespace of tool code in a package of format 2: its own module globals, its own class instance."""

    name: str = Field(pattern=r"^[A-Za-z_][A-Za-z0-9_]*$", description="Namespace name (the file modules/<name>.py).")
    code: str = Field(description="Python source of this namespace.")
    class_name: str | None = Field(default=None, description="Public methods of this class are tools; None: module functions.")
    data_var: str | None = Field(default=None, description="Functions shape: module global this module's state is bound to.")
    init_args: dict[str, Any] = Field(default_factory=dict, description="Keyword arguments for the class constructor.")
    load_args: dict[str, Any] = Field(
        default_factory=dict, description="Extra keyword arguments for the class's loader (e.g. BFCL's long_context).")
    state_key: str | None = Field(
        default=None, description="Key of `initial_state` that holds this module's state; None: the whole initial_state.")
    tools: list[str] = Field(
        default_factory=list, description="Tools this module serves; empty: whichever it defines that no module lists.")


class NativeCheck(Frozen):
    """How an imported suite scores an episode itself, kept beside our F1 (`arenaforge eval --suite`)."""

    suite: str = Field(description="The suite the environment was imported into (`eval --suite NAME`).")
    kind: Literal["state_hash", "bfcl_multi_turn", "harbor_tests"] = Field(
        description="state_hash: the episode's final session state (Pool.state) must hash to gold_state_sha256. "
                    "bfcl_multi_turn: BFCL's checks after every turn with gold calls: the state check (the classes' "
                    "state hashes to the turn's state_sha256) and the response check (every one of the turn's "
                    "gold_results is among the episode's results so far). "
                    "harbor_tests: the task's own tests/test.sh, run in the episode's container after the agent's "
                    "turn, must write a reward of at least 1 to /logs/verifier/reward.txt (or reward.json).")
    gold_state_sha256: str = Field(default="", description="SHA-256 of the canonical JSON of the state after the gold "
                                                           "calls (empty for harbor_tests: the container is the state).")
    source: str = Field(description="Where the environment came from: the file(s) and the SHA-256 of their bytes, "
                                    "or the suite's version and task id.")
    turns: list[dict[str, Any]] = Field(
        default_factory=list, description="bfcl_multi_turn: per turn, the user's messages, the number of gold calls, "
                                          "their results (gold_results) and the state's hash after them (state_sha256).")


class ContainerTask(Frozen):
    """Format 2: the tools run in a task's own container (an imported Harbor task), not in the sandbox worker.

    The image is built from `dockerfile` and `context` (the task's environment/ directory) with no registry: every
    FROM image must be present locally. A session is one container of that image; the tools (`run_shell`,
    `read_file`, `write_file`) run in it; after the episode `tests` is copied to /tests and test.sh is run there."""

    dockerfile: str = Field(description="environment/Dockerfile, as written.")
    context: dict[str, str] = Field(default_factory=dict, description="The other files of environment/ (path -> text).")
    build_args: dict[str, str] = Field(default_factory=dict, description="Docker build arguments (e.g. BASE_IMAGE).")
    tests: dict[str, str] = Field(description="tests/ (path -> text), uploaded to /tests after the agent's turn.")
    workdir: str | None = Field(default=None, description="Where the shell tool starts (default: the image's WORKDIR).")
    agent_timeout_s: float = Field(default=600.0, gt=0, description="task.toml [agent] timeout_sec.")
    verifier_timeout_s: float = Field(default=600.0, gt=0, description="task.toml [verifier] timeout_sec.")


REQUIREMENT = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?(\[[A-Za-z0-9._,-]+\])?"
                         r"(\s*(===|==|!=|~=|>=|<=|<|>)\s*[A-Za-z0-9.*+!_-]+)(\s*,\s*(===|==|!=|~=|>=|<=|<|>)\s*[A-Za-z0-9.*+!_-]+)*")
FORMAT_2_FIELDS = ("modules", "tool_turns", "native", "container", "requirements")


class Environment(Record):
    """An executable tool environment: docs, code, state, gold calls and verification.

    Format 2 (`modules`, `tool_turns`, `native`, `container`) is additive: an environment that sets none of them is format 1,
    and its id is what it was before format 2 existed."""

    KIND = "environment"
    ID_PREFIX = "env"
    TABLE = "environments"

    name: str
    qa_id: str | None = Field(default=None, description="QA instance the environment serves.")
    tools: list[FunctionDoc] = Field(min_length=1, description="Every tool the agent sees, distractors included.")
    code: str = Field(description="Python source (standard library only) implementing the tools.")
    style: Literal["functions", "class"] = Field(
        default="functions", description="functions: module-level functions; class: public methods of `class_name`."
    )
    class_name: str | None = None
    data_var: str | None = Field(
        default=None, description="functions style: module global that initial_state is bound to (e.g. DATA)."
    )
    initial_state: dict[str, Any] | None = Field(default=None, description="JSON state loaded into a fresh session.")
    calls: list[GoldCall] = Field(default_factory=list)
    gold_answers: list[str] = Field(default_factory=list)
    distractors: list[str] = Field(default_factory=list, description="Names of tools in `tools` that are distractors.")
    question: str | None = Field(default=None, description="The task prompt the agent is given.")
    verification: Verification | None = None
    modules: list[ToolModule] = Field(
        default_factory=list, description="Format 2: tool code in several namespaces, loaded in order (then `code`, `style`, "
                                          "`class_name` and `data_var` are unused; rendering comes from the first).")
    tool_turns: dict[str, int] = Field(
        default_factory=dict, description="Format 2: tool name -> first turn (0-based) at which the agent sees and may "
                                          "call it; tools not named here are visible from turn 0.")
    native: NativeCheck | None = Field(default=None, description="Format 2: the imported suite's own check.")
    container: ContainerTask | None = Field(default=None, description="Format 2: the tools run in this task's own "
                                                                      "container (an imported Harbor task).")
    requirements: list[str] = Field(
        default_factory=list, description="Format 2: Python packages the tool code imports, as pinned PEP 508 requirements "
                                          "(`mpmath==1.3.0`), installed from local wheels (docs/ENVS.md).")

    @property
    def format_version(self) -> int:
        return 2 if any(getattr(self, f) for f in FORMAT_2_FIELDS) else 1

    def compute_id(self) -> str:  # format-2 fields left unset stay out of the id: format-1 ids never change
        from arenaforge.schemas.ids import content_id

        unset = {f for f in FORMAT_2_FIELDS if not getattr(self, f)}
        return content_id(self.ID_PREFIX, self.model_dump(mode="json", exclude=set(self.ID_EXCLUDE) | unset))

    def visible_tools(self, turn: int) -> list[FunctionDoc]:
        """The tools the agent sees at `turn` (0-based)."""
        return [t for t in self.tools if self.tool_turns.get(t.name, 0) <= turn]

    @model_validator(mode="after")
    def _format_2_names(self) -> "Environment":
        names = {t.name for t in self.tools}
        unknown = sorted(set(self.tool_turns) - names)
        if unknown:
            raise ValueError(f"tool_turns names tools that are not in tools: {unknown}")
        modules = [m.name for m in self.modules]
        if len(modules) != len(set(modules)):
            raise ValueError(f"duplicate module names: {sorted({n for n in modules if modules.count(n) > 1})}")
        return self

    @field_validator("requirements")
    @classmethod
    def _plain_requirements(cls, requirements: list[str]) -> list[str]:
        # a name and version specifiers only: no URL, path, marker or pip option reaches the installer
        bad = [r for r in requirements if not REQUIREMENT.fullmatch(r)]
        if bad:
            raise ValueError(f"requirements must be a package name with version specifiers (mpmath==1.3.0), not {bad}")
        return requirements

    @field_validator("tools")
    @classmethod
    def _unique_names(cls, tools: list[FunctionDoc]) -> list[FunctionDoc]:
        names = [t.name for t in tools]
        if len(names) != len(set(names)):
            raise ValueError(f"duplicate tool names: {sorted({n for n in names if names.count(n) > 1})}")
        return tools


class RewardBreakdown(Frozen):
    """F1 trajectory reward with its components (METHOD.md §1c)."""

    recall: float = Field(ge=0, le=1)
    precision: float = Field(ge=0)
    f1: float = Field(ge=0, le=1)
    solved: int = Field(ge=0, description="n̂: sub-tasks solved, each counted once.")
    subtasks: int = Field(ge=0, description="n: sub-tasks in the task.")
    calls: int = Field(ge=0, description="c: every call issued, malformed ones included.")


class Rollout(Record):
    """One policy episode in an environment, with its reward."""

    KIND = "rollout"
    ID_PREFIX = "roll"
    TABLE = "rollouts"

    env_id: str
    engine: str = Field(description="Policy engine: hf, vllm, scripted, openai.")
    policy: str = Field(description="Model or checkpoint id.")
    group: str | None = Field(default=None, description="GRPO group id (same prompt).")
    sample: int = Field(default=0, ge=0)
    messages: list[ChatMessage] = Field(default_factory=list)
    prompt_ids: list[int] = Field(default_factory=list)
    response_ids: list[int] = Field(default_factory=list)
    response_mask: list[int] = Field(default_factory=list, description="1 on model tokens, 0 on tool tokens.")
    logprobs: list[float] = Field(default_factory=list)
    reward: RewardBreakdown
    status: Literal["finished", "max_turns", "max_length", "env_failure"]
    failure_reason: str | None = None
    tool_errors: int = Field(default=0, ge=0)
    format_errors: int = Field(default=0, ge=0)
    native_passed: bool | None = Field(default=None, description="The imported suite's own verdict (Environment.native); "
                                                                 "None when the environment has none.")
    native_reason: str | None = Field(default=None, description="Why the suite's own check failed, in its terms.")

    def compute_id(self) -> str:  # unset native fields stay out of the id: rollouts without them keep theirs
        from arenaforge.schemas.ids import content_id

        unset = {f for f in ("native_passed", "native_reason") if getattr(self, f) is None}
        return content_id(self.ID_PREFIX, self.model_dump(mode="json", exclude=set(self.ID_EXCLUDE) | unset))


ToolOutcome = Literal["ok", "no_output", "error", "timeout", "limit"]


class ToolObservation(Frozen):
    """What one tool call returned, as the agent sees it (rStar2-Agent's four outcomes plus limit hits)."""

    outcome: ToolOutcome = Field(
        description="ok: output; no_output: ran, printed/returned nothing; error: raised (its message in error); "
        "timeout: ran past its time limit; limit: hit a memory/pids/CPU/output limit or crashed its session. "
        "(A failure of the sandbox itself is never an outcome: the runtime raises an EnvironmentFailure.)"
    )
    output: str = Field(default="", description="Returned value rendered as text (JSON for structured values).")
    error: str | None = Field(default=None, description="The error as the agent sees it (`Error: <message>`), or the limit hit.")
    traceback: str | None = Field(default=None, description="The tool's traceback when it raised (for debugging, not shown).")
    truncated: bool = Field(default=False, description="Output was cut at the output limit (marked in the text).")
    duration_s: float = Field(default=0.0, ge=0)

    def text(self) -> str:
        """The observation text appended to the conversation."""
        if self.outcome == "ok":
            return self.output
        if self.outcome == "no_output":
            return "(no output)"
        if self.outcome == "timeout":
            return f"Timeout: {self.error or 'the call exceeded its time limit'}"
        return f"Error: {self.error or 'unknown error'}"


class Run(Record):
    """One execution of a flow."""

    KIND = "run"
    ID_PREFIX = "run"
    TABLE = "runs"

    flow: str
    params: dict[str, Any] = Field(default_factory=dict)
    started_at: str = Field(description="ISO-8601 UTC start time (part of the id).")
    status: Literal["running", "completed", "failed", "crashed"] = "running"
    finished_at: str | None = None
    counts: dict[str, int] = Field(default_factory=dict)
    error: str | None = None
    host: str | None = Field(default=None, description="Machine whose process runs it (to tell a crashed run).")
    pid: int | None = Field(default=None, description="Process that runs it.")

    def compute_id(self) -> str:  # status/finish change over a run's life; identity doesn't
        from arenaforge.schemas.ids import content_id

        return content_id(self.ID_PREFIX, {"flow": self.flow, "params": self.params, "started_at": self.started_at})


class Rejection(Record):
    """A record a stage refused, or could not produce, kept with its reason (never silently dropped)."""

    KIND = "rejection"
    ID_PREFIX = "rej"
    TABLE = "rejections"

    stage: str = Field(description="Stage that rejected it, e.g. ingest, verify_qa, sandbox_verify.")
    subject: str = Field(description="Id or name of the rejected thing.")
    reason: RejectReason = Field(description="Machine-readable reason code (schemas/reasons.py).")
    detail: str = Field(default="", description="Human-readable explanation, with the full error text.")
    payload: Any = Field(default=None, description="The rejected content, as JSON.")
    kind: FailureKind = Field(
        default=FailureKind.QUALITY,
        description="quality_rejection: the record's own data failed a check; invalid_output: the model never "
                    "answered within the step's contract; provider_* / infrastructure: what it depended on failed.")
    environment_failure: bool = Field(
        default=False, description="True when what the record depended on (model endpoint, sandbox, MCP server) failed, "
                                   "not the record: such failures are excluded from quality figures and rewards.")

    @model_validator(mode="after")
    def _kind_and_flag_agree(self) -> "Rejection":
        # rows written before `kind` existed carry only the flag: an environment failure of unknown kind
        if self.environment_failure and not self.kind.environment_failure:
            object.__setattr__(self, "kind", FailureKind.INFRASTRUCTURE)
        object.__setattr__(self, "environment_failure", self.kind.environment_failure)
        return self

    @classmethod
    def of_error(cls, stage: str, subject: str, err: ArenaforgeError, **fields: Any) -> "Rejection":
        """The row a typed failure becomes: its kind, the reason code for that kind, its whole message."""
        reason = {FailureKind.INVALID_OUTPUT: RejectReason.INVALID_MODEL_OUTPUT,
                  FailureKind.INFRASTRUCTURE: RejectReason.SANDBOX_FAILURE}.get(err.kind, RejectReason.PROVIDER_ERROR)
        return cls(stage=stage, subject=subject, reason=fields.pop("reason", reason), detail=str(err),
                   kind=err.kind, **fields)


RECORD_TYPES: tuple[type[Record], ...] = (
    Tool,
    Server,
    ToolChain,
    Task,
    Trajectory,
    JudgeScore,
    QAInstance,
    Environment,
    Rollout,
    Run,
    Rejection,
)

__all__ = [
    "ChatMessage",
    "Environment",
    "Evidence",
    "FunctionCall",
    "FunctionDoc",
    "GoldCall",
    "JudgeScore",
    "Provenance",
    "QAInstance",
    "RECORD_TYPES",
    "Record",
    "Rejection",
    "RewardBreakdown",
    "Rollout",
    "Run",
    "Server",
    "SubQA",
    "Task",
    "Tool",
    "ToolCall",
    "ToolChain",
    "ToolObservation",
    "ToolOutcome",
    "Trajectory",
    "Usage",
    "Verification",
]
