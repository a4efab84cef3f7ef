"""BFCL multi-turn (base, miss_param, miss_func, long_context) as format-2 environments, from `bfcl-eval`'s data.

The data, the API classes' source and their tool documents are read from the installed `bfcl_eval` package
(`pip install --no-deps bfcl-eval`, or `--data DIR` for an unpacked copy) without importing it: its declared
dependencies (sentence-transformers, vllm extras, a dozen provider SDKs) are not what its multi-turn classes need.

One task becomes one environment:
- each involved class is its own namespace (`ToolModule`, named after the class, so BFCL's per-class globals
  never collide), loaded with `_load_scenario(initial_config[class], long_context=...)` as BFCL's executor does;
  the modules they import from `func_source_code` (`long_context`) are namespaces of their own, loaded first;
- a first namespace renders results and errors the way BFCL's executor does (`execute_multi_turn_func_call`:
  strings as they are, dicts as `json.dumps`, anything else `str`, errors `Error during execution: ...`);
- `excluded_function` is left out of the tools; `missed_function` tools appear at their turn (`tool_turns`);
- gold calls are the ground truth's call strings, parsed (positional arguments named from the method's signature);
- the native check (`kind` bfcl_multi_turn) keeps, per turn, the user's messages, the number of gold calls, the
  gold calls' results (BFCL's response check: every one must appear among the episode's results so far) and the hash
  of the classes' state (BFCL's state check compares the public attributes of each instance).

A class whose code imports a package outside the standard library declares it (`requirements`: MathAPI needs
mpmath, installed from local wheels into the session's import path, docs/ENVS.md); a class that needs a package
with no pinned requirement here is rejected with that reason.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arenaforge.schemas.base import Provenance
from arenaforge.schemas.errors import InputError
from arenaforge.schemas.models import Environment, FunctionDoc, GoldCall, NativeCheck, ToolModule

CATEGORIES = ("base", "miss_param", "miss_func", "long_context")
SUITE = "bfcl_multi_turn"
SOURCE_PACKAGE = "bfcl_eval.eval_checker.multi_turn_eval.func_source_code"
IMPORT_LINE = re.compile(r"from\s+bfcl_eval\.eval_checker\.multi_turn_eval\.func_source_code\.(\w+)\s+import")
# imports of these modules in a class's code mean it needs a package outside the standard library
NON_STDLIB = ("mpmath", "numpy", "requests", "overrides", "rank_bm25", "sentence_transformers", "faiss", "bs4", "html2text",
              "serpapi")
# the packages a class may declare, pinned to what BFCL's own executor runs with
REQUIREMENTS = {"mpmath": "mpmath==1.3.0"}
RENDER_MODULE = "bfcl_render"
RENDER_CODE = '''\
"""How BFCL's executor turns a call's result or exception into text (multi_turn_utils.execute_multi_turn_func_call)."""
import json


def render_result(value):
    if type(value) == str:
        return value
    if type(value) == dict:
        try:
            return json.dumps(value)
        except Exception:
            return str(value)
    return str(value)


def render_error(exc):
    return f"Error during execution: {str(exc)}"
'''
TYPES = {"dict": "object", "float": "number", "tuple": "array", "any": None}


@dataclass
class BfclData:
    """The parts of a `bfcl_eval` package directory the importer reads."""

    root: Path  # the bfcl_eval package directory
    class_modules: dict[str, str] = field(default_factory=dict)  # class -> module stem
    doc_files: dict[str, str] = field(default_factory=dict)  # class -> func doc file
    stateless: list[str] = field(default_factory=list)

    @property
    def version(self) -> str:
        dist = sorted(self.root.parent.glob("bfcl_eval-*.dist-info"))
        return dist[-1].name.removeprefix("bfcl_eval-").removesuffix(".dist-info") if dist else "unknown"

    def source(self, stem: str) -> str:
        return (self.root / "eval_checker" / "multi_turn_eval" / "func_source_code" / f"{stem}.py").read_text(encoding="utf-8")

    def entries(self, category: str) -> list[tuple[dict, dict]]:
        """(question entry, possible answer) pairs of one category, in file order."""
        name = f"BFCL_v4_multi_turn_{category}.json"
        questions = _jsonl(self.root / "data" / name)
        answers = {a["id"]: a for a in _jsonl(self.root / "data" / "possible_answer" / name)}
        return [(q, answers[q["id"]]) for q in questions if q["id"] in answers]

    def docs(self, class_name: str) -> list[FunctionDoc]:
        rows = _jsonl(self.root / "data" / "multi_turn_func_doc" / self.doc_files[class_name])
        return [FunctionDoc(name=r["name"], description=r.get("description", ""), parameters=_json_schema(r["parameters"]))
                for r in rows]


def locate(data: str | Path | None = None) -> BfclData:
    """The installed `bfcl_eval` (found, not imported), or `data` (that directory, or one holding `bfcl_eval/`)."""
    if data is not None:
        root = Path(data)
        root = root / "bfcl_eval" if (root / "bfcl_eval").is_dir() else root
    else:
        spec = importlib.util.find_spec("bfcl_eval")
        if spec is None or not spec.submodule_search_locations:
            raise InputError("bfcl-eval is not installed: pip install --no-deps bfcl-eval==2026.3.23 (or pass --data DIR)")
        root = Path(list(spec.submodule_search_locations)[0])
    config = root / "constants" / "executable_backend_config.py"
    if not config.is_file():
        raise InputError(f"{root}: not a bfcl_eval package directory ({config.name} is missing)")
    tree = ast.parse(config.read_text(encoding="utf-8"))
    values: dict[str, Any] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            values[node.targets[0].id] = node.value
    modules = {ast.literal_eval(k): ast.unparse(v).rsplit(".", 1)[-1].rstrip("'\"}") for k, v in
               zip(values["CLASS_FILE_PATH_MAPPING"].keys, values["CLASS_FILE_PATH_MAPPING"].values)}
    return BfclData(root, modules, ast.literal_eval(values["MULTI_TURN_FUNC_DOC_FILE_MAPPING"]),
                    ast.literal_eval(values["STATELESS_CLASSES"]))


def _jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _json_schema(schema: Any) -> Any:
    """BFCL's parameter documents in JSON Schema: dict -> object, float -> number, tuple -> array, any -> no type."""
    if isinstance(schema, list):
        return [_json_schema(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: _json_schema(v) for k, v in schema.items() if k != "type"}
    if "type" in schema:
        kind = TYPES.get(schema["type"], schema["type"])
        if kind:
            out["type"] = kind
    return out


def _signatures(code: str, class_name: str) -> dict[str, list[str]]:
    """Each public method's parameter names in order (self left out): positional ground-truth arguments get names."""
    tree = ast.parse(code)
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name)
    return {n.name: [a.arg for a in [*n.args.posonlyargs, *n.args.args][1:]] for n in cls.body
            if isinstance(n, ast.FunctionDef) and not n.name.startswith("_")}


def parse_call(text: str, signatures: dict[str, list[str]]) -> GoldCall:
    """`mv(source='a', destination='b')` -> GoldCall(tool="mv", arguments={...})."""
    node = ast.parse(text.strip(), mode="eval").body
    if not isinstance(node, ast.Call):
        raise ValueError(f"not a call: {text!r}")
    name = node.func.attr if isinstance(node.func, ast.Attribute) else ast.unparse(node.func)
    arguments = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg}
    names = signatures.get(name, [])
    for i, arg in enumerate(node.args):
        if i >= len(names):
            raise ValueError(f"{text!r}: more positional arguments than {name} takes")
        arguments[names[i]] = ast.literal_eval(arg)
    return GoldCall(tool=name, arguments=arguments)


@dataclass
class Imported:
    """One task: its environment (gold calls flattened, per-turn facts in `turns`), or why it cannot be imported."""

    task_id: str
    env: Environment | None
    turns: list[dict[str, Any]]
    rejected: str | None = None


def task_environment(data: BfclData, category: str, entry: dict, answer: dict) -> Imported:
    """The environment of one BFCL task, not yet replayed (`native` is filled in by the replay)."""
    classes = list(entry["involved_classes"])
    sources = {c: data.source(data.class_modules[c]) for c in classes}
    requirements: set[str] = set()
    for cls, code in sources.items():
        needs = sorted({m for m in NON_STDLIB if re.search(rf"^\s*(import|from)\s+{m}\b", code, re.M)})
        unpinned = [m for m in needs if m not in REQUIREMENTS]
        if unpinned:
            return Imported(entry["id"], None, [], f"{cls} needs {', '.join(unpinned)}, which the importer declares "
                                                   "no pinned requirement for")
        requirements.update(REQUIREMENTS[m] for m in needs)
    deps: list[str] = []
    for code in sources.values():
        for stem in IMPORT_LINE.findall(code):
            if stem not in deps:
                deps.append(stem)
    long_context = category == "long_context"
    modules = [ToolModule(name=RENDER_MODULE, code=RENDER_CODE)]
    modules += [ToolModule(name=stem, code=data.source(stem)) for stem in deps]  # data the classes import
    excluded = set(entry.get("excluded_function") or [])
    docs: list[FunctionDoc] = []
    signatures: dict[str, list[str]] = {}
    for cls in classes:
        own_docs = [d for d in data.docs(cls) if d.name not in excluded]
        docs += own_docs
        signatures.update(_signatures(sources[cls], cls))
        modules.append(ToolModule(
            name=cls, code=IMPORT_LINE.sub(r"from \1 import", sources[cls]), class_name=cls,
            load_args={} if cls in data.stateless else {"long_context": long_context},
            state_key=cls, tools=[d.name for d in own_docs]))  # a stateless class has no key in the state: no state
    tool_turns = {name: int(turn) for turn, names in (entry.get("missed_function") or {}).items() for name in names}
    turns, calls = [], []
    for index, (messages, truth) in enumerate(zip(entry["question"], answer["ground_truth"], strict=True)):
        parsed = [parse_call(text, signatures) for text in truth]
        calls += parsed
        turns.append({"messages": messages, "calls": len(parsed)})
    state = {c: entry["initial_config"].get(c, {}) for c in classes if c not in data.stateless}
    first_question = next((m["content"] for turn in entry["question"] for m in turn if m.get("role") == "user"), None)
    env = Environment(name=f"bfcl-{entry['id']}", tools=docs, code="", style="class", modules=modules,
                      initial_state=state or None, calls=calls, question=first_question, tool_turns=tool_turns,
                      requirements=sorted(requirements), provenance=Provenance(backend="import"))
    return Imported(entry["id"], env, turns)


async def replay_task(pool: Any, imported: Imported) -> dict[str, Any]:
    """Replay the gold calls turn by turn in one session: per turn, the results as BFCL renders them and the hash of
    the classes' state. Raises what `Pool.open`/`call`/`state` raise."""
    from arenaforge.environments.native import result_text
    from arenaforge.environments.state import state_hash

    env = imported.env
    assert env is not None
    session = await pool.open(env)
    # every tool visible, as BFCL's executor runs the ground truth (miss_func_49 calls `tail` two turns before its reveal)
    session.turn = max(env.tool_turns.values(), default=0)
    results: list[list[str]] = []
    hashes: list[str] = []
    states: list[Any] = []
    try:
        position = 0
        for turn in imported.turns:
            outputs = []
            for call in env.calls[position:position + turn["calls"]]:
                obs = await pool.call(session, call.tool, call.arguments)
                outputs.append(result_text(obs))
            position += turn["calls"]
            results.append(outputs)
            state = await pool.state(session)
            states.append(state)
            hashes.append(state_hash(state))
    finally:
        await pool.close(session)
    return {"results": results, "state_sha256": hashes, "states": states}


def with_native(imported: Imported, replayed: dict[str, Any], category: str, version: str) -> Environment:
    """The environment with its BFCL native check: per turn the messages, gold results and state hash."""
    env = imported.env
    assert env is not None
    turns = [{**turn, "gold_results": results, "state_sha256": digest}
             for turn, results, digest in zip(imported.turns, replayed["results"], replayed["state_sha256"], strict=True)]
    native = NativeCheck(suite=f"{SUITE}_{category}", kind="bfcl_multi_turn", gold_state_sha256=replayed["state_sha256"][-1],
                         source=f"bfcl-eval {version}: {imported.task_id}", turns=turns)
    # our F1's sub-answers: the gold calls' results that are not errors (each must reach the agent in some observation)
    answers = list(dict.fromkeys(r for results in replayed["results"] for r in results
                                 if r.strip() and not r.startswith("Error during execution")))
    return Environment.model_validate({**env.model_dump(), "id": "", "native": native.model_dump(), "gold_answers": answers,
                                       "provenance": Provenance(backend="import", source=native.source).model_dump()})


STAGE = "import_bfcl"


async def import_suite(pool: Any, data: BfclData, categories: list[str], limit: int | None = None,
                       concurrency: int = 4) -> tuple[list[Environment], list[Any]]:
    """Every task of `categories` (the first `limit` of each): its environment with the native check from a gold replay
    in `pool`, or a rejection (a class that needs a package the importer pins no requirement for; a declared
    requirement with no wheel here; code that does not load; a sandbox failure, kept as an environment failure)."""
    import asyncio

    from arenaforge.environments.runtime import EnvironmentFailure, EnvLoadError, RequirementUnavailable
    from arenaforge.schemas.models import Rejection
    from arenaforge.schemas.reasons import RejectReason

    unknown = sorted(set(categories) - set(CATEGORIES))
    if unknown:
        raise InputError(f"unknown BFCL multi-turn categories {unknown}; choose from {', '.join(CATEGORIES)}")
    limiter = asyncio.Semaphore(concurrency)

    async def one(category: str, entry: dict, answer: dict) -> Environment | Rejection:
        imported = task_environment(data, category, entry, answer)
        if imported.env is None:
            return Rejection(stage=STAGE, subject=imported.task_id, reason=RejectReason.NON_STDLIB_CODE,
                             detail=imported.rejected or "")
        try:
            async with limiter:
                replayed = await replay_task(pool, imported)
        except RequirementUnavailable as err:
            return Rejection(stage=STAGE, subject=imported.task_id, reason=RejectReason.MISSING_REQUIREMENT, detail=err.detail)
        except EnvLoadError as err:
            return Rejection(stage=STAGE, subject=imported.task_id, reason=RejectReason.IMPORT_ERROR, detail=err.detail[-2000:])
        except EnvironmentFailure as err:
            return Rejection.of_error(STAGE, imported.task_id, err, reason=RejectReason.REPLAY_FAILED)
        return with_native(imported, replayed, category, data.version)

    jobs = [one(c, e, a) for c in categories for e, a in data.entries(c)[:limit]]
    results = await asyncio.gather(*jobs)
    return [r for r in results if isinstance(r, Environment)], [r for r in results if not isinstance(r, Environment)]
