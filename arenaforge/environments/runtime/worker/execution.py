"""Running tool code inside a session process: load the code, call tools, render observations.

What this module owns: turning an environment template (code, shape, parsed initial state) into
callable tools, running one call with captured output, and rendering what the agent sees.
What it leaves to others: the process it runs in and its limits (`policy`), the framing of
requests and replies (`protocol`), and which process serves which session (`server`, `zygote`).

The initial state is bound without a copy: the session process is a fork of the template's
zygote, so the state it sees is already its own copy-on-write snapshot.

Rendering (per environment: a module-level `OBSERVATION_STYLE` in the tool code, or functions
`render_result(value) -> str` and `render_error(exc) -> str`):
    "harness"   (default) `Error: <message>` for exceptions; strings as they are; anything else JSON
    "tau2"      tau2-bench's `to_json_str`: scalars inside results become strings
    "traceback" the exception's full traceback as the error
"""

import dataclasses
import inspect
import io
import json
import linecache
import sys
import traceback
import types

from .protocol import clean, encode

TOOLS_FILE = "tools.py"
LOADERS = ("_load_scenario", "load_scenario", "load_state", "_load_state", "load")
STYLES = ("harness", "tau2", "traceback")


class CappedWriter(io.TextIOBase):
    """sys.stdout replacement that keeps at most `limit` characters."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.parts: list[str] = []
        self.size = 0
        self.dropped = 0

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        room = self.limit - self.size
        if room > 0:
            self.parts.append(text[:room])
            self.size += min(room, len(text))
        self.dropped += max(0, len(text) - max(room, 0))
        return len(text)

    def value(self) -> str:
        return "".join(self.parts)


def _jsonable(obj: object) -> object:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    if hasattr(obj, "model_dump"):
        return obj.model_dump()
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    return str(obj)


def render_harness(value: object) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    try:
        return json.dumps(value, ensure_ascii=False, default=_jsonable)
    except (TypeError, ValueError, RecursionError):
        return repr(value)


def _tau2(value: object) -> object:
    if hasattr(value, "model_dump"):
        return value.model_dump()
    if isinstance(value, str) or value is None:
        return value
    if isinstance(value, (int, float, bool)):
        return str(value)
    if isinstance(value, (list, tuple)):
        return [_tau2(v) for v in value]
    if isinstance(value, dict):
        return {k: _tau2(v) for k, v in value.items()}
    return value


def render_tau2(value: object) -> str:
    if isinstance(value, str):
        return value
    return json.dumps(_tau2(value), default=str)


def error_message(err: BaseException) -> str:
    """The harness convention: the exception's message (its type when the message is empty)."""
    text = str(err)
    return text if text else type(err).__name__


STATE_TOOL = "__state__"  # the harness's snapshot request; the pool never lets an agent's call carry this name


class Tools:
    """The loaded tool code of one session: one fresh module per namespace and, for the class shape, one instance.

    Format 1 is one namespace, the module `tools`, from the template's `code`, `style`, `class_name` and `data_var`;
    format 2 (`modules`) gives each module its own globals, instance, constructor and loader arguments, and state
    (`initial_state[state_key]`, or the whole state). A tool is served by the first namespace that lists it in its
    `tools`, else by the first namespace without a `tools` list that defines it."""

    def __init__(self, template: dict) -> None:
        state = template.get("initial_state")
        specs = template.get("modules") or [{
            "name": "tools", "code": template["code"], "compiled": template.get("compiled"),
            "class_name": template.get("class_name") if template.get("style") == "class" else None,
            "data_var": template.get("data_var"), "file": TOOLS_FILE, "whole_state": True}]
        self.spaces: list[tuple[str, object, list[str]]] = []  # (name, module or instance, tools it serves)
        self.modules: list[types.ModuleType] = []
        for spec in specs:
            own = state if spec.get("whole_state") or not spec.get("state_key") else (state or {}).get(spec["state_key"])
            module, target = _load_space(spec, own)
            self.modules.append(module)
            self.spaces.append((spec["name"], target, list(spec.get("tools") or [])))
        self.target = self.spaces[0][1]
        self.declared = list(template.get("tools") or [])
        first = self.modules[0].__dict__
        style = first.get("OBSERVATION_STYLE", "harness")
        if style not in STYLES:
            raise ValueError(f"OBSERVATION_STYLE must be one of {STYLES}, not {style!r}")
        self.style = style
        custom_result, custom_error = first.get("render_result"), first.get("render_error")
        self.render = custom_result if callable(custom_result) else render_tau2 if style == "tau2" else render_harness
        self.render_none = style == "tau2" or callable(custom_result)  # else None means "what it printed"
        self.render_error = custom_error if callable(custom_error) else error_message
        self.data_vars = [(spec["name"], spec.get("data_var")) for spec in specs]

    def resolve(self, name: str):
        if self.declared and name not in self.declared:
            raise LookupError(f"unknown tool {name!r}; available: {', '.join(self.declared)}")
        listed = [space for space in self.spaces if name in space[2]]
        for _, target, _ in listed or [space for space in self.spaces if not space[2]]:
            for attr in (name, name.replace(".", "_").replace("-", "_"), name.rsplit(".", 1)[-1]):
                if attr.startswith("_"):
                    continue
                fn = getattr(target, attr, None)
                if callable(fn) and not isinstance(fn, type):
                    return fn
        raise LookupError(f"tool {name!r} is declared but not defined by the tool code")

    def snapshot(self) -> object:
        """The session's state for the harness: each namespace's instance attributes (class shape) or its state
        global (functions shape), public names only, as JSON values. Format 1: that one namespace's; format 2:
        a dict by module name, of the modules that hold state (a class instance or a `data_var`)."""
        stateful = [(name, target, data_var) for (name, target, _), (_, data_var) in zip(self.spaces, self.data_vars)
                    if len(self.spaces) == 1 or data_var or not isinstance(target, types.ModuleType)]
        out = {name: namespace_state(target, data_var) for name, target, data_var in stateful}
        return out if len(self.spaces) > 1 or self.spaces[0][0] != "tools" else out["tools"]


def namespace_state(target: object, data_var: str | None = None) -> object:
    """One namespace's state as JSON values: a class instance's public attributes; a module's `data_var` global,
    else its public globals that are neither callables nor modules. (The harness's in-process twin calls this too.)"""
    if isinstance(target, types.ModuleType):
        value = target.__dict__.get(data_var) if data_var else {
            k: v for k, v in target.__dict__.items() if not k.startswith("_") and not callable(v)
            and not isinstance(v, types.ModuleType)}
    else:
        value = {k: v for k, v in vars(target).items() if not k.startswith("_")} if hasattr(target, "__dict__") else {}
    return _state_json(value, set())


def _load_space(spec: dict, state: object) -> tuple[types.ModuleType, object]:
    """Execute one namespace's code in a fresh module; the module and the object whose methods are its tools."""
    code, file = spec["code"], spec.get("file") or f"{spec['name']}.py"
    module = types.ModuleType(spec["name"])
    module.__file__ = file
    sys.modules[spec["name"]] = module  # dataclasses and pickle look classes up here
    linecache.cache[file] = (len(code), None, code.splitlines(True), file)
    data_var = spec.get("data_var")
    if data_var and state is not None:
        module.__dict__[data_var] = state
    # dont_inherit: the tool code gets its own __future__ flags, never the worker's
    compiled = spec.get("compiled") or compile(code, file, "exec", dont_inherit=True)
    exec(compiled, module.__dict__)
    if data_var and state is not None and module.__dict__.get(data_var) is not state:
        module.__dict__[data_var] = state  # the code set a default; the package's state wins
    if not spec.get("class_name"):
        return module, module
    cls = module.__dict__.get(spec["class_name"])
    if not isinstance(cls, type):
        raise LookupError(f"class {spec['class_name']!r} is not defined by the tool code")
    return module, _instantiate(cls, state, spec.get("init_args") or {}, spec.get("load_args") or {})


def _state_json(value: object, path: set) -> object:
    """A JSON value for the state snapshot: containers recursively, objects as their public attributes plus
    `__class__`, a reference back up the current path as `<cycle>`, anything else as its repr."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if id(value) in path:
        return "<cycle>"
    path.add(id(value))
    try:
        if isinstance(value, dict):
            return {str(k): _state_json(v, path) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [_state_json(v, path) for v in value]
        if isinstance(value, (set, frozenset)):
            return sorted((_state_json(v, path) for v in value), key=repr)
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            fields = {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
            return {"__class__": type(value).__name__, **{k: _state_json(v, path) for k, v in fields.items()}}
        if hasattr(value, "__dict__") and not callable(value) and not isinstance(value, types.ModuleType):
            attrs = {k: v for k, v in vars(value).items() if not k.startswith("_")}
            return {"__class__": type(value).__name__, **{k: _state_json(v, path) for k, v in attrs.items()}}
        return repr(value)
    finally:
        path.discard(id(value))


def _instantiate(cls: type, state: dict | None, init_args: dict | None = None, load_args: dict | None = None) -> object:
    init_args, load_args = init_args or {}, load_args or {}
    if init_args:  # format 2: the package names the constructor's arguments, the state goes to the loader
        obj = cls(**init_args)
        return _load_into(obj, state, load_args)
    try:
        params = [
            p
            for p in list(inspect.signature(cls).parameters.values())
            if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty
        ]
    except (TypeError, ValueError):
        params = []
    if params:
        return cls(state if state is not None else {})
    return _load_into(cls(), state, load_args)


def _load_into(obj: object, state: dict | None, load_args: dict) -> object:
    if state is None:
        return obj
    for loader in LOADERS:
        fn = getattr(obj, loader, None)
        if callable(fn):
            fn(state, **load_args)
            return obj
    for key, value in state.items():
        setattr(obj, key, value)
    return obj


def call(tools: Tools, name: str, args: object, limit: int) -> dict:
    """Run one tool call; every failure of the tool is an observation."""
    capture = CappedWriter(limit + 1)
    real_out, real_err = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = capture
    trace = None
    if name == STATE_TOOL:
        return _snapshot_reply(tools, limit, real_out, real_err)
    try:
        fn = tools.resolve(name)
        if not isinstance(args, dict):
            raise TypeError(f"arguments must be a JSON object, got {type(args).__name__}")
        value = fn(**args)
        outcome, error = "ok", None
    except MemoryError:
        value, outcome, error = None, "limit", "MemoryError: the call exceeded its memory limit"
    except BaseException as err:  # noqa: BLE001 - every tool failure is an observation
        value, outcome = None, "error"
        tb = err.__traceback__.tb_next if err.__traceback__ is not None else None  # drop this frame
        trace = "".join(traceback.format_exception(type(err), err, tb or err.__traceback__))
        if isinstance(err, (SystemExit, KeyboardInterrupt)):
            error = f"the tool tried to exit ({err!r})"
        else:
            error = trace if tools.style == "traceback" else tools.render_error(err)
    finally:
        sys.stdout, sys.stderr = real_out, real_err
    try:
        return _reply(tools, outcome, value, error, trace, capture, limit)
    except MemoryError:
        return {"outcome": "limit", "output": "", "error": "MemoryError: rendering the result exceeded the memory limit"}
    except BaseException as err:  # noqa: BLE001 - e.g. a __repr__ that raises
        return {"outcome": "error", "output": "", "error": f"the result could not be rendered: {err!r}"}


def _snapshot_reply(tools: Tools, limit: int, real_out: object, real_err: object) -> dict:
    """The state snapshot as JSON text (a cut one is marked truncated: the pool refuses it)."""
    try:
        text = json.dumps(tools.snapshot(), sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    except BaseException as err:  # noqa: BLE001 - e.g. a property that raises
        return {"outcome": "error", "output": "", "error": f"the state could not be read: {err!r}"}
    finally:
        sys.stdout, sys.stderr = real_out, real_err
    out, truncated = clean(text, limit)
    return {"outcome": "ok", "output": out, "error": None, "traceback": None, "truncated": truncated}


def _reply(tools: Tools, outcome: str, value: object, error: str | None, trace: str | None,
           capture: CappedWriter, limit: int) -> dict:
    truncated = False
    if outcome == "ok":
        shown = value is not None or tools.render_none
        if shown:
            text, truncated = clean(str(tools.render(value)), limit)
        else:
            text, truncated = clean(capture.value(), limit, capture.dropped)
        if not text.strip():
            outcome = "no_output"
    else:
        text = clean(capture.value(), limit)[0]
        error = clean(str(error), limit)[0]
    return {"outcome": outcome, "output": text, "error": error,
            "traceback": clean(trace, limit)[0] if trace else None, "truncated": truncated}


def serve(conn, template: dict, limit: int, state_limit: int) -> None:
    """A session's loop: load the tool code, report readiness, then answer calls (output up to `limit`; a state
    read, the harness's, up to `state_limit`) until the worker hangs up."""
    import os

    nonce = template.pop("nonce")
    try:
        tools = Tools(template)
        reply: dict = {"nonce": nonce, "ready": True}
    except BaseException as err:  # noqa: BLE001 - load failures are reported, not raised
        tb = "".join(traceback.format_exception(type(err), err, err.__traceback__))
        tools, reply = None, {"nonce": nonce, "ready": False, "error": clean(tb, limit)[0]}
    template.clear()  # the state stays reachable only through the tools
    conn.sendall(encode(reply))
    if tools is None:
        os._exit(0)
    me = os.getpid()
    requests = conn.makefile("rb")
    while True:
        line = requests.readline()
        if not line:
            os._exit(0)
        req = json.loads(line)  # {"nonce", "tool", "args"}, from the worker
        tool = str(req.get("tool"))
        out = call(tools, tool, req.get("args"), state_limit if tool == STATE_TOOL else limit)
        if os.getpid() != me:  # a process the tool forked came back up to here: it must not answer
            os._exit(0)
        out["nonce"] = req.get("nonce")
        conn.sendall(encode(out))


def run_once() -> None:
    """One call without a server (the benchmark's per-call baselines): a JSON request on stdin, the reply on stdout."""
    req = json.loads(sys.stdin.buffer.read())
    env = req["env"]
    try:
        tools = Tools(env)
    except BaseException as err:  # noqa: BLE001
        reply = {"outcome": "error", "output": "", "error": error_message(err)}
    else:
        reply = call(tools, req["tool"], req.get("args") or {}, int(req.get("output_limit") or 65536))
    sys.stdout.write(json.dumps(reply) + "\n")
