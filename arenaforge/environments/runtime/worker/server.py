"""The worker: one event loop between the pool (stdin/stdout) and its templates' zygotes and sessions.

What it owns: which session runs where, one request in flight per session (the rest queue), the
deadlines, and the replies. A deadline is the tool's own time: the time a session spent waiting for
a CPU (its scheduler run-queue delay) is added back, up to `LOAD_STRETCH` times the limit. A tool
that still has not answered then ran too long (outcome `timeout`); a session that spent the window
waiting for a CPU was starved (failure `overloaded`, the sandbox's fault, not the tool's). A session
process that dies between calls loses its state: the next call is not run and fails `state_lost`.
It leaves the wire format to `protocol`, the session's confinement to `policy`, tool code to
`execution` and forking sessions from a parsed state to `zygote`.
"""

import heapq
import itertools
import json
import os
import random
import selectors
import signal
import socket
import sys
import time

from . import execution, policy, zygote
from .protocol import MAX_HEADER, Reader, encode, header, session_reply

LIMITS = {
    "memory_mb": 512,  # RLIMIT_AS per session process
    "pids": 64,  # RLIMIT_NPROC per session uid
    "cpu_s": 60,  # RLIMIT_CPU per session process
    "output_limit": 65536,  # bytes of output / error text per call
    "message_limit": 4 << 20,  # bytes of arguments per call
    "open_timeout_s": 10.0,
    "scratch_root": "/tmp",
    "scratch_mb": 64,  # size of each session's private /tmp and /dev/shm
    "uid_base": 0,  # 0: do not switch uid
    "uid_slots": 4096,
    "unshare_net": False,
    "hide_paths": [],
    "namespaces": False,  # set by the hello probe: private mounts/IPC/network per session work here
    "seccomp": False,
    "load_stretch": 4.0,  # a request starved of CPU may take this many times its limit
}
DEATH_GRACE_S = 1.0  # how long a closed channel waits for the exit status that explains it


class Session:
    __slots__ = ("sid", "key", "uid", "scratch", "pid", "sock", "rbuf", "wbuf", "pending", "queue", "lost",
                 "nonce", "serial", "deadline", "started", "budget", "wait0", "isolated", "status", "dying", "watching")

    def __init__(self, sid: str, key: str) -> None:
        self.sid, self.key = sid, key
        self.uid, self.scratch, self.pid = 0, "", 0
        self.sock: socket.socket | None = None
        self.rbuf, self.wbuf = b"", b""
        self.pending: dict | None = None  # the request in flight: an open (id None: an implicit re-open) or a call
        self.queue: list[tuple[dict, bytes]] = []
        self.lost = ""  # why the process died between calls: the next call fails state_lost
        self.nonce = self.serial = 0
        self.deadline = self.started = self.budget = self.wait0 = 0.0
        self.isolated = self.dying = self.watching = False
        self.status: int | None = None


class Server:
    def __init__(self) -> None:
        self.limits = dict(LIMITS)
        self.sel = selectors.DefaultSelector()
        self.sessions: dict[str, Session] = {}
        self.templates: dict[str, dict] = {}  # key -> {"pid", "ctl", "ready", "waiting": [rid]}
        self.by_pid: dict[int, Session] = {}
        self.helpers: dict[int, int] = {}  # kill-helper pid -> the uid it sweeps (reserved until it is done)
        self.uids_used: set[int] = set()
        self.is_root = os.geteuid() == 0
        self.info_extra: dict = {"net_isolated": False, "namespaces": False, "seccomp": False}
        self.deadlines: list[tuple] = []
        self.ticks = itertools.count()
        self.serials = itertools.count(1)
        self.reader = Reader(1 << 31)
        self.outq: list[bytes] = []

    # ---------------------------------------------------------------- loop and plumbing
    def run(self) -> None:
        os.set_blocking(0, False)
        self.sel.register(0, selectors.EVENT_READ, None)
        while True:
            for key, events in self.sel.select(self._next_timeout()):
                if key.data is None:
                    self._read_stdin()
                elif key.data[0] == "t":
                    self._read_zygote(key.data[1])
                elif events & selectors.EVENT_WRITE:
                    self._write_child(key.data[1])
                else:
                    self._read_child(key.data[1])
            self._reap()
            self._expire()
            self._flush()

    def reply(self, msg: dict) -> None:
        if msg.get("id") is not None:
            self.outq.append(encode(msg))

    def _flush(self) -> None:
        """Replies of one loop turn leave in one write."""
        if self.outq:
            view, self.outq = memoryview(b"".join(self.outq)), []
            while view:
                view = view[os.write(1, view):]

    def forget(self) -> None:
        """In a fresh zygote: drop every reference to other templates' and sessions' data."""
        self.sel.close()
        self.sessions.clear()
        self.by_pid.clear()
        self.templates.clear()
        self.reader = Reader(0)
        self.outq = []

    def _read_stdin(self) -> None:
        try:
            chunk = os.read(0, 1 << 20)
        except BlockingIOError:
            return
        if not chunk:
            self._shutdown()
        for head, body in self.reader.feed(chunk):
            self._handle(head, body)

    def _handle(self, req: dict, body: bytes) -> None:
        op, rid = req.get("op"), req.get("id")
        if op == "call":
            sess = self.sessions.get(req.get("sid"))
            if sess is None:
                self.reply({"id": rid, "failure": "state_lost", "error": "the worker has no such session"})
            else:
                sess.queue.append((req, body))
                self._pump(sess)
        elif op == "open":
            self._open(req)
        elif op == "close":
            sess = self.sessions.pop(req.get("sid"), None)
            if sess is not None:
                self._kill(sess)
                for queued in ([sess.pending] if sess.pending else []) + [q for q, _ in sess.queue]:
                    self.reply({"id": queued.get("id"), "outcome": "error", "output": "", "error": "the session was closed"})
            self.reply({"id": rid, "ok": True})
        elif op == "load":
            self._load(req, body)
        elif op == "unload":
            template = self.templates.pop(req.get("key"), None)
            if template is not None:
                self.sel.unregister(template["ctl"])
                template["ctl"].close()  # the zygote exits once its last session is gone
            self.reply({"id": rid, "ok": True})
        elif op == "hello":
            self.limits.update(req.get("limits") or {})
            if self.limits["unshare_net"]:
                self.info_extra["net_isolated"] = policy.unshare_net(self.is_root)
            self.info_extra.update(policy.probe(self.limits))
            self.limits.update({k: self.info_extra[k] for k in ("namespaces", "seccomp")})
            self.reply({"id": rid, "ok": True, "info": self._info()})
        elif op == "ping":
            self.reply({"id": rid, "ok": True, "info": self._info()})
        else:
            self.reply({"id": rid, "ok": False, "error": f"unknown op {op!r}"})

    def _info(self) -> dict:
        return {"pid": os.getpid(), "uid": os.geteuid(), "sessions": len(self.sessions), "templates": len(self.templates),
                "setuid": bool(self.is_root and self.limits["uid_base"]), "python": sys.version.split()[0],
                **self.info_extra}

    # ---------------------------------------------------------------- templates and opens
    def _load(self, req: dict, body: bytes) -> None:
        key = req["key"]
        template = self.templates.get(key)
        if template is None:
            pid, ctl = zygote.start(body, self.limits, self.forget)
            template = self.templates[key] = {"key": key, "pid": pid, "ctl": ctl, "ready": False, "waiting": []}
            self.sel.register(ctl, selectors.EVENT_READ, ("t", template))
        if template["ready"]:
            self.reply({"id": req["id"], "ok": True})
        else:
            template["waiting"].append(req["id"])

    def _read_zygote(self, template: dict) -> None:
        try:
            data = template["ctl"].recv(MAX_HEADER)
        except OSError:
            data = b""
        if not data:  # the zygote died: its template is gone (its sessions die with it)
            if self.templates.get(template["key"]) is template:
                del self.templates[template["key"]]
            self.sel.unregister(template["ctl"])
            template["ctl"].close()
            for rid in template["waiting"]:
                self.reply({"id": rid, "ok": False, "failure": "spawn", "error": "the template's zygote died"})
            return
        msg = json.loads(data)
        if "ready" in msg:
            template["ready"] = msg["ready"]
            for rid in template.pop("waiting"):
                self.reply({"id": rid, "ok": msg["ready"], "error": msg.get("error"), "rss_kb": msg.get("rss_kb")})
            template["waiting"] = []
        elif "exit" in msg:
            self._exited(msg["exit"], msg["status"])
        else:
            sess = self.sessions.get(msg.get("spawned") or msg.get("spawn_failed"))
            if sess is None or sess.serial != msg.get("serial"):  # closed meanwhile: make sure it is gone
                if msg.get("pid"):
                    policy.kill_group(msg["pid"])
                if msg.get("uid"):
                    self.uids_used.add(msg["uid"])
                    self.helpers[policy.kill_uid(msg["uid"], None)] = msg["uid"]
                return
            if "pid" in msg:
                sess.pid = msg["pid"]
                self.by_pid[sess.pid] = sess
            else:
                self._kill(sess)
                self._finish(sess, "spawn", msg.get("error") or "the session could not be forked")

    def _open(self, req: dict) -> None:
        sid, key = req["sid"], req["key"]
        if sid in self.sessions:
            self.reply({"id": req["id"], "ok": False, "failure": "spawn", "error": "the session exists"})
        elif not self.templates.get(key, {}).get("ready"):
            self.reply({"id": req["id"], "ok": False, "missing": True, "error": "the template is not loaded"})
        else:
            sess = self.sessions[sid] = Session(sid, key)
            sess.queue.append(({"id": req["id"], "op": "open"}, b""))
            self._pump(sess)

    def _alloc_uid(self) -> int:
        if not (self.is_root and self.limits["uid_base"]):
            return 0
        base, slots = int(self.limits["uid_base"]), int(self.limits["uid_slots"])
        for _ in range(4 * slots):
            uid = base + random.randrange(slots)  # not sequential: no session can tell which uid comes next
            if uid not in self.uids_used:
                self.uids_used.add(uid)
                return uid
        raise RuntimeError("no free session uid")

    def _spawn(self, sess: Session, req: dict) -> None:
        template = self.templates.get(sess.key)
        if template is None or not template["ready"]:
            self._finish(sess, "state_lost", "the environment's template was unloaded", req)
            return
        try:
            sess.uid = self._alloc_uid()
        except RuntimeError as err:
            self._finish(sess, "spawn", str(err), req)
            return
        sess.scratch = os.path.join(self.limits["scratch_root"], os.urandom(16).hex())
        sess.serial, sess.nonce = next(self.serials), _nonce()
        ours, theirs = socket.socketpair()
        spec = {"sid": sess.sid, "uid": sess.uid, "scratch": sess.scratch, "nonce": sess.nonce, "serial": sess.serial}
        try:
            socket.send_fds(template["ctl"], [encode(spec)], [theirs.fileno()])
        except OSError as err:
            ours.close()
            self._finish(sess, "spawn", f"the template's zygote is gone: {err}", req)
            return
        finally:
            theirs.close()
        ours.setblocking(False)
        sess.sock, sess.rbuf, sess.wbuf, sess.status = ours, b"", b"", None
        sess.isolated = sess.dying = sess.watching = False
        self.sel.register(ours, selectors.EVENT_READ, ("s", sess))
        self._arm(sess, req, float(self.limits["open_timeout_s"]))

    # ---------------------------------------------------------------- calls
    def _pump(self, sess: Session) -> None:
        """Start the session's next queued request if none is in flight."""
        if sess.pending is not None or not sess.queue or self.sessions.get(sess.sid) is not sess:
            return
        if sess.sock is None:
            req, body = sess.queue[0]
            if sess.lost and req.get("op") == "call":
                sess.queue.pop(0)
                self.reply({"id": req["id"], "failure": "state_lost", "error": sess.lost})
                sess.lost = ""
                self._pump(sess)
                return
            if req.get("op") == "open":
                sess.queue.pop(0)
            else:
                req = {"id": None, "op": "open"}  # an implicit re-open after the tool's own crash or timeout
            self._spawn(sess, req)
            return
        req, body = sess.queue.pop(0)
        sess.nonce = _nonce()
        self._arm(sess, req, float(req.get("timeout") or 5.0))
        self._send_child(sess, header({"nonce": sess.nonce, "tool": req.get("tool")}, body))

    def _send_child(self, sess: Session, data: bytes) -> None:
        sess.wbuf += data
        self._write_child(sess)

    def _write_child(self, sess: Session) -> None:
        """Arguments of any size go out as the session reads them, never blocking the loop."""
        if sess.sock is None:
            return
        try:
            sent = sess.sock.send(sess.wbuf) if sess.wbuf else 0
        except BlockingIOError:
            sent = 0
        except OSError:
            self._channel_closed(sess)
            return
        sess.wbuf = sess.wbuf[sent:]
        if bool(sess.wbuf) != sess.watching:  # watch for room only while bytes wait
            sess.watching = bool(sess.wbuf)
            events = selectors.EVENT_READ | (selectors.EVENT_WRITE if sess.watching else 0)
            self.sel.modify(sess.sock, events, ("s", sess))

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
            self._channel_closed(sess)
            return
        sess.rbuf += chunk
        limit = int(self.limits["output_limit"])
        while b"\n" in sess.rbuf and sess.sock is not None:
            line, sess.rbuf = sess.rbuf.split(b"\n", 1)
            if not sess.isolated:  # the first message comes before any tool code ran: it is trusted
                self._isolated(sess, line)
                continue
            msg = session_reply(line, sess.nonce, limit) if sess.pending is not None else None
            if msg is not None:
                self._answered(sess, msg)
        if sess.sock is not None and len(sess.rbuf) > 20 * limit + (1 << 20):
            # an honest reply is bounded by the output limit: this is tool code writing into the channel
            self._tool_fault(sess, "the session process flooded its reply channel", "limit")

    def _isolated(self, sess: Session, line: bytes) -> None:
        try:
            msg = json.loads(line)
        except ValueError:
            msg = {}
        if msg.get("isolated") is True and msg.get("nonce") == sess.nonce:
            sess.isolated = True
        else:
            self._kill(sess)
            self._finish(sess, "isolation", f"the session could not be isolated: {msg.get('error') or 'no report'}")

    def _answered(self, sess: Session, msg: dict) -> None:
        req, sess.pending = sess.pending, None
        assert req is not None
        if req["op"] != "open":
            if "outcome" in msg:
                self.reply({"id": req["id"], **msg})
            else:
                sess.pending = req  # a readiness message during a call: not an answer
                return
        elif "ready" not in msg:
            sess.pending = req
            return
        elif msg["ready"]:
            self.reply({"id": req["id"], "ok": True})
        else:
            self._kill(sess)
            self._finish(sess, None, msg.get("error") or "the tool code failed to load", req)
            return
        self._pump(sess)

    # ---------------------------------------------------------------- deaths, deadlines, teardown
    def _channel_closed(self, sess: Session) -> None:
        """The channel closed: wait briefly for the exit status that says why."""
        if sess.status is not None:
            self._died(sess)
        elif not sess.dying:
            sess.dying = True
            sess.deadline = time.monotonic() + DEATH_GRACE_S
            heapq.heappush(self.deadlines, (sess.deadline, next(self.ticks), sess.serial, sess))

    def _exited(self, pid: int, status: int) -> None:
        sess = self.by_pid.pop(pid, None)
        if sess is not None and sess.pid == pid:
            sess.status = status
            self._died(sess)

    def _died(self, sess: Session) -> None:
        why = _describe(sess.status, self.limits)
        req = sess.pending
        self._kill(sess)
        if req is None:
            sess.lost = f"{why}; the session's state was lost"
            self._pump(sess)
        elif req["op"] == "open":
            self._finish(sess, None, f"the tool code's process died while loading: {why}", req)
        else:
            self._tool_fault(sess, why, "limit")

    def _tool_fault(self, sess: Session, why: str, outcome: str) -> None:
        """The tool crashed, flooded or ran out of time: its call fails, the session restarts."""
        req, sess.pending = sess.pending, None
        self._kill(sess)
        if req is not None:
            self.reply({"id": req["id"], "outcome": outcome, "output": "", "error": f"{why}; the session restarts from its initial state", "truncated": False})
        self._pump(sess)

    def _finish(self, sess: Session, failure: str | None, error: str, req: dict | None = None) -> None:
        """Fail the pending open (or `req`) and what queued behind it; the session has no process."""
        req = req or sess.pending
        sess.pending = None
        failed = [req] if req is not None else []
        failed += [q for q, _ in sess.queue]
        sess.queue.clear()
        for r in failed:
            if r.get("op") == "open" and failure is None:
                self.reply({"id": r["id"], "ok": False, "error": error})
            elif failure is None:  # an implicit re-open failed: the calls waiting on it see the load error
                self.reply({"id": r["id"], "outcome": "error", "output": "", "error": error, "truncated": False})
            else:
                self.reply({"id": r["id"], "ok": False, "failure": failure, "error": error})

    def _arm(self, sess: Session, req: dict, budget: float) -> None:
        sess.pending, sess.budget, sess.started = req, budget, time.monotonic()
        sess.wait0 = (policy.sched_wait_s(sess.pid) or 0.0) if sess.pid and req["op"] != "open" else 0.0
        sess.serial = next(self.serials) if req["op"] != "open" else sess.serial
        sess.deadline = sess.started + budget
        heapq.heappush(self.deadlines, (sess.deadline, next(self.ticks), sess.serial, sess))

    def _stale(self, entry: tuple) -> bool:
        deadline, _, serial, sess = entry
        return (sess.pending is None and not sess.dying) or sess.serial != serial or sess.deadline != deadline \
            or self.sessions.get(sess.sid) is not sess

    def _next_timeout(self) -> float:
        while self.deadlines and self._stale(self.deadlines[0]):
            heapq.heappop(self.deadlines)
        return max(0.0, min(self.deadlines[0][0] - time.monotonic(), 1.0)) if self.deadlines else 1.0

    def _expire(self) -> None:
        now = time.monotonic()
        while self.deadlines and self.deadlines[0][0] <= now:
            entry = heapq.heappop(self.deadlines)
            if self._stale(entry):
                continue
            sess = entry[3]
            if sess.dying:
                self._died(sess)
                continue
            elapsed = now - sess.started
            waited = elapsed if not sess.pid else max(0.0, (policy.sched_wait_s(sess.pid) or sess.wait0) - sess.wait0)
            own = elapsed - waited
            stretch = float(self.limits["load_stretch"])
            if own < sess.budget and elapsed < stretch * sess.budget:  # starved: the waiting is given back
                sess.deadline = max(now + 0.01, sess.started + min(sess.budget + waited, stretch * sess.budget))
                heapq.heappush(self.deadlines, (sess.deadline, next(self.ticks), sess.serial, sess))
            elif own < sess.budget:
                self._kill(sess)
                self._finish(sess, "overloaded", f"the sandbox is overloaded: the session waited {waited:.1f} s of "
                             f"{elapsed:.1f} s for a CPU; its state is discarded")
            elif sess.pending["op"] == "open":
                self._kill(sess)
                self._finish(sess, None, f"TimeoutError: loading the tool code took more than {sess.budget:g} s")
            else:
                self._tool_fault(sess, f"the call exceeded its {sess.budget:g} s wall-clock limit", "timeout")

    def _kill(self, sess: Session) -> None:
        """Kill every process of the session and forget its channel (its state is gone)."""
        if sess.sock is not None:
            self.sel.unregister(sess.sock)
            sess.sock.close()
            sess.sock = None
        pid, sess.pid, sess.dying = sess.pid, 0, False
        self.by_pid.pop(pid, None)
        fallback_scratch = None if self.limits["namespaces"] else sess.scratch
        if sess.uid:
            self.helpers[policy.kill_uid(sess.uid, fallback_scratch)] = sess.uid  # the uid is free once it finished
            sess.uid = 0
        elif pid:
            policy.kill_group(pid)
            if fallback_scratch:
                import shutil

                shutil.rmtree(fallback_scratch, ignore_errors=True)

    def _reap(self) -> None:
        """Kill helpers, zygotes, and session processes orphaned by a zygote's death."""
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in self.helpers:
                self.uids_used.discard(self.helpers.pop(pid))
            else:
                self._exited(pid, status)

    def _shutdown(self) -> None:
        self._flush()
        for sess in list(self.sessions.values()):
            self._kill(sess)
        os._exit(0)


def _nonce() -> int:
    return int.from_bytes(os.urandom(8), "little") >> 2  # unguessable by the tool: a fresh one per request


def _describe(status: int | None, limits: dict) -> str:
    if status is None:
        return "the session process died"
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        hint = {"SIGXCPU": f" (CPU time limit of {limits['cpu_s']} s)", "SIGKILL": " (killed: memory or another limit)",
                "SIGSEGV": " (segmentation fault)"}.get(name, "")
        return f"the session process was killed by {name}{hint}"
    return f"the session process exited with code {os.WEXITSTATUS(status) if os.WIFEXITED(status) else status}"


def main() -> None:
    if "--once" in sys.argv:
        execution.run_once()
        return
    import ctypes

    try:
        ctypes.CDLL(None).prctl(policy.PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # die with the pool
    except (OSError, AttributeError):
        pass
    policy.own_pid_namespace()
    policy.become_subreaper()
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    Server().run()
