"""Typed configuration and its loader.

Precedence, lowest to highest (later wins, field by field):
  1. built-in defaults (the field defaults below)
  2. `arenaforge.toml` in the working directory, or the file named by `--config` / `ARENAFORGE_CONFIG`
  3. environment variables `ARENAFORGE_<SECTION>__<FIELD>` (e.g. `ARENAFORGE_MODEL__BASE_URL`);
     `ARENAFORGE_DB` is a short form of `ARENAFORGE_WAREHOUSE__PATH`, and `OPENAI_API_KEY`
     fills `model.api_key` when nothing else does
  4. command-line flags (passed to `load_config(overrides=...)` as dotted keys)
"""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from arenaforge.schemas.errors import ConfigError

ENV_PREFIX = "ARENAFORGE_"
DEFAULT_CONFIG_FILE = "arenaforge.toml"


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid")


class WarehouseConfig(_Section):
    path: str = Field(default="./arenaforge.lake", description=(
        "Where every artifact lives: a directory (DuckLake, catalog in SQLite: one machine, no server), "
        "`postgres:<conninfo>` or a postgresql:// URL (DuckLake, catalog in PostgreSQL: writers on many machines), "
        "or an existing single DuckDB file (the layout before DuckLake; `arenaforge db migrate --from FILE`)."))
    data_path: str | None = Field(default=None, description=(
        "Parquet data directory of a DuckLake warehouse; default <path>/data. Required with a PostgreSQL "
        "catalog: a directory (or object store) every writer reaches."))
    lock_timeout_s: float = Field(default=120.0, gt=0, description="How long a writer waits for the other writers' lock.")


class ModelConfig(_Section):
    """The model every model-driven step talks to, built once per run (services/models/providers/)."""

    backend: str = Field(default="offline", description="Provider: offline (deterministic generators, no endpoint), "
                                                        "openai (any OpenAI-compatible endpoint), or any provider "
                                                        "module added under services/models/providers/.")
    base_url: str | None = Field(default=None, description="OpenAI-compatible endpoint, e.g. http://127.0.0.1:8000/v1.")
    endpoints: list[str] = Field(default_factory=list, description="Several OpenAI-compatible endpoints serving the "
                                 "same model (replicas): requests go to the least busy healthy one, a failing one "
                                 "is ejected until its health check passes (services/models/endpoint_pool.py). "
                                 "base_url alone is a pool of one.")
    health_interval_s: float = Field(default=2.0, ge=0, description="First health check of an ejected endpoint, this "
                                                                    "long after it failed; doubles up to backoff_max_s.")
    model: str = Field(default="offline", description="Model name sent to the endpoint.")
    api_key: str | None = Field(default=None, description="Key for the endpoint (vLLM accepts any).")
    timeout_s: float = Field(default=60.0, gt=0, description="Seconds one request may take, from when it is sent "
                                                           "(time queued for a concurrency slot is not counted).")
    max_retries: int = Field(default=5, ge=0, description="Retries of a request that can succeed: connection errors, "
                                                        "timeouts, 408, 429, 502-504, truncated bodies.")
    backoff_base_s: float = Field(default=0.5, gt=0, description="First backoff; doubles per retry, with full jitter.")
    backoff_max_s: float = Field(default=20.0, gt=0, description="Longest pause between retries (a server's "
                                                               "Retry-After is capped by it).")
    retry_budget_s: float = Field(default=120.0, gt=0, description="Longest time one request may spend retrying.")
    max_reasks: int = Field(default=2, ge=0, description="Re-asks when the answer breaks the step's JSON Schema.")
    structured_output: Literal["auto", "json_schema", "json_object", "prompt"] = Field(
        default="auto", description="How a JSON answer is asked for: auto negotiates json_schema, then json_object "
                                    "with the schema in the prompt, then the schema in the prompt only.")
    tool_calling: Literal["auto", "native", "prompt"] = Field(
        default="auto", description="How tools are called: auto uses the endpoint's native tool calls and moves to the "
                                    "prompt (tools described in the prompt, each turn a JSON object) when the endpoint "
                                    "refuses them; prompt is for servers that ignore tools (transformers serve).")
    calls_per_turn: int = Field(default=8, ge=1, le=64, description="Prompted tool calling: the most calls one turn "
                                                                   "may make (1 for small models, which repeat a call).")
    concurrency_initial: int = Field(default=16, ge=1, description="Requests in flight at the start (AIMD slow start).")
    concurrency_max: int = Field(default=128, ge=1, description="Most requests in flight to the endpoint.")
    temperature: float = Field(default=0.7, ge=0, description="Sampling temperature where a step does not set one.")
    max_tokens: int = Field(default=2048, ge=1, description="Cap on the tokens of one answer (steps ask for less).")
    seed: int = Field(default=0, description="Seed sent with every request where a step does not set one.")
    cache: bool = Field(default=True, description="Cache every response in the warehouse: a re-run makes no calls.")

    def endpoint_urls(self) -> list[str]:
        """The endpoints requests go to: `endpoints`, else `base_url` (a pool of one), else none."""
        urls = self.endpoints or ([self.base_url] if self.base_url else [])
        if len(set(urls)) != len(urls):
            raise ConfigError(f"model.endpoints lists an endpoint twice: {urls}")
        return urls


class SandboxConfig(_Section):
    """The sandbox runtime (docs/SANDBOX.md): workers, per-session limits, and what crosses the boundary."""

    backend: str = Field(default="auto", description="auto (docker if an engine answers, else process), or a "
                         "registered backend: docker, process (checked when the pool starts).")
    image: str = Field(default="arenaforge-sandbox", description="Base image name (tag is the recipe hash).")
    engines: list[str] = Field(
        default_factory=list,
        description="Docker engines to spread worker containers over (unix:///... or tcp://...); "
        "empty: the one engine DOCKER_HOST or the default socket names.",
    )
    pool_size: int = Field(default=4, ge=1, description="Warm worker containers.")
    max_concurrency: int = Field(default=256, ge=1, description="Opens and calls in flight at once, across sessions.")
    call_timeout_s: float = Field(
        default=5.0, gt=0, description="A call's own time limit (time spent waiting for a CPU is not counted)."
    )
    state_timeout_s: float = Field(
        default=60.0, gt=0, description="Limit for reading a session's state back (`pool.state`): harness work, not "
                                        "the tool's time; a multi-megabyte state on a busy worker takes seconds.")
    session_timeout_s: float = Field(default=600.0, gt=0, description="Wall-clock limit of one session (an episode).")
    memory_mb: int = Field(default=512, ge=32, description="Address space of one session process, and (with "
                                                          "session_cgroups) all memory its session holds.")
    pids: int = Field(default=64, ge=8, description="Processes one session may run.")
    session_cgroups: bool = Field(
        default=True,
        description="A cgroup per session where the worker is root on cgroup v1: memory_mb then also caps memory a "
                    "session holds outside its address space (memfd, pipes, tmpfs, kernel memory), pids its processes, "
                    "and each session weighs as one process for the CPU however many it starts (process backend: "
                    "inside a CPU group the flow's process moves into, where it is root).",
    )
    process_cpu_groups: bool = Field(
        default=True,
        description="Process backend, with session_cgroups, as root: a CPU group per session, inside a group the "
                    "flow's process moves into while it has a pool, so each session weighs as one however many "
                    "processes it runs, and a call running long weighs less than its neighbours' (docs/SANDBOX.md). "
                    "Off: sessions weigh as processes in the flow's autogroup, and a session's busy processes outweigh "
                    "its neighbour (p99 over 100x quiet). Docker always has them.",
    )
    docker_socket_channel: bool = Field(
        default=True,
        description="Docker, on an engine of this Linux host: the pool talks to each worker over a Unix socket in a "
                    "directory bind-mounted into its container, not through the engine's attach stream, so no call "
                    "passes through dockerd and the container's shim (docs/SANDBOX.md). Only a connection with the "
                    "worker's token is served; a worker that cannot reach the socket falls back to the attach stream, "
                    "as remote engines always do.")
    cpus: float = Field(
        default=2.0, gt=0,
        description="Docker: CPUs of one worker container (at most the engine's: a smaller host gives all it has). "
                    "Its sessions share this quota, each held to session_cpu_share of it, so it leaves room for "
                    "neighbours beside busy sessions: with 1 CPU, one busy session plus its neighbour's own calls "
                    "ran the container out of quota each period, and the neighbour's p99 went 2-4x quiet "
                    "(docs/SANDBOX.md, \"Container room by default\").")
    busy_session_cores: int = Field(
        default=1, ge=0,
        description="With session_cgroups: a session whose call has run 5 ms runs on this many cores (a cpuset) "
                    "until it answers, the ones this worker's other busy sessions use least, so its processes never "
                    "hold every core at once and its neighbours' calls, and the worker and flow relaying them, find "
                    "one to wake on (docs/SANDBOX.md). Docker caps a session at half a core by default, so this "
                    "costs it nothing; on the process backend a call's processes no longer spread over the host. "
                    "0: all cores.")
    session_cpu_share: float = Field(
        default=0.25, gt=0, le=1,
        description="Docker, with session_cgroups: the share of its worker container's CPUs one session may use "
                    "(a quarter of 2 CPUs: half a core). Below 1, no session's busy processes can use the "
                    "container's whole quota alone (which stops the container, its neighbours and the worker with "
                    "it, until the next period); several busy sessions with their neighbours' own load still can "
                    "(`bench isolation` reports it as worker_group_throttled). A CPU-bound tool alone runs at that "
                    "share. 1: no cap.")
    nice: int = Field(
        default=19, ge=0, le=19,
        description="The weight, as a nice value, of the sandbox beside the flow's process: where both want a core "
                    "the flow's process (it keeps the model endpoints busy, and relays every call) gets it first. "
                    "Process backend: workers and their sessions run at it in the flow's autogroup (or, with "
                    "session_cgroups, its CPU group). Docker: each worker container sits in the flow's CPU group "
                    "weighing as one process at it, where the pool can make that group (root, a local engine with the "
                    "cgroupfs driver on cgroup v1); elsewhere containers stay in the engine's group, the flow's "
                    "equal. 0: equal footing.",
    )
    output_limit_bytes: int = Field(
        default=65536, ge=256, description="Output kept per call (what the agent sees); the rest is cut with a marker."
    )
    state_limit_bytes: int = Field(
        default=16 << 20, ge=1024, le=16 << 20,
        description="Largest state a session's read-back (`pool.state`) returns, as JSON: harness work, so not the "
                    "agent's output limit; a larger one is refused, never cut.")
    message_limit_bytes: int = Field(
        default=4 << 20, ge=1024, description="Largest arguments of one call (serialized JSON); larger is an error."
    )
    session_cpu_s: int = Field(default=60, ge=1, description="CPU seconds one session's process may use in total.")
    open_timeout_s: float = Field(
        default=10.0, gt=0, description="Limit for loading an environment's code, from when its worker starts it."
    )
    scratch_mb: int = Field(default=64, ge=1, description="Size of each session's private /tmp (and /dev/shm).")
    scratch_files: int = Field(
        default=8192, ge=16, description="Files and directories each of a session's private /tmp, /dev/shm and "
                                         "/var/tmp may hold: empty files cost no size but kernel memory.")
    spare_sessions: int = Field(
        default=3, ge=0, le=16, description="Sessions kept forked, confined and loaded ahead per environment version "
                                            "opened more than once (per worker): opens back to back take one each.")
    template_cache_mb: int = Field(
        default=1024, ge=16, description="Memory per worker for parsed environment states kept for new sessions."
    )
    worker_stall_s: float = Field(
        default=60.0, gt=0, description="A worker that answers no ping for this long after a late reply is replaced."
    )
    process_allows_model_code: bool = Field(
        default=False,
        description="Let the process backend run model-written tool code (it cannot isolate it as Docker does).",
    )
    container_memory_mb: int = Field(default=4096, ge=64, description="Memory cap of one worker container (all its sessions).")
    container_pids: int = Field(default=4096, ge=16, description="Process cap of one worker container (all its sessions).")


class PrefectConfig(_Section):
    api_url: str | None = Field(default=None, description="Connect to this Prefect API instead of starting one.")
    database_url: str | None = Field(default=None, description="Postgres URL for the server (SQLite when unset).")
    port: int = Field(default=4200, ge=1, le=65535, description="Port of the Prefect server `arenaforge serve` starts.")
    work_pool: str = Field(default="arenaforge", description="Process work pool name.")
    home: str = Field(default="./.arenaforge/prefect", description="PREFECT_HOME of the server `arenaforge serve` starts.")
    worker_limit: int = Field(default=4, ge=1, description="Flow runs the worker executes at once.")
    model_endpoint_limit: int = Field(default=16, ge=1, description="Slots of the `model-endpoint` concurrency limit.")
    sandbox_limit: int = Field(default=8, ge=1, description="Slots of the `sandbox` concurrency limit.")
    schedules: dict[str, dict[str, Any]] = Field(
        default_factory=dict,
        description="deployment name -> {cron = '...'} or {interval_s = N}, optional timezone, active, parameters.",
    )


class SftConfig(_Section):
    """SFT track (ingest, graph, tasks, trajectories, judge); thresholds are explicit here."""

    min_tools_per_server: int = Field(default=1, ge=1, description="Servers with fewer usable tools are rejected.")
    max_tools_per_server: int = Field(default=128, ge=1, description="Tools beyond this (by name) are rejected.")
    min_description_chars: int = Field(default=8, ge=0, description="Shorter tool descriptions are rejected.")
    mcp_timeout_s: float = Field(default=30.0, gt=0, description="Start/list deadline for a live MCP server.")
    mcp_call_timeout_s: float = Field(default=10.0, gt=0, description="Deadline of one live MCP tool call.")
    use_embeddings: bool = Field(default=True, description="Graph: also match outputs to parameters by MiniLM similarity.")
    embedding_threshold: float = Field(default=0.65, ge=0, le=1, description="Cosine similarity that counts as a match.")
    chain_min_len: int = Field(default=1, ge=1, description="Walks have at least this many tools.")
    chain_max_len: int = Field(default=4, ge=1, description="Walks stop at this many tools (paper: 2-5).")
    chains_per_server: int = Field(default=4, ge=1, description="Walks sampled per server and run.")
    verify_votes: int = Field(default=3, ge=1, description="openai: judges voting on each chain (majority wins).")
    verify_chains: Literal["model", "rules"] = Field(
        default="model", description="model: judges vote, then the chain must survive back-translation (chain -> "
                                     "query -> chain); rules: every required parameter must be satisfiable from the "
                                     "task or an earlier call (the program's check; for small models, which never "
                                     "round-trip a chain).")
    query_values: Literal["model", "program"] = Field(
        default="model", description="model: the model picks the values a task states; program: the program draws "
                                     "them from the tools' parameter schemas and the model writes one sentence per "
                                     "tool whose schema makes it name that tool's values (for small models, which "
                                     "otherwise write no values); no augmentations are written in this mode.")
    grounded_arguments: bool = Field(
        default=False, description="The agent's identifier and number arguments are offered as enums of the values "
                                   "the conversation holds, and a trajectory that calls with one no message gave is "
                                   "not kept (for small models, which make identifiers up).")
    agent_first_turn: Literal["auto", "required"] = Field(
        default="auto", description="tool_choice of the agent's first turn. required: the first turn calls a tool "
                                    "(every task needs one; a small model otherwise answers at once).")
    augmentations: list[str] = Field(
        default_factory=lambda: ["diversity", "complexity", "persona"], description="Augmented variants per task."
    )
    server_only_per_server: int = Field(default=1, ge=0, description="Server-only tasks per server and run.")
    min_clarity: float = Field(default=0.6, ge=0, le=1, description="Clarity score a task needs to be kept.")
    min_realism: float = Field(default=0.5, ge=0, le=1, description="Realism score a task needs to be kept.")
    min_tool_necessity: float = Field(default=0.5, ge=0, le=1, description="Tool-necessity score a task needs to be kept.")
    fault_rate: float = Field(default=0.2, ge=0, le=1, description="Simulator fault-injection rate (paper: 20%).")
    max_turns: int = Field(default=12, ge=1, description="Agent turns per trajectory.")
    max_retries_per_call: int = Field(default=2, ge=0, description="Offline agent: retries after a failed call.")
    keep_threshold: float = Field(default=0.7, ge=0, le=1, description="Mean judge score a trajectory needs for SFT.")
    judge: Literal["model", "rules"] = Field(
        default="model", description="Who scores tasks and judges trajectories. model: the run's model; rules: the "
                                     "program's rules (the offline provider's scorer and judge, which read the task "
                                     "and the conversation), for models too small to score (SmolLM2-135M's scores "
                                     "are noise: 2023, -1, or the prompt's example copied).")


class TrainConfig(_Section):
    """RL/SFT training; per-run knobs are flow parameters, these are deployment-wide."""

    ray_address: str | None = Field(
        default=None, description="Ray cluster (e.g. http://head:8265): train-grpo submits a verl job there."
    )


class RunnerConfig(_Section):
    """Where a flow's batch tasks run (docs/SCALE.md)."""

    kind: Literal["thread", "ray"] = Field(
        default="thread", description="thread: in the flow's process; ray: each batch of environments is a Prefect "
                                      "task run on a Ray cluster through prefect-ray (the `ray` extra).")
    address: str | None = Field(default=None, description="Ray cluster address (e.g. 127.0.0.1:6379 or "
                                                          "ray://host:10001); none: a local Ray started for the run.")


class Config(_Section):
    warehouse: WarehouseConfig = WarehouseConfig()
    runner: RunnerConfig = RunnerConfig()
    model: ModelConfig = ModelConfig()
    sandbox: SandboxConfig = SandboxConfig()
    prefect: PrefectConfig = PrefectConfig()
    sft: SftConfig = SftConfig()
    train: TrainConfig = TrainConfig()
    out_dir: str = Field(default="./out", description="Where exports and plots are written.")
    project_dir: str | None = Field(
        default=None,
        description="Where served flow runs resolve relative paths (default: the directory `arenaforge serve` "
        "was started in).",
    )
    seed: int = Field(default=0, description="Seed for every deterministic generator.")


def _set_dotted(tree: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"config key {dotted!r}: {part!r} is not a section")
    node[parts[-1]] = value


def _parse_env_value(raw: str) -> Any:
    # JSON where it parses (numbers, booleans, lists), the plain string otherwise.
    try:
        return json.loads(raw)
    except json.JSONDecodeError:
        return raw


def _env_overrides(environ: dict[str, str]) -> dict[str, Any]:
    tree: dict[str, Any] = {}
    if environ.get("ARENAFORGE_DB"):
        _set_dotted(tree, "warehouse.path", environ["ARENAFORGE_DB"])
    for key, raw in environ.items():
        if not key.startswith(ENV_PREFIX) or "__" not in key:
            continue
        dotted = key[len(ENV_PREFIX) :].lower().replace("__", ".")
        _set_dotted(tree, dotted, _parse_env_value(raw))
    return tree


def _merge(base: dict[str, Any], top: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        return tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as err:
        raise ConfigError(f"{path}: malformed TOML: {err}") from None
    except OSError as err:
        raise ConfigError(f"{path}: cannot read config: {err.strerror}") from None


def load_config(
    path: str | Path | None = None,
    overrides: dict[str, Any] | None = None,
    environ: dict[str, str] | None = None,
) -> Config:
    """Defaults < TOML file < environment < overrides (dotted keys)."""
    environ = dict(os.environ if environ is None else environ)
    explicit = path or environ.get("ARENAFORGE_CONFIG")
    file = Path(explicit) if explicit else Path(DEFAULT_CONFIG_FILE)
    if explicit and not file.exists():
        raise ConfigError(f"config file {file} does not exist")
    tree = _read_toml(file) if file.exists() else {}
    tree = _merge(tree, _env_overrides(environ))
    for dotted, value in (overrides or {}).items():
        if value is not None:
            _set_dotted(tree, dotted, value)
    if not tree.get("model", {}).get("api_key") and environ.get("OPENAI_API_KEY"):
        _set_dotted(tree, "model.api_key", environ["OPENAI_API_KEY"])
    try:
        return Config.model_validate(tree)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise ConfigError(f"config {where}: {first['msg']} (source: {file if file.exists() else 'environment/flags'})") from None
