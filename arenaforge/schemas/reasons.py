"""Every reason code a `Rejection` row can carry, by the stage that writes it (free-text detail goes beside it)."""

from __future__ import annotations

from enum import StrEnum


class RejectReason(StrEnum):
    # any stage: a failure of what the record depended on (its `kind` says which)
    PROVIDER_ERROR = "provider_error"  # the model endpoint failed the request
    INVALID_MODEL_OUTPUT = "invalid_model_output"  # the answer never fit the step's schema
    SANDBOX_FAILURE = "sandbox_failure"  # the sandbox runtime failed, not the tool
    ENVIRONMENT_FAILURE = "environment_failure"  # a tool's infrastructure failed during an episode

    # ingest: tool documents and live MCP servers
    MISSING_PATH = "missing_path"
    UNREADABLE_FILE = "unreadable_file"
    MALFORMED_JSON = "malformed_json"
    UNRECOGNISED_FORMAT = "unrecognised_format"
    NO_TOOL_DOCUMENTS = "no_tool_documents"
    INVALID_NAME = "invalid_name"
    INVALID_SCHEMA = "invalid_schema"
    POOR_DESCRIPTION = "poor_description"
    DUPLICATE_NAME = "duplicate_name"
    TOO_FEW_TOOLS = "too_few_tools"
    TOO_MANY_TOOLS = "too_many_tools"
    MCP_UNAVAILABLE = "mcp_unavailable"

    # knowledge sources: what profiling cannot use
    UNREADABLE_TABLE = "unreadable_table"
    NO_JOINABLE_COLUMNS = "no_joinable_columns"
    NULL_HEAVY_COLUMN = "null_heavy_column"
    NON_ASCII_COLUMN = "non_ascii_column"
    LONG_TEXT_COLUMN = "long_text_column"
    NO_KEY_COLUMN = "no_key_column"

    # SFT track: graph, chains, tasks, trajectories
    UNKNOWN_TOOL_IN_CHAIN = "unknown_tool_in_chain"
    CHAIN_UNVERIFIED = "chain_unverified"
    NO_TOOL_CALLS = "no_tool_calls"
    NO_FINAL_ANSWER = "no_final_answer"
    SANDBOX_UNAVAILABLE = "sandbox_unavailable"
    SIMULATOR_FAILED = "simulator_failed"
    SCHEMA_VIOLATION = "schema_violation"

    # RL track: QA decomposition and grounding
    HOP_BUDGET = "hop_budget"
    NO_JOIN_PATH = "no_join_path"
    STRUCTURE_UNSUPPORTED = "structure_unsupported"  # stepwise plans single_hop, parallel_single_hop, multi_hop
    QUESTION_MISSING_VALUE = "question_missing_value"  # a written question does not name the value it is about
    NO_EVIDENCE = "no_evidence"
    EVIDENCE_ERROR = "evidence_error"
    EVIDENCE_MISMATCH = "evidence_mismatch"
    UNGROUNDED_MAIN_ANSWER = "ungrounded_main_answer"
    BAD_DEPENDENCIES = "bad_dependencies"
    CYCLIC_DEPENDENCIES = "cyclic_dependencies"
    SOURCE_UNAVAILABLE = "source_unavailable"
    UNKNOWN_TABLE = "unknown_table"

    # RL track: QA verification (one code per failed structural check, then the quality score)
    STRUCTURE_ACYCLIC = "structure:acyclic"
    STRUCTURE_HOPS_WITHIN_BUDGET = "structure:hops_within_budget"
    STRUCTURE_INTERMEDIATE_NEEDS_TOOL = "structure:intermediate_needs_tool"
    STRUCTURE_ANSWERS_HIDDEN = "structure:answers_hidden"
    STRUCTURE_NEEDS_SOME_TOOL = "structure:needs_some_tool"
    STRUCTURE_GROUNDED = "structure:grounded"
    LOW_QUALITY_SCORE = "low_quality_score"
    CHECK_DEPENDENCY_CONSISTENCY = "check:dependency_consistency"
    CHECK_SUB_QUESTION_ATOMICITY = "check:sub_question_atomicity"
    CHECK_SEQUENTIAL_RATIONALITY = "check:sequential_rationality"
    CHECK_TASK_COMPLETENESS = "check:task_completeness"

    # RL track: tools, sandbox verification, self-test
    INVALID_TOOL_DOC = "invalid_tool_doc"
    NON_STDLIB_CODE = "non_stdlib_code"
    INVALID_CALL = "invalid_call"
    TOOL_NAME_CLASH = "tool_name_clash"
    UNMERGEABLE_DATA = "unmergeable_data"
    IMPORT_ERROR = "import_error"
    MISSING_REQUIREMENT = "missing_requirement"
    WRONG_ANSWER = "wrong_answer"
    ANSWER_LEAK = "answer_leak"
    TIMEOUT = "timeout"
    SANDBOX_VERIFICATION_FAILED = "sandbox_verification_failed"
    SELF_TEST_FAILED = "self_test_failed"

    # training and evaluation: environments that cannot be used, episodes whose environment failed
    ENV_FAILURE = "env_failure"
    NO_GOLD_CALLS = "no_gold_calls"
    GOLD_CALL_FAILED = "gold_call_failed"
    REPLAY_FAILED = "replay_failed"

    # imports of others' suites (Harbor task directories)
    NOT_A_TASK = "not_a_task"  # a required file is missing or malformed
    BASE_IMAGE_MISSING = "base_image_missing"  # a FROM image is not present locally (no registry is reachable)
    IMAGE_BUILD_FAILED = "image_build_failed"
    SOLUTION_FAILED = "solution_failed"  # the task's own solution does not pass its own tests
