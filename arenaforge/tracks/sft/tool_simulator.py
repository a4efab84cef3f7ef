"""Tool executors for trajectories: live MCP server, sandbox code, or a state simulator (ASTRA §1a.4).

`open_executor(...)` picks one per episode: the real MCP server when the server is live
(`Server.launch`), the sandbox runtime when every tool has code and `arenaforge.environments.runtime`
offers `create_pool`, else a simulator. Simulators stay consistent within a session: the same
call returns the same answer, values seen earlier (arguments and outputs) are reused for fields
of the same name, and every answer conforms to the tool's output schema (checked; a violation
is an error observation plus a `Rejection`). Faults are injected at `fault_rate` per call
(transient: a retry draws again), and the count is returned so the achieved rate is measured.

The run's model plays the tool (prompt `sft_simulate_tool`, given its docs, output schema and the
session's history); the offline provider generates values from the output schema (enum, format,
bounds, field-name hints), seeded per session, reusing values seen earlier in the session
(`tracks/sft/offline_simulator.py`).
"""

from __future__ import annotations

import contextlib
import json
import random
import re
import string
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Protocol

import jsonschema
from jsonschema import Draft202012Validator

from arenaforge.schemas.config import Config
from arenaforge.schemas.errors import ParseError, ProviderError, SandboxError
from arenaforge.schemas.models import Rejection, Server, Tool, ToolObservation
from arenaforge.services.models import ChatModel, Step, complete_json
from arenaforge.tracks.sft.mcp_client import McpServerError, McpSession
from arenaforge.tracks.sft.prompts import load_prompt


def _offline_rules() -> ModuleType:
    from arenaforge.tracks.sft import offline_simulator  # its rules read this module's types: loaded after it

    return offline_simulator


# Value vocabularies for field-name hints (generation is programmatic; these only make values plausible).
_CITIES = ["Oslo", "Lisbon", "Nairobi", "Osaka", "Denver", "Lima", "Hanoi", "Tallinn", "Perth", "Montreal"]
_COUNTRIES = ["Norway", "Portugal", "Kenya", "Japan", "United States", "Peru", "Vietnam", "Estonia", "Australia"]
_FIRST = ["Ada", "Bilal", "Chen", "Dara", "Elif", "Femi", "Greta", "Hugo", "Ines", "Jonas"]
_LAST = ["Nakamura", "Okafor", "Silva", "Berg", "Kowalski", "Haddad", "Moreau", "Larsen", "Ortiz"]
_TIMEZONES = ["Europe/Oslo", "America/New_York", "Asia/Tokyo", "Africa/Nairobi", "Australia/Perth"]
_WORDS = re.compile(r"[a-z]{4,}")


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def _words(text: str) -> list[str]:
    return [w for w in _WORDS.findall(text.lower()) if w not in {"with", "that", "this", "from", "their", "given"}]


def sample_value(schema: Any, name: str, rng: random.Random, hint: str = "", depth: int = 0) -> Any:
    """A value that satisfies `schema`, made plausible by the field name (seeded, no canned answers)."""
    if not isinstance(schema, dict) or depth > 5:
        return _string_for(name, rng, hint)
    if "const" in schema:
        return schema["const"]
    if isinstance(schema.get("enum"), list) and schema["enum"]:
        return rng.choice(schema["enum"])
    if "default" in schema and rng.random() < 0.3:
        return schema["default"]
    for key in ("anyOf", "oneOf"):
        if isinstance(schema.get(key), list) and schema[key]:
            return sample_value(schema[key][0], name, rng, hint, depth + 1)
    t = schema.get("type")
    if isinstance(t, list):
        t = next((x for x in t if x != "null"), "string")
    if t is None:
        t = "object" if "properties" in schema else "string"
    if t == "integer":
        lo = int(schema.get("minimum", schema.get("exclusiveMinimum", 0) + 1 if "exclusiveMinimum" in schema else 1))
        hi = int(schema.get("maximum", max(lo + 1, lo + 99 if not _norm(name).endswith("year") else lo)))
        if _norm(name).endswith("year") and "minimum" not in schema:
            return rng.randint(2000, 2026)
        return rng.randint(lo, max(lo, hi))
    if t == "number":
        n = _norm(name)
        if "lat" in n:
            lo, hi = -60.0, 70.0
        elif "lon" in n or "lng" in n:
            lo, hi = -170.0, 170.0
        else:
            lo, hi = 1.0, 500.0
        lo = float(schema.get("minimum", lo))
        hi = float(schema.get("maximum", max(hi, lo)))
        return round(rng.uniform(lo, hi), 2)
    if t == "boolean":
        return rng.random() < 0.5
    if t == "null":
        return None
    if t == "array":
        items = schema.get("items") if isinstance(schema.get("items"), dict) else {}
        lo = int(schema.get("minItems", 1))
        hi = int(schema.get("maxItems", max(lo, 3)))
        singular = name[:-1] if name.endswith("s") else name
        return [sample_value(items, singular, rng, hint, depth + 1) for _ in range(rng.randint(lo, max(lo, min(hi, 3))))]
    if t == "object":
        props = schema.get("properties") or {}
        required = set(schema.get("required") or [])
        out = {}
        for key, sub in props.items():
            if key in required or rng.random() < 0.6:
                out[key] = sample_value(sub, key, rng, hint, depth + 1)
        return out
    return _string_for(name, rng, hint, schema.get("format"), schema)


def _string_for(name: str, rng: random.Random, hint: str = "", fmt: str | None = None,
                schema: dict[str, Any] | None = None) -> str:
    n = _norm(name)
    fmt = fmt or ""
    described = str((schema or {}).get("description", ""))
    if "HH:MM" in described or fmt == "time":
        return f"{rng.randint(6, 22):02d}:{rng.choice(['00', '15', '30', '45'])}"
    if fmt == "date" or n.endswith("date") or n in ("day", "checkin", "checkout"):
        return f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}"
    if fmt == "date-time" or n.endswith("time") and "zone" not in n or n.endswith("at"):
        return f"2026-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}T{rng.randint(7, 19):02d}:{rng.choice(['00', '30'])}:00Z"
    if fmt == "email" or "email" in n:
        return f"{rng.choice(_FIRST).lower()}.{rng.choice(_LAST).lower()}@example.org"
    if "timezone" in n or n.endswith("tz"):
        return rng.choice(_TIMEZONES)
    if "city" in n or n in ("location", "place", "destination", "origin"):
        return rng.choice(_CITIES)
    if "country" in n:
        return rng.choice(_COUNTRIES)
    if n.endswith("name") and any(w in n or w in hint.lower() for w in ("user", "person", "customer", "employee",
                                                                          "attendee", "contact", "patient")):
        return f"{rng.choice(_FIRST)} {rng.choice(_LAST)}" if n in ("name", "fullname", "username") else rng.choice(_FIRST)
    if n.endswith("name") and n not in ("name", "title"):
        pass  # e.g. file_name, city_name: fall through to the hints below
    if fmt == "uri" or "url" in n:
        return f"https://example.org/{n}/{rng.randint(100, 999)}"
    if n.endswith("id") or n.endswith("ids") or "uuid" in n or n.endswith("key") or n.endswith("token"):
        prefix = re.sub(r"_?(id|ids|uuid|key|token)$", "", name.lower()) or "item"
        return f"{_norm(prefix)[:8] or 'id'}_{''.join(rng.choices(string.ascii_lowercase + string.digits, k=6))}"
    if n in ("path", "repopath", "file", "filename"):
        return f"/srv/data/{rng.choice(_words(hint) or ['notes'])}.txt"
    words = _words(hint) or _words(name.replace("_", " ")) or ["value"]
    picked = rng.sample(words, k=min(len(words), rng.randint(1, 3)))
    text = " ".join(picked)
    if schema:
        lo, hi = int(schema.get("minLength", 0)), int(schema.get("maxLength", 10_000))
        text = (text + " " * lo)[: max(hi, lo)] if len(text) < lo else text[:hi]
    return text


# --------------------------------------------------------------------------- schema checks
_VALIDATORS: dict[str, Draft202012Validator] = {}


def output_problem(tool: Tool, value: Any) -> str | None:
    """Why `value` breaks the tool's output schema (None when it conforms or there is none)."""
    if tool.returns is None:
        return None
    v = _VALIDATORS.get(tool.id)
    if v is None:
        v = _VALIDATORS[tool.id] = Draft202012Validator(tool.returns)
    err = jsonschema.exceptions.best_match(v.iter_errors(value))
    if err is None:
        return None
    where = "/".join(str(p) for p in err.absolute_path) or "(root)"
    return f"{where}: {err.message}"[:300]


# --------------------------------------------------------------------------- executors
@dataclass
class CallResult:
    observation: ToolObservation
    fault: bool = False  # injected by the simulator
    environment_failure: bool = False


@dataclass
class SessionLog:
    """What an executor saw in one episode, for the trajectory and the rejections table."""

    faults: int = 0
    calls: int = 0
    rejections: list[Rejection] = field(default_factory=list)


class ToolExecutor(Protocol):
    kind: str
    fault_rate: float  # faults it injects per call (a simulator's; real tools inject none)
    log: SessionLog

    async def call(self, name: str, arguments: dict[str, Any]) -> CallResult: ...


_FAULTS = (
    ("error", "503 Service Unavailable: the upstream service is temporarily unavailable, try again"),
    ("timeout", "the service did not answer within 5 s"),
    ("error", "429 Too Many Requests: rate limit exceeded, retry after a short wait"),
    ("error", "500 Internal Server Error: transient backend failure"),
)


@dataclass(frozen=True)
class SimulateInputs:
    """One simulated call: the tool, its arguments, the output schema, and the session's memory and random stream."""

    tool: Tool
    arguments: dict[str, Any]
    schema: dict[str, Any]
    memory: dict[str, Any]  # normalised field name -> last value seen in the session (arguments and outputs)
    rng: random.Random


# the answer's schema is the simulated tool's output schema, given per call
SIMULATE_TOOL = Step("sft.simulate_tool", prompt="sft_simulate_tool", schema=None, max_tokens=500,
                     offline=lambda: _offline_rules().simulate_tool)


class Simulator:
    """A state simulator for one episode: the run's model answers as the tool; faults are injected here."""

    kind = "simulator"

    def __init__(self, tools: Sequence[Tool], fault_rate: float, rng: random.Random, subject: str,
                 model: ChatModel) -> None:
        self.model = model
        self.prompt = load_prompt(SIMULATE_TOOL.prompt)
        self.tools = {t.function.name: t for t in tools}
        self.fault_rate = fault_rate
        self.rng = rng
        self.subject = subject
        self.memory: dict[str, Any] = {}  # normalised field name -> last value seen (args and outputs)
        self.answers: dict[str, Any] = {}  # (tool, canonical args) -> answer: same call, same answer
        self.history: list[tuple[str, dict[str, Any], Any]] = []
        self.log = SessionLog()

    async def call(self, name: str, arguments: dict[str, Any]) -> CallResult:
        self.log.calls += 1
        tool = self.tools.get(name)
        if tool is None:
            return CallResult(ToolObservation(outcome="error", error=f"unknown tool {name!r}"))
        if self.fault_rate and self.rng.random() < self.fault_rate:
            self.log.faults += 1
            outcome, message = self.rng.choice(_FAULTS)
            return CallResult(ToolObservation(outcome=outcome, error=message), fault=True)  # type: ignore[arg-type]
        missing = [p for p in tool.function.parameters.get("required", []) if p not in arguments]
        if missing:
            return CallResult(ToolObservation(outcome="error", error=f"missing required argument(s): {', '.join(missing)}"))
        key = name + json.dumps(arguments, sort_keys=True, default=str)
        if key not in self.answers:
            for arg, value in arguments.items():
                if isinstance(value, (str, int, float)):
                    self.memory[_norm(arg)] = value
            try:
                answer = await self.answer(tool, arguments)
            except (ParseError, ProviderError) as err:
                self.log.rejections.append(Rejection(stage="simulate", subject=f"{self.subject}/{name}",
                                                     reason="simulator_failed", detail=str(err)[:1000]))
                return CallResult(ToolObservation(outcome="error", error="the tool returned malformed data"))
            problem = output_problem(tool, answer)
            if problem is not None:
                self.log.rejections.append(Rejection(
                    stage="simulate", subject=f"{self.subject}/{name}", reason="schema_violation",
                    detail=f"simulator answer breaks the output schema at {problem}", payload=answer))
                return CallResult(ToolObservation(outcome="error", error="the tool returned malformed data"))
            self.answers[key] = answer
            self._remember(answer)
            self.history.append((name, arguments, answer))
        return CallResult(ToolObservation(outcome="ok", output=json.dumps(self.answers[key], ensure_ascii=False)))

    def _remember(self, value: Any, depth: int = 0) -> None:
        if isinstance(value, dict) and depth < 3:
            for k, v in value.items():
                if isinstance(v, (str, int, float)) and not isinstance(v, bool):
                    self.memory.setdefault(_norm(k), v)
                else:
                    self._remember(v, depth + 1)
        elif isinstance(value, list) and value and depth < 3:
            self._remember(value[0], depth + 1)

    async def answer(self, tool: Tool, arguments: dict[str, Any]) -> Any:
        schema = tool.returns or default_returns(tool)
        recent = self.history[-6:]

        def text() -> str:
            history = "\n".join(f"{n}({json.dumps(a)}) -> {json.dumps(r)[:400]}" for n, a, r in recent) or "(none)"
            return self.prompt.render(name=tool.function.name, description=tool.function.description,
                                      schema=json.dumps(schema), arguments=json.dumps(arguments), history=history)

        # A ParseError here (never a valid answer after the re-asks) becomes an error observation in `call`.
        return await complete_json(self.model, SIMULATE_TOOL, text, schema,
                                   inputs=SimulateInputs(tool, arguments, schema, self.memory, self.rng))

_PY_TYPES: dict[str, tuple[type, ...]] = {"string": (str,), "integer": (int,), "number": (int, float),
                                          "boolean": (bool,), "null": (type(None),)}


def output_problem_for(schema: Any, value: Any) -> str | None:
    """Whether a remembered scalar may fill a field: its type and enum (the whole answer is validated later)."""
    if not isinstance(schema, dict) or not schema:
        return None
    if isinstance(schema.get("enum"), list) and value not in schema["enum"]:
        return "not in enum"
    t = schema.get("type")
    allowed = _PY_TYPES.get(t) if isinstance(t, str) else None
    if allowed is not None and (not isinstance(value, allowed) or (isinstance(value, bool) and t != "boolean")):
        return f"not a {t}"
    if isinstance(value, str) and (len(value) < schema.get("minLength", 0) or len(value) > schema.get("maxLength", 1 << 30)):
        return "length out of bounds"
    if isinstance(value, (int, float)) and not isinstance(value, bool) and not (
            schema.get("minimum", float("-inf")) <= value <= schema.get("maximum", float("inf"))):
        return "out of bounds"
    return None


def default_returns(tool: Tool) -> dict[str, Any]:
    """Output schema for a tool documented without one: a status plus a result object named after it."""
    base = re.sub(r"^(get|list|search|find|create|update|delete|fetch|check|lookup)_", "", tool.function.name.lower())
    return {"type": "object", "properties": {"status": {"enum": ["success"]},
                                             f"{_norm(base)[:24] or 'result'}_id": {"type": "string"},
                                             "summary": {"type": "string"}},
            "required": ["status", "summary"]}


class McpExecutor:
    """The real MCP server (one process per episode)."""

    kind = "mcp"
    fault_rate = 0.0

    def __init__(self, session: McpSession) -> None:
        self.session = session
        self.log = SessionLog()

    async def call(self, name: str, arguments: dict[str, Any]) -> CallResult:
        self.log.calls += 1
        observation, env_failure = await self.session.call(name, arguments)
        return CallResult(observation, environment_failure=env_failure)


class SandboxExecutor:
    """Tool code run in the sandbox runtime (arenaforge.environments.runtime)."""

    kind = "sandbox"
    fault_rate = 0.0

    def __init__(self, pool: Any, session: Any) -> None:
        self.pool = pool
        self.session = session
        self.log = SessionLog()

    async def call(self, name: str, arguments: dict[str, Any]) -> CallResult:
        from arenaforge.environments.runtime import EnvironmentFailure

        self.log.calls += 1
        try:
            obs = await self.pool.call(self.session, name, arguments)
        except EnvironmentFailure as err:  # the sandbox failed, not the tool: an environment failure, as for MCP
            return CallResult(ToolObservation(outcome="error", error=str(err)), environment_failure=True)
        return CallResult(obs if isinstance(obs, ToolObservation) else ToolObservation.model_validate(obs))


SimulatorFactory = Callable[[Sequence[Tool], random.Random, str], "Simulator"]


def simulator_factory(cfg: Config, model: ChatModel) -> SimulatorFactory:
    """Simulators of one run: its model plays the tools, faults at `sft.fault_rate`."""
    return lambda tools, rng, subject: Simulator(tools, cfg.sft.fault_rate, rng, subject, model)


@contextlib.asynccontextmanager
async def open_executor(server: Server, tools: Sequence[Tool], make_simulator: SimulatorFactory, rng: random.Random,
                        subject: str, cfg: Config, sandbox_pool: Any = None) -> AsyncIterator[ToolExecutor]:
    """The executor for one episode: live MCP > sandbox code > simulator. A live server that will not
    start falls back to the simulator and leaves an environment-failure rejection in the log."""
    if server.launch:
        try:
            async with McpSession(server.launch, start_timeout_s=cfg.sft.mcp_timeout_s,
                                  call_timeout_s=cfg.sft.mcp_call_timeout_s) as session:
                yield McpExecutor(session)
                return
        except McpServerError as err:
            fallback = make_simulator(tools, rng, subject)
            fallback.log.rejections.append(Rejection(stage="trajectory", subject=subject, reason="mcp_unavailable",
                                                     detail=str(err), environment_failure=True))
            yield fallback
            return
    if sandbox_pool is not None and has_code(tools):
        from arenaforge.environments.runtime import EnvLoadError

        try:
            session = await sandbox_pool.open(_sandbox_environment(server, tools))
        except (EnvLoadError, SandboxError) as err:
            fallback = make_simulator(tools, rng, subject)
            fallback.log.rejections.append(Rejection(stage="trajectory", subject=subject, reason="sandbox_unavailable",
                                                     detail=str(err)[:1000], environment_failure=True))
            yield fallback
            return
        try:
            yield SandboxExecutor(sandbox_pool, session)
        finally:
            await sandbox_pool.close(session)
        return
    yield make_simulator(tools, rng, subject)


def has_code(tools: Sequence[Tool]) -> bool:
    """Whether the server's tools are all implemented in code (then they run in the sandbox)."""
    return bool(tools) and all(t.code for t in tools)


def _sandbox_environment(server: Server, tools: Sequence[Tool]) -> Any:
    from arenaforge.schemas.models import Environment

    code = "\n\n".join(t.code or "" for t in tools)
    return Environment(name=server.name, tools=[t.function for t in tools], code=code)
