"""Import a user's own Python tool module or class as an environment, with its initial state and gold calls.

`python_environment` turns files (`PATH[:Class]`, several allowed: each is its own namespace, format 2) into an
`Environment`. The agent's tool documents come from an OpenAI tools file, or are derived without running the code
(`derive_tool_docs`: the `ast` of the public functions or methods, their type annotations and Google-style
docstrings, the way tau2-bench's toolkits describe their tools). `import_environment` then replays the gold calls
in the sandbox and keeps the hash of the final session state as the suite's native check (`NativeCheck`,
kind `state_hash`): an episode passes natively when it leaves the session in the state the gold calls leave it in.
"""

from __future__ import annotations

import ast
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from arenaforge.environments.reward import gold_call_passes
from arenaforge.environments.runtime.worker.execution import LOADERS
from arenaforge.environments.state import state_hash
from arenaforge.schemas.base import Provenance
from arenaforge.schemas.errors import InputError
from arenaforge.schemas.models import (
    Environment,
    FunctionDoc,
    GoldCall,
    NativeCheck,
    Rejection,
    ToolModule,
    Verification,
)
from arenaforge.schemas.reasons import RejectReason

JSON_TYPES = {"str": "string", "int": "integer", "float": "number", "bool": "boolean", "dict": "object",
              "list": "array", "tuple": "array", "set": "array", "Dict": "object", "List": "array", "Tuple": "array",
              "Set": "array", "Sequence": "array", "Mapping": "object", "Iterable": "array"}
SECTION = re.compile(r"^\s*(Args|Arguments|Parameters|Returns?|Raises|Yields|Examples?|Notes?)\s*:\s*$")
ARG_LINE = re.compile(r"^\s*\*{0,2}(\w+)\s*(?:\(([^)]*)\))?\s*:\s*(.*)$")


@dataclass(frozen=True)
class PythonSource:
    """One `PATH[:Class]` argument, read."""

    path: Path
    class_name: str | None
    code: str

    @property
    def key(self) -> str:
        """Its namespace name and its key in a several-module initial state: the class, else the file's stem."""
        return self.class_name or re.sub(r"\W", "_", self.path.stem)

    @property
    def lineage(self) -> str:
        digest = hashlib.sha256(self.code.encode("utf-8")).hexdigest()
        return f"{self.path.resolve()}{':' + self.class_name if self.class_name else ''} (sha256 {digest})"


def read_source(spec: str) -> PythonSource:
    """`PATH` or `PATH:Class`; InputError when the file is missing, is not Python, or lacks the class."""
    path_text, _, class_name = spec.partition(":") if not Path(spec).is_file() else (spec, "", "")
    path = Path(path_text)
    if not path.is_file():
        raise InputError(f"{path_text}: no such file")
    try:
        code = path.read_text(encoding="utf-8")
        tree = ast.parse(code, filename=str(path))
    except (UnicodeDecodeError, SyntaxError, ValueError) as err:
        raise InputError(f"{path}: not a Python module ({err})") from None
    if class_name and not any(isinstance(n, ast.ClassDef) and n.name == class_name for n in tree.body):
        raise InputError(f"{path}: no class {class_name!r} at the top level")
    return PythonSource(path, class_name or None, code)


def derive_tool_docs(source: PythonSource) -> list[FunctionDoc]:
    """Tool documents of the public functions (or the class's public methods), from signatures and docstrings."""
    tree = ast.parse(source.code)
    body = tree.body
    if source.class_name:
        body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == source.class_name).body
    docs = []
    for node in body:
        if not isinstance(node, ast.FunctionDef) or node.name.startswith("_") or node.name in LOADERS:
            continue  # a loader is how the sandbox hands the class its state, never a tool
        decorators = {ast.unparse(d) for d in node.decorator_list}
        if decorators & {"property", "cached_property", "functools.cached_property"}:
            continue
        docs.append(_doc(node, method=bool(source.class_name) and "staticmethod" not in decorators))
    if not docs:
        raise InputError(f"{source.path}: no public {'methods in ' + source.class_name if source.class_name else 'functions'}")
    return docs


def _doc(node: ast.FunctionDef, method: bool) -> FunctionDoc:
    summary, arg_help = _parse_docstring(ast.get_docstring(node) or "")
    args = node.args
    positional = [*args.posonlyargs, *args.args][1 if method else 0:]
    defaults = [None] * (len(positional) - len(args.defaults)) + list(args.defaults)
    params = list(zip(positional, defaults)) + list(zip(args.kwonlyargs, args.kw_defaults))
    properties: dict[str, Any] = {}
    required = []
    for arg, default in params:
        schema = _schema(arg.annotation) if arg.annotation is not None else {}
        if arg.arg in arg_help:
            schema["description"] = arg_help[arg.arg]
        properties[arg.arg] = schema
        if default is None:
            required.append(arg.arg)
    parameters: dict[str, Any] = {"type": "object", "properties": properties}
    if required:
        parameters["required"] = required
    return FunctionDoc(name=node.name, description=summary, parameters=parameters)


def _schema(annotation: ast.expr) -> dict[str, Any]:
    """A JSON Schema for a type annotation (unknown types: no constraint)."""
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):  # a string annotation
        try:
            return _schema(ast.parse(annotation.value, mode="eval").body)
        except SyntaxError:
            return {}
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):  # X | None
        parts = [p for p in (annotation.left, annotation.right) if not (isinstance(p, ast.Constant) and p.value is None)]
        return _schema(parts[0]) if len(parts) == 1 else {}
    if isinstance(annotation, ast.Subscript):
        outer = ast.unparse(annotation.value).rsplit(".", 1)[-1]
        inner = annotation.slice
        if outer == "Optional":
            return _schema(inner)
        if outer == "Literal":
            values = [e.value for e in (inner.elts if isinstance(inner, ast.Tuple) else [inner]) if isinstance(e, ast.Constant)]
            return {"enum": values}
        kind = JSON_TYPES.get(outer)
        if kind == "array":
            first = inner.elts[0] if isinstance(inner, ast.Tuple) and inner.elts else inner
            items = _schema(first)
            return {"type": "array", **({"items": items} if items else {})}
        return {"type": kind} if kind else {}
    kind = JSON_TYPES.get(ast.unparse(annotation).rsplit(".", 1)[-1])
    return {"type": kind} if kind else {}


def _parse_docstring(text: str) -> tuple[str, dict[str, str]]:
    """The summary (text before the first section) and each argument's help from a Google-style `Args:` section."""
    summary: list[str] = []
    args: dict[str, str] = {}
    section, current, indent = None, None, None
    for line in text.splitlines():
        head = SECTION.match(line)
        if head:
            section, current, indent = head.group(1).lower(), None, None
            continue
        if section is None:
            summary.append(line.strip())
        elif section in ("args", "arguments", "parameters") and line.strip():
            depth = len(line) - len(line.lstrip())
            match = ARG_LINE.match(line)
            if match and (indent is None or depth <= indent):
                indent, current = depth, match.group(1)
                args[current] = match.group(3).strip()
            elif current:
                args[current] = f"{args[current]} {line.strip()}".strip()
    return " ".join(" ".join(summary).split()), args


def read_tool_docs(path: str | Path) -> list[FunctionDoc]:
    """OpenAI tool documents from a JSON file: a list of `{"type": "function", "function": {...}}` or bare functions."""
    data = _read_json(path)
    items = data if isinstance(data, list) else [data]
    try:
        return [FunctionDoc.model_validate(item.get("function", item) if isinstance(item, dict) else item) for item in items]
    except ValueError as err:
        raise InputError(f"{path}: not OpenAI tool documents ({str(err).splitlines()[0]})") from None


def read_calls(path: str | Path) -> list[GoldCall]:
    """Gold calls from a JSON list of `{"tool" (or "name"), "arguments"}` (arguments may be a JSON string)."""
    data = _read_json(path)
    if not isinstance(data, list):
        raise InputError(f"{path}: gold calls must be a JSON list")
    calls = []
    for i, item in enumerate(data):
        if not isinstance(item, dict) or not isinstance(item.get("tool", item.get("name")), str):
            raise InputError(f"{path}: call {i} needs a tool name (\"tool\" or \"name\")")
        arguments = item.get("arguments", {})
        if isinstance(arguments, str):
            arguments = json.loads(arguments)
        if not isinstance(arguments, dict):
            raise InputError(f"{path}: call {i}: arguments must be an object")
        calls.append(GoldCall(tool=item.get("tool", item.get("name")), arguments=arguments, answer=item.get("answer")))
    return calls


def _read_json(path: str | Path) -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise InputError(f"{path}: no such file") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise InputError(f"{path}: malformed JSON: {err}") from None


def python_environment(
    sources: list[PythonSource], *, name: str | None = None, tool_docs: list[FunctionDoc] | None = None,
    initial_state: dict[str, Any] | None = None, calls: list[GoldCall] | None = None,
    init_args: dict[str, Any] | None = None, load_args: dict[str, Any] | None = None, question: str | None = None,
    requirements: list[str] | None = None,
) -> Environment:
    """The environment (format 2, not yet replayed) of `sources`. With several sources, `initial_state`, `init_args`
    and `load_args` are keyed by each source's key (its class, else its file stem); `requirements`: the packages
    outside the standard library the code imports (`mpmath==1.3.0`)."""
    keys = [s.key for s in sources]
    if len(set(keys)) != len(keys):
        raise InputError(f"two sources share a namespace name: {keys}")
    several = len(sources) > 1

    def own(mapping: dict[str, Any] | None, key: str) -> dict[str, Any]:
        value = (mapping or {}).get(key, {}) if several else (mapping or {})
        if not isinstance(value, dict):
            raise InputError(f"the arguments for {key} must be a JSON object")
        return value

    modules = [ToolModule(name=s.key, code=s.code, class_name=s.class_name, init_args=own(init_args, s.key),
                          load_args=own(load_args, s.key), state_key=s.key if several else None) for s in sources]
    docs = tool_docs or [d for s in sources for d in derive_tool_docs(s)]
    try:
        return Environment(name=name or "python-" + "-".join(keys), tools=docs, code="", style="class" if sources[0].class_name else "functions",
                           modules=modules, initial_state=initial_state, calls=calls or [], question=question,
                           gold_answers=list(dict.fromkeys(c.answer for c in calls or [] if c.answer)),
                           requirements=sorted(set(requirements or [])), provenance=Provenance(backend="import"))
    except ValueError as err:
        raise InputError(f"the imported environment is invalid: {str(err).splitlines()[0]}") from None


STAGE = "import_python"


async def import_environment(pool: Any, env: Environment, suite: str,
                             sources: list[PythonSource]) -> Environment | Rejection:
    """Replay the gold calls in the sandbox; the environment with its native check (the final state's hash) and
    verification, or a rejection naming a declared requirement no wheel satisfies. InputError when the code does
    not load, a gold call fails, or the state cannot be read."""
    from arenaforge.environments.runtime import EnvLoadError, RequirementUnavailable, replay
    from arenaforge.schemas.errors import SandboxError

    try:
        observations, final = await replay(pool, env, env.calls)
    except RequirementUnavailable as err:
        return Rejection(stage=STAGE, subject=env.name, reason=RejectReason.MISSING_REQUIREMENT, detail=err.detail,
                         payload={"requirement": err.requirement, "requirements": env.requirements})
    except EnvLoadError as err:
        raise InputError(f"{env.name}: the tool code does not load in the sandbox: {err.detail.strip().splitlines()[-1]}") from None
    except SandboxError as err:
        if "state of session" not in str(err):
            raise
        raise InputError(f"{env.name}: {err}") from None
    failed = [f"{c.tool}: {o.outcome} {(o.error or o.output)[:200]!r}" for c, o in zip(env.calls, observations)
              if not gold_call_passes(c.answer, o.outcome, o.output)]
    if failed:
        raise InputError(f"{env.name}: {len(failed)} of {len(env.calls)} gold calls failed in the sandbox: {failed[0]}")
    native = NativeCheck(suite=suite, kind="state_hash", gold_state_sha256=state_hash(final),
                         source="; ".join(s.lineage for s in sources))
    checks = {"loads": True, "gold_calls": True, "state_readable": True}
    details = [f"{len(env.calls)} gold calls replayed; final state sha256 {native.gold_state_sha256}"]
    verification = Verification(passed=True, checks=checks, details=details)
    return Environment.model_validate({**env.model_dump(), "id": "", "native": native.model_dump(),
                                       "verification": verification.model_dump(),
                                       "provenance": Provenance(backend="import", source=native.source).model_dump()})
