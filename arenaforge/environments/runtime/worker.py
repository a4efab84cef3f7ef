"""The sandbox worker: a stdlib-only fork server that runs tool code for many sessions at once.

It is copied into the sandbox image (and run directly by the process backend) and must stay
standard-library-only and self-contained: it imports nothing from the project.

Protocol: JSON lines on stdin (requests) and stdout (replies), each carrying the request `id`.

    {"id": 1, "op": "hello", "limits": {...}}            -> {"id": 1, "ok": true, "info": {...}}
    {"id": 2, "op": "open", "sid": "s1", "env": {...}}  -> {"id": 2, "ok": true} | {"ok": false, "error": tb}
    {"id": 3, "op": "call", "sid": "s1", "tool": "f", "args": {...}, "timeout": 5}
                                                        -> {"id": 3, "outcome": "ok", "output": "...", ...}
    {"id": 4, "op": "close", "sid": "s1"}               -> {"id": 4, "ok": true}

Each session is one forked child holding the session's state. The child drops to its own
uid (when the worker is root), gets rlimits (address space, processes, CPU time), a private
scratch directory, /dev/null as stdio, and talks to this process over a socketpair. Calls of
one session run one at a time; calls of different sessions run in parallel. A call past its
deadline, or a child that dies, gets its session's processes killed; the session restarts
from its initial state on its next call, and the reply says so.
"""

from __future__ import annotations

import copy
import ctypes
import dataclasses
import errno
import gc
import heapq
import inspect
import io
import itertools
import json
import linecache
import os
import resource
import selectors
import shutil
import signal
import socket
import sys
import time
import traceback
import types

MAX_FD = 4096
TOOLS_FILE = "tools.py"
LOADERS = ("_load_scenario", "load_scenario", "load_state", "_load_state", "load")
CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
PR_SET_CHILD_SUBREAPER = 36
PR_SET_PDEATHSIG = 1

LIMITS = {
    "memory_mb": 512,  # RLIMIT_AS per session process
    "pids": 64,  # RLIMIT_NPROC per session uid
    "cpu_s": 60,  # RLIMIT_CPU per session process
    "output_limit": 65536,  # bytes of output / error text per call
    "open_timeout_s": 10.0,
    "scratch_root": "/tmp",
    "scratch_mb": 0,  # informational (the tmpfs size is set by the backend)
    "uid_base": 0,  # 0: do not switch uid
    "uid_slots": 4096,
    "unshare_net": False,
}


# --------------------------------------------------------------------------- session child side
class _CappedWriter(io.TextIOBase):
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


def _render(value: object) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    try:
        return json.dumps(value, ensure_ascii=False, default=_default)
    except (TypeError, ValueError, RecursionError):
        return repr(value)


def _default(obj: object) -> object:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return dataclasses.asdict(obj)
    if hasattr(obj, "model_dump"):
        return obj.model_dump()
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    return str(obj)


def _truncate(text: str, limit: int, extra_dropped: int = 0) -> tuple[str, bool]:
    try:
        data = text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates become "?": replies must be valid UTF-8
        data = text.encode("utf-8", "replace")
        text = data.decode("utf-8")
    if len(data) <= limit and not extra_dropped:
        return text, False
    kept = data[:limit].decode("utf-8", "ignore")
    dropped = len(data) - len(data[:limit]) + extra_dropped
    return f"{kept}\n...[truncated: {dropped} more bytes]", True


class _Tools:
    """The loaded tool code of one session: a fresh module and, for class style, one instance."""

    def __init__(self, env: dict) -> None:
        code = env["code"]
        module = types.ModuleType("tools")
        module.__file__ = TOOLS_FILE
        sys.modules["tools"] = module  # dataclasses and pickle look classes up here
        linecache.cache[TOOLS_FILE] = (len(code), None, code.splitlines(True), TOOLS_FILE)
        state = env.get("initial_state")
        data_var = env.get("data_var")
        bound = None
        if data_var and state is not None:
            bound = copy.deepcopy(state)
            module.__dict__[data_var] = bound
        exec(compile(code, TOOLS_FILE, "exec"), module.__dict__)
        if bound is not None and module.__dict__.get(data_var) is not bound:
            module.__dict__[data_var] = bound  # the code set a default; the package's state wins
        self.module = module
        self.target: object = module
        if env.get("style") == "class":
            cls = module.__dict__.get(env.get("class_name") or "")
            if not isinstance(cls, type):
                raise LookupError(f"class {env.get('class_name')!r} is not defined by the tool code")
            self.target = _instantiate(cls, None if state is None else copy.deepcopy(state))
        self.declared = list(env.get("tools") or [])

    def resolve(self, name: str):
        if self.declared and name not in self.declared:
            raise LookupError(f"unknown tool {name!r}; available: {', '.join(self.declared)}")
        for attr in (name, name.replace(".", "_").replace("-", "_"), name.rsplit(".", 1)[-1]):
            if attr.startswith("_"):
                continue
            fn = getattr(self.target, attr, None)
            if callable(fn) and not isinstance(fn, type):
                return fn
        raise LookupError(f"tool {name!r} is declared but not defined by the tool code")


def _instantiate(cls: type, state: dict | None) -> object:
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
    obj = cls()
    if state is None:
        return obj
    for loader in LOADERS:
        fn = getattr(obj, loader, None)
        if callable(fn):
            fn(state)
            return obj
    for key, value in state.items():
        setattr(obj, key, value)
    return obj


def _call(tools: _Tools, req: dict, limit: int) -> dict:
    capture = _CappedWriter(limit + 1)
    real_out, real_err = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = capture
    try:
        fn = tools.resolve(req["tool"])
        args = req.get("args") or {}
        if not isinstance(args, dict):
            raise TypeError(f"arguments must be a JSON object, got {type(args).__name__}")
        value = fn(**args)
        outcome, error = "ok", None
    except MemoryError:
        value, outcome, error = None, "limit", "MemoryError: the call exceeded its memory limit"
    except BaseException as err:  # noqa: BLE001 - every tool failure is an observation
        value, outcome = None, "error"
        tb = err.__traceback__.tb_next if err.__traceback__ is not None else None  # drop this frame
        error = "".join(traceback.format_exception(type(err), err, tb or err.__traceback__))
        if isinstance(err, (SystemExit, KeyboardInterrupt)):
            error = f"{type(err).__name__}: the tool tried to exit ({err!r})\n" + error
    finally:
        sys.stdout, sys.stderr = real_out, real_err
    try:
        return _reply(outcome, value, error, capture, limit)
    except MemoryError:
        return {"outcome": "limit", "output": "", "error": "MemoryError: rendering the result exceeded the memory limit", "truncated": False}
    except BaseException as err:  # noqa: BLE001 - e.g. a __repr__ that raises
        return {"outcome": "error", "output": "", "error": f"the result could not be rendered: {err!r}", "truncated": False}


def _reply(outcome: str, value: object, error: str | None, capture: _CappedWriter, limit: int) -> dict:
    printed = capture.value()
    truncated = False
    if outcome == "ok":
        text = printed if value is None else _render(value)
        dropped = capture.dropped if value is None else 0
        text, truncated = _truncate(text, limit, dropped)
        if not text.strip():
            outcome = "no_output"
    else:
        text = _truncate(printed, limit)[0]
        error, _ = _truncate(error or "", limit)
    return {"outcome": outcome, "output": text, "error": error, "truncated": truncated}


def _child_main(conn: socket.socket, env: dict, limits: dict, uid: int, scratch: str) -> None:
    fd = conn.fileno()
    devnull = os.open(os.devnull, os.O_RDWR)
    for target in (0, 1, 2):
        os.dup2(devnull, target)
    max_fd = min(resource.getrlimit(resource.RLIMIT_NOFILE)[0], 1 << 16)
    os.closerange(3, fd)  # other sessions' channels must not be reachable from this one
    os.closerange(fd + 1, max(max_fd, MAX_FD))
    if uid:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    else:
        os.setsid()
    mem = int(limits["memory_mb"]) * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    cpu = int(limits["cpu_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if uid:
        resource.setrlimit(resource.RLIMIT_NPROC, (int(limits["pids"]), int(limits["pids"])))
    else:  # shared uid: allow what the user already runs plus this session's budget
        nproc = _count_user_procs() + int(limits["pids"])
        soft, hard = resource.getrlimit(resource.RLIMIT_NPROC)
        cap = nproc if hard == resource.RLIM_INFINITY else min(nproc, hard)
        resource.setrlimit(resource.RLIMIT_NPROC, (cap, hard))
    os.makedirs(scratch, mode=0o700, exist_ok=True)
    os.chdir(scratch)
    os.environ.clear()
    os.environ.update({"HOME": scratch, "TMPDIR": scratch, "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})
    limit = int(limits["output_limit"])
    rfile = conn.makefile("rb")
    try:
        tools = _Tools(env)
        reply = {"ready": True}
    except BaseException as err:  # noqa: BLE001 - load failures are reported, not raised
        tb = "".join(traceback.format_exception(type(err), err, err.__traceback__))
        tools, reply = None, {"ready": False, "error": _truncate(tb, limit)[0]}
    env = None  # noqa: F841 - drop the payload reference
    gc.collect()
    conn.sendall(json.dumps(reply).encode() + b"\n")
    if tools is None:
        os._exit(0)
    me = os.getpid()
    while True:
        line = rfile.readline()
        if not line:
            os._exit(0)
        req = json.loads(line)
        reply = _call(tools, req, limit)
        if os.getpid() != me:  # a process the tool forked came back up to here: it must not answer or read
            os._exit(0)
        reply["seq"] = req.get("seq")
        conn.sendall(json.dumps(reply, ensure_ascii=False).encode() + b"\n")


def _count_user_procs() -> int:
    uid = os.getuid()
    count = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                if os.stat(f"/proc/{entry}").st_uid == uid:
                    count += 1
            except OSError:
                continue
    return count


# --------------------------------------------------------------------------- fork server side
class Session:
    __slots__ = ("sid", "env_line", "uid", "pid", "sock", "buf", "pending", "deadline", "queue", "reset", "scratch", "seq")

    def __init__(self, sid: str, env_line: bytes, uid: int, scratch: str) -> None:
        self.sid = sid
        self.env_line = env_line  # the raw `open` request: the child parses it after the fork
        self.uid = uid
        self.scratch = scratch
        self.pid = 0
        self.sock: socket.socket | None = None
        self.buf = b""
        self.pending: dict | None = None  # request in flight (call or open)
        self.deadline = 0.0
        self.queue: list[dict] = []
        self.reset = ""  # why the last child died, reported on the next call
        self.seq = 0  # sequence number of the call in flight: stray replies (from forked tool processes) are dropped


class Server:
    def __init__(self) -> None:
        self.limits = dict(LIMITS)
        self.sel = selectors.DefaultSelector()
        self.sessions: dict[str, Session] = {}
        self.by_pid: dict[int, Session] = {}
        self.statuses: dict[int, int] = {}
        self.inbuf = b""
        self.uid_next = 0
        self.uids_used: set[int] = set()
        self.is_root = os.geteuid() == 0
        self.net_isolated = False
        self.to_spawn: list[Session] = []
        self.deadlines: list[tuple] = []  # heap of (deadline, tiebreak, token of the request, session)
        self.tick = itertools.count()
        self.outq: list[bytes] = []

    # ---- plumbing
    def reply(self, msg: dict) -> None:
        self.outq.append(json.dumps(msg, ensure_ascii=False).encode() + b"\n")

    def flush(self) -> None:
        """Replies of one loop iteration leave in one write."""
        if not self.outq:
            return
        view, self.outq = memoryview(b"".join(self.outq)), []
        while view:
            view = view[os.write(1, view) :]

    def run(self) -> None:
        os.set_blocking(0, False)
        self.sel.register(0, selectors.EVENT_READ, None)
        while True:
            timeout = self._next_timeout()
            for key, _ in self.sel.select(timeout):
                if key.data is None:
                    self._read_stdin()
                else:
                    self._read_child(key.data)
            self._reap()
            self._expire()
            self.flush()
            while self.to_spawn:  # forked here, at the top of the loop, where no other data is on the stack
                self._spawn_next()
                self.flush()

    def _spawn_next(self) -> None:
        sess = self.to_spawn.pop(0)
        if self.sessions.get(sess.sid) is not sess or sess.sock is not None or not sess.queue:
            return
        err = self._spawn(sess)
        if err:
            for req in sess.queue:
                self._fail(req, "limit", err)
            sess.queue.clear()
            return
        req = sess.queue.pop(0)
        if req.get("op") != "open":  # implicit re-open after a reset: wait for ready first
            sess.queue.insert(0, req)
            req = {"id": None, "op": "open"}
        sess.pending = req
        self._arm(sess, float(self.limits["open_timeout_s"]))

    def _arm(self, sess: Session, seconds: float) -> None:
        """Set the deadline of the request now in flight (a heap entry; stale entries are skipped later)."""
        sess.deadline = time.monotonic() + seconds
        heapq.heappush(self.deadlines, (sess.deadline, next(self.tick), id(sess.pending), sess))

    def _stale(self, entry: tuple) -> bool:
        deadline, _, token, sess = entry
        return sess.pending is None or id(sess.pending) != token or sess.deadline != deadline or self.sessions.get(sess.sid) is not sess

    def _next_timeout(self) -> float:
        while self.deadlines and self._stale(self.deadlines[0]):
            heapq.heappop(self.deadlines)
        if not self.deadlines:
            return 1.0
        return max(0.0, min(self.deadlines[0][0] - time.monotonic(), 1.0))

    def _read_stdin(self) -> None:
        try:
            chunk = os.read(0, 1 << 20)
        except BlockingIOError:
            return
        if not chunk:
            self._shutdown()
        self.inbuf += chunk
        while b"\n" in self.inbuf:
            line, self.inbuf = self.inbuf.split(b"\n", 1)
            if line.strip():
                self._handle(line)

    def _handle(self, line: bytes) -> None:
        req = json.loads(line)
        op, rid = req.get("op"), req.get("id")
        if op == "hello":
            self.limits.update(req.get("limits") or {})
            if self.limits.get("unshare_net"):
                self.net_isolated = _unshare_net(self.is_root)
            self.reply({"id": rid, "ok": True, "info": self._info()})
        elif op == "ping":
            self.reply({"id": rid, "ok": True, "info": self._info()})
        elif op == "open":
            self._open(req, line)
        elif op == "call":
            sess = self.sessions.get(req.get("sid"))
            if sess is None:
                self.reply({"id": rid, "outcome": "error", "error": "SandboxError: unknown session", "output": ""})
            else:
                sess.queue.append(req)
                self._pump(sess)
        elif op == "close":
            sess = self.sessions.pop(req.get("sid"), None)
            if sess is not None:
                self._kill(sess, cleanup=True)
                self.uids_used.discard(sess.uid)
                for queued in ([sess.pending] if sess.pending else []) + sess.queue:
                    self._fail(queued, "error", "the session was closed")
            self.reply({"id": rid, "ok": True})
        else:
            self.reply({"id": rid, "ok": False, "error": f"unknown op {op!r}"})

    def _info(self) -> dict:
        return {
            "pid": os.getpid(),
            "uid": os.geteuid(),
            "sessions": len(self.sessions),
            "net_isolated": self.net_isolated,
            "setuid": bool(self.is_root and self.limits["uid_base"]),
            "python": sys.version.split()[0],
        }

    def _alloc_uid(self) -> int:
        if not (self.is_root and self.limits["uid_base"]):
            return 0
        slots = int(self.limits["uid_slots"])
        for _ in range(slots):
            uid = int(self.limits["uid_base"]) + self.uid_next % slots
            self.uid_next += 1
            if uid not in self.uids_used:
                self.uids_used.add(uid)
                return uid
        raise RuntimeError("no free session uid")

    def _open(self, req: dict, line: bytes) -> None:
        sid = req["sid"]
        if sid in self.sessions:
            self.reply({"id": req["id"], "ok": False, "error": "SandboxError: session exists"})
            return
        try:
            uid = self._alloc_uid()
        except RuntimeError as err:
            self.reply({"id": req["id"], "ok": False, "error": f"SandboxError: {err}"})
            return
        root = self.limits["scratch_root"]
        scratch = os.path.join(root, f"s-{uid}" if uid else f"s-{os.getpid()}-{sid}")
        sess = Session(sid, line, uid, scratch)
        self.sessions[sid] = sess
        sess.queue.append({"id": req["id"], "op": "open"})
        self._pump(sess)

    def _spawn(self, sess: Session) -> str | None:
        parent, child = socket.socketpair()
        try:
            pid = os.fork()
        except OSError as err:
            parent.close()
            child.close()
            return f"SandboxError: cannot fork a session process: {err}"
        if pid == 0:  # ---- child
            try:
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                env = json.loads(sess.env_line)["env"]
                limits = dict(self.limits)
                uid, scratch = sess.uid, sess.scratch
                parent.close()
                self._forget()
                _child_main(child, env, limits, uid, scratch)
            finally:
                os._exit(70)
        child.close()
        parent.setblocking(False)
        sess.pid, sess.sock, sess.buf = pid, parent, b""
        self.by_pid[pid] = sess
        self.sel.register(parent, selectors.EVENT_READ, sess)
        return None

    def _forget(self) -> None:
        """In a fresh child: drop every reference to other sessions' data."""
        try:
            self.sel.close()
        except Exception:  # noqa: BLE001
            pass
        self.sessions.clear()
        self.by_pid.clear()
        self.inbuf = b""
        self.outq = []
        self.deadlines = []
        gc.collect()

    def _pump(self, sess: Session) -> None:
        """Start the next queued request of a session if none is in flight."""
        if sess.pending is not None or not sess.queue:
            return
        if sess.sock is None:
            if sess not in self.to_spawn:
                self.to_spawn.append(sess)
            return
        req = sess.queue.pop(0)
        sess.pending = req
        self._arm(sess, float(req.get("timeout") or 5.0))
        sess.seq += 1
        payload = {"seq": sess.seq, "tool": req.get("tool"), "args": req.get("args")}
        try:
            sess.sock.sendall(json.dumps(payload).encode() + b"\n")
        except OSError:
            self._child_died(sess, "the session process stopped reading its requests")

    def _read_child(self, sess: Session) -> None:
        if sess.sock is None:
            return
        try:
            chunk = sess.sock.recv(1 << 20)
        except BlockingIOError:
            return
        except OSError:
            chunk = b""
        if not chunk:
            self._child_died(sess, None)
            return
        sess.buf += chunk
        if len(sess.buf) > 16 * int(self.limits["output_limit"]) + (1 << 20) and b"\n" not in sess.buf[-len(chunk) :]:
            # an honest reply is bounded by the output limit: this is tool code writing into the channel
            self._child_died(sess, "the session process flooded its reply channel")
            return
        while b"\n" in sess.buf and sess.pending is not None:
            line, sess.buf = sess.buf.split(b"\n", 1)
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            is_open = sess.pending.get("op") == "open"
            if not isinstance(msg, dict) or (not is_open and msg.get("seq") != sess.seq):
                continue
            msg.pop("seq", None)
            self._child_reply(sess, msg)

    def _child_reply(self, sess: Session, msg: dict) -> None:
        req, sess.pending = sess.pending, None
        assert req is not None
        if req.get("op") == "open":
            if msg.get("ready"):
                if req["id"] is not None:
                    self.reply({"id": req["id"], "ok": True})
            else:
                err = msg.get("error") or "load failed"
                self._kill(sess, cleanup=True)
                if req["id"] is not None:
                    self.reply({"id": req["id"], "ok": False, "error": err})
                else:  # a re-open failed: fail what was waiting
                    for queued in sess.queue:
                        self._fail(queued, "error", err)
                    sess.queue.clear()
        else:
            if sess.reset:
                msg["reset"], sess.reset = sess.reset, ""
            msg["id"] = req["id"]
            self.reply(msg)
        self._pump(sess)

    def _fail(self, req: dict, outcome: str, error: str) -> None:
        if req.get("id") is None:
            return
        if req.get("op") == "open":
            self.reply({"id": req["id"], "ok": False, "error": error})
        else:
            self.reply({"id": req["id"], "outcome": outcome, "output": "", "error": error, "truncated": False})

    def _child_died(self, sess: Session, why: str | None) -> None:
        status = self._kill(sess, cleanup=True)
        if why is None:
            why = _describe_status(status, self.limits)
        req, sess.pending = sess.pending, None
        if req is not None and req.get("op") == "open":
            err = f"the tool code's process died while loading: {why}"
            if req.get("id") is not None:
                self.reply({"id": req["id"], "ok": False, "error": err})
            for queued in sess.queue:  # never respawn in a loop for code that cannot load
                self._fail(queued, "limit", err)
            sess.queue.clear()
            return
        if req is not None:
            self._fail(req, "limit", f"{why}; the session restarts from its initial state")
        else:  # died between calls: tell the next call
            sess.reset = f"{why}; the session restarted from its initial state"
        self._pump(sess)

    def _expire(self) -> None:
        now = time.monotonic()
        while self.deadlines and self.deadlines[0][0] <= now:
            entry = heapq.heappop(self.deadlines)
            sess = entry[3]
            if not self._stale(entry):
                req, sess.pending = sess.pending, None
                self._kill(sess, cleanup=True)
                if req.get("op") == "open":
                    if req.get("id") is not None:
                        self.reply({"id": req["id"], "ok": False, "error": "TimeoutError: loading the tool code timed out"})
                    for queued in sess.queue:
                        self._fail(queued, "timeout", "loading the tool code timed out")
                    sess.queue.clear()
                else:
                    self.reply(
                        {
                            "id": req["id"],
                            "outcome": "timeout",
                            "output": "",
                            "error": f"the call exceeded its {req.get('timeout')} s wall-clock limit; "
                            "the session restarts from its initial state",
                            "truncated": False,
                        }
                    )
                self._pump(sess)

    def _kill(self, sess: Session, cleanup: bool) -> int | None:
        """Kill every process of the session and forget its channel (its state is lost); returns the exit status."""
        status = None
        if sess.sock is not None:
            try:
                self.sel.unregister(sess.sock)
            except (KeyError, ValueError):
                pass
            sess.sock.close()
            sess.sock = None
        pid, sess.pid = sess.pid, 0
        if pid:
            self.by_pid.pop(pid, None)
            if sess.uid:
                _kill_uid(sess.uid, sess.scratch if cleanup else None)
            else:
                for target in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
                    try:
                        target()
                    except OSError:
                        pass
                if cleanup:
                    shutil.rmtree(sess.scratch, ignore_errors=True)
            status = self._wait(pid)
        elif cleanup and sess.uid:
            _kill_uid(sess.uid, sess.scratch)
        return status

    def _wait(self, pid: int) -> int | None:
        if pid in self.statuses:
            return self.statuses.pop(pid)
        if not pid:
            return None
        try:
            _, status = os.waitpid(pid, 0)
            return status
        except ChildProcessError:
            return self.statuses.pop(pid, None)

    def _reap(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in self.by_pid:
                self.statuses[pid] = status
                if len(self.statuses) > 10000:
                    self.statuses.clear()

    def _shutdown(self) -> None:
        self.flush()
        for sess in list(self.sessions.values()):
            self._kill(sess, cleanup=True)
        os._exit(0)


def _describe_status(status: int | None, limits: dict) -> str:
    if status is None:
        return "the session process died"
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        hint = {
            "SIGXCPU": f" (CPU time limit of {limits['cpu_s']} s)",
            "SIGKILL": " (killed: memory or another limit)",
            "SIGSEGV": " (segmentation fault)",
        }.get(name, "")
        return f"the session process was killed by {name}{hint}"
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else status
    return f"the session process exited with code {code}"


def _kill_uid(uid: int, scratch: str | None) -> None:
    """Kill every process owned by `uid` (fork bombs included) from a helper running as that uid."""
    pid = os.fork()
    if pid == 0:
        try:
            os.setgroups([])
            os.setgid(uid)
            os.setuid(uid)
            for _ in range(50):  # new forks may race the first sweep
                try:
                    os.kill(-1, signal.SIGKILL)  # as this uid: every process of the uid but ourselves
                except OSError:
                    break
            if scratch:
                shutil.rmtree(scratch, ignore_errors=True)
        finally:
            os._exit(0)
    os.waitpid(pid, 0)


def _unshare_net(is_root: bool) -> bool:
    libc = ctypes.CDLL(None, use_errno=True)
    if is_root:
        return libc.unshare(CLONE_NEWNET) == 0
    uid, gid = os.getuid(), os.getgid()
    if libc.unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0:
        return False
    try:  # map ourselves so file ownership still reads as our uid
        with open("/proc/self/setgroups", "w") as fh:
            fh.write("deny")
        with open("/proc/self/uid_map", "w") as fh:
            fh.write(f"{uid} {uid} 1")
        with open("/proc/self/gid_map", "w") as fh:
            fh.write(f"{gid} {gid} 1")
    except OSError:
        pass
    return True


def run_once() -> None:
    """One call without a server: {"env", "tool", "args", "output_limit"} on stdin, the reply on stdout (baselines)."""
    req = json.loads(sys.stdin.buffer.read())
    try:
        tools = _Tools(req["env"])
    except BaseException as err:  # noqa: BLE001
        reply = {"outcome": "error", "output": "", "error": "".join(traceback.format_exception(err)), "truncated": False}
    else:
        reply = _call(tools, req, int(req.get("output_limit") or LIMITS["output_limit"]))
    sys.stdout.write(json.dumps(reply) + "\n")


def main() -> None:
    if "--once" in sys.argv:
        run_once()
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)  # orphans of sessions come back to us for reaping
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # die with the pool (process backend)
    except (OSError, AttributeError):
        pass
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    try:
        Server().run()
    except OSError as err:
        if err.errno == errno.EPIPE:
            os._exit(0)
        raise


if __name__ == "__main__":
    main()
