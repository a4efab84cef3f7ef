"""The environment package on disk: one directory per `arenaforge.schemas.models.Environment`.

    env.json            every other field of the record (name, style, class_name, data_var, calls, ...)
    tools.json          the tool documents the agent sees (OpenAI function JSON, a list)
    tools.py            the tool code (standard library only)
    initial_state.json  the state a fresh session starts from (absent when there is none)

Format 2 (`Environment.modules`, `tool_turns`) adds a directory:

    modules/<name>.py   the code of each namespace (its other fields are in env.json's "modules", without code)

and `tools.py` is then optional. Format 2's `requirements` (`["mpmath==1.3.0"]`, in env.json) name the packages
outside the standard library the code imports (installed from local wheels: `runtime/deps.py`). A format-1 package
reads and writes exactly as before.

`read_package(write_package(env, d)) == env`, id included. Two tool-code shapes run unchanged:
plain module functions (optionally over a module global named by `data_var`, bound to a copy
of the initial state) and public methods of a class `class_name`, built from the initial state
(passed to its constructor, or to a `_load_scenario`/`load_state`-style method, or set as attributes).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from arenaforge.schemas.errors import InputError
from arenaforge.schemas.models import FORMAT_2_FIELDS, Environment

ENV_FILE = "env.json"
TOOLS_FILE = "tools.json"
CODE_FILE = "tools.py"
STATE_FILE = "initial_state.json"
MODULES_DIR = "modules"
SPLIT_FIELDS = ("tools", "code", "initial_state")


def write_package(env: Environment, directory: str | Path) -> Path:
    """Write `env` as a package directory (created if needed); returns the directory."""
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    data = env.model_dump(mode="json")
    meta = {k: v for k, v in data.items() if k not in SPLIT_FIELDS and (v or k not in FORMAT_2_FIELDS)}
    if env.modules:
        meta["modules"] = [{k: v for k, v in m.items() if k != "code"} for m in data["modules"]]
        (path / MODULES_DIR).mkdir(exist_ok=True)
        for module in env.modules:
            (path / MODULES_DIR / f"{module.name}.py").write_text(module.code, encoding="utf-8")
    _write_json(path / ENV_FILE, meta)
    _write_json(path / TOOLS_FILE, data["tools"])
    if env.code or not env.modules:
        (path / CODE_FILE).write_text(env.code, encoding="utf-8")
    state = path / STATE_FILE
    if env.initial_state is not None:
        _write_json(state, env.initial_state)
    elif state.exists():
        state.unlink()
    return path


def read_package(directory: str | Path) -> Environment:
    """Load a package directory into a validated `Environment` (InputError if it is not one)."""
    path = Path(directory)
    for name in (ENV_FILE, TOOLS_FILE):
        if not (path / name).is_file():
            raise InputError(f"{path} is not an environment package: {name} is missing")
    meta = _read_json(path / ENV_FILE)
    tools = _read_json(path / TOOLS_FILE)
    if not isinstance(meta, dict) or not isinstance(tools, list):
        raise InputError(f"{path}: {ENV_FILE} must hold an object and {TOOLS_FILE} a list")
    modules = meta.get("modules") or []
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise InputError(f"{path}: {ENV_FILE}: modules must be a list of objects")
    if not modules and not (path / CODE_FILE).is_file():
        raise InputError(f"{path} is not an environment package: {CODE_FILE} is missing")
    for module in modules:
        file = path / MODULES_DIR / f"{module.get('name')}.py"
        if not file.is_file():
            raise InputError(f"{path}: module {module.get('name')!r} has no code ({MODULES_DIR}/{module.get('name')}.py is missing)")
        module["code"] = file.read_text(encoding="utf-8")
    state = _read_json(path / STATE_FILE) if (path / STATE_FILE).is_file() else None
    code = (path / CODE_FILE).read_text(encoding="utf-8") if (path / CODE_FILE).is_file() else ""
    data: dict[str, Any] = {**meta, "tools": tools, "code": code, "initial_state": state}
    try:
        env = Environment.model_validate(data)
    except ValidationError as err:
        first = err.errors()[0]
        raise InputError(f"{path}: {'.'.join(map(str, first['loc']))}: {first['msg']}") from None
    if meta.get("id") and env.compute_id() != meta["id"]:
        raise InputError(f"{path}: content does not match its id {meta['id']} (edited by hand? remove the id to recompute)")
    return env


def _write_json(path: Path, value: Any) -> None:
    path.write_text(json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False) + "\n", encoding="utf-8")


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise InputError(f"{path}: malformed JSON: {err}") from None
