"""The life of one session inside the worker: spawn, requests one at a time, deadlines, death, teardown.

Deadlines are measured in the tool's own time (`deadlines.RequestClock`): a late reply is a `timeout`
(the tool's fault) or `overloaded` (the sandbox's).

`SessionServer` is the part of the worker's `Server` that owns this; the server owns the event loop,
the pool's requests and the templates.
"""

import heapq
import itertools
import json
import os
import random
import selectors
import shutil
import socket
import time
from collections import Counter

from . import cgroups, policy
from .deadlines import RequestClock
from .execution import STATE_TOOL
from .protocol import encode, session_reply

YIELD_AFTER_S = 0.005  # a request in flight this long weighs less among its worker's sessions (`cgroups.weigh`)
# a request in flight this long, on a worker of few sessions, runs on fewer cores and weighs less at once
# (`cgroups.pin`); on a busy worker the first look is at `YIELD_AFTER_S` (`_look_at_long_request`)
PIN_AFTER_S = 0.001
DEATH_GRACE_S = 1.0  # how long a closed channel waits for the exit status that says why
STRAY_SWEEP_S = 0.2  # how often idle sessions are checked for processes, or CPU use, between calls
DYING_CALM_S = 2.0  # the longest a killed session's core is kept clear while its processes die (`_kill`)
REMOVE_EVERY_S = 0.005  # how often a killed session's groups are tried for removal while its processes die
IDLE_CPU_S = 0.5  # CPU a session may use between two calls; past it (a busy thread left running), its `limit`. Not
# less: BLAS worker threads spin up to ~0.1 s each after their last job


class Session:
    __slots__ = ("sid", "key", "uid", "scratch", "pid", "sock", "rbuf", "wbuf", "pending", "queue", "lost",
                 "nonce", "serial", "spawn", "deadline", "clock", "spare", "isolated", "status", "dying", "watching",
                 "stray", "fault", "idle_cpu", "yielding", "pinned", "held")

    def __init__(self, sid: str, key: str) -> None:
        self.sid, self.key = sid, key
        self.uid, self.scratch, self.pid = 0, "", 0
        self.sock: socket.socket | None = None
        self.rbuf, self.wbuf = b"", b""
        self.pending: dict | None = None  # the request in flight: an open (id None: an implicit re-open) or a call
        self.queue: list[tuple[dict, bytes]] = []
        self.lost = ""  # why the process died between calls: the next call fails state_lost
        self.nonce = self.serial = self.spawn = 0  # spawn: which fork the zygote's messages are about
        self.deadline = 0.0
        self.clock: RequestClock | None = None
        self.isolated = self.dying = self.watching = False
        self.spare = False  # forked ahead of an open (server._prepare_spare)
        self.status: int | None = None
        self.stray = 0  # bytes of lines that were not the reply, since the last request was sent
        self.fault = ""  # tool code ended the process between calls (a flood): the next call is that `limit`
        self.idle_cpu: tuple[int, float] | None = None  # (serial, CPU s) at the first sweep since that request
        self.yielding = False  # its request ran long: its group weighs less until its next request is sent
        self.pinned: list[int] = []  # its request ran long: the cores its tasks may run on until then
        self.held: list[int] = []  # the cores its cpuset was last set to ([]: every core its worker has)


class SessionServer:
    """Sessions and their deadlines; the worker's `Server` adds the loop, the pool's ops and the templates."""

    def __init__(self) -> None:
        self.limits: dict = {}
        self.sel = selectors.DefaultSelector()
        self.sessions: dict[str, Session] = {}
        self.templates: dict[str, dict] = {}  # key -> {"pid", "ctl", "ready", "waiting": [rid], "opens", "spare"}
        self.spawning: dict[int, Session] = {}  # spawn serial -> session, until the zygote says which pid
        self.by_pid: dict[int, Session] = {}
        self.helpers: dict[int, int] = {}  # kill-helper pid -> the uid it sweeps (reserved until it is done)
        self.helpers_forked = 0  # kill helpers forked so far (sessions with a pids group need none: `cgroups.kill`)
        self.groups_to_remove: set[int] = set()  # uids whose processes are gone or dying, their cgroups not yet
        self.next_removal = 0.0  # when to try removing those groups again (`Server._remove_groups`)
        self.uids_used: set[int] = set()
        self.is_root = os.geteuid() == 0
        self.deadlines: list[tuple] = []
        self.yields: list[tuple] = []  # (when, tick, serial, session): when to look at a request still in flight
        self.ticks = itertools.count()
        self.serials = itertools.count(1)
        self.next_sweep = 0.0
        self.cores: list[int] = []  # where sessions may run (`cgroups.cores`); fewer while their request runs long
        self.calm: list[int] = []  # the cores no pinned call holds, while one runs: the rest run there (`_keep_calm`)
        self.dying_cores: dict[int, tuple[list[int], float]] = {}  # uid -> (its pinned cores, until when) while its
        # processes die there: exiting is kernel work too (freeing a memfd, tearing down 60 processes)
        self.core_offset = random.randrange(1 << 16)  # where this worker starts pinning, so workers spread

    def reply(self, msg: dict) -> None:
        raise NotImplementedError

    def notify(self, msg: dict) -> None:
        """Send the pool a message that answers no request."""
        raise NotImplementedError

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
        sess.spawn, sess.nonce = next(self.serials), _nonce()
        ours, theirs = socket.socketpair()
        spec = {"sid": sess.sid, "uid": sess.uid, "scratch": sess.scratch, "nonce": sess.nonce, "serial": sess.spawn}
        self.spawning[sess.spawn] = sess
        try:
            socket.send_fds(template["ctl"], [encode(spec)], [theirs.fileno()])
        except OSError as err:
            ours.close()
            del self.spawning[sess.spawn]
            self.uids_used.discard(sess.uid)
            self._finish(sess, "spawn", f"the template's zygote is gone: {err}", req)
            return
        finally:
            theirs.close()
        ours.setblocking(False)
        sess.sock, sess.rbuf, sess.wbuf, sess.status = ours, b"", b"", None
        sess.isolated = sess.dying = sess.watching = False
        sess.yielding, sess.pinned = False, []  # a new process: its new groups have the full weight and every core
        self.sel.register(ours, selectors.EVENT_READ, ("s", sess))
        self._arm(sess, req, float(self.limits["open_timeout_s"]))

    def _pump(self, sess: Session) -> None:
        """Start the session's next queued request if none is in flight."""
        if sess.pending is not None or not sess.queue or self.sessions.get(sess.sid) is not sess:
            return
        if sess.dying:  # its channel closed between calls: the request waits for the exit status that says why
            return  # (`_died`), rather than going to a process already gone and failing as that call's own doing
        if sess.sock is None:
            req, body = sess.queue[0]
            if sess.lost and req.get("op") == "call":
                sess.queue.pop(0)
                self.reply({"id": req["id"], "failure": "state_lost", "error": sess.lost})
                sess.lost = ""
                self._pump(sess)
                return
            if sess.fault and req.get("op") == "call":  # the tool's own doing, so the tool's outcome
                sess.queue.pop(0)
                self.reply({"id": req["id"], "outcome": "limit", "output": "", "error": sess.fault,
                            "truncated": False})
                sess.fault = ""
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
        self._arm(sess, req, float(req.get("timeout") or 5.0), cpu_only=req.get("tool") == STATE_TOOL)
        tool = json.dumps(str(req.get("tool"))).encode()  # ASCII-escaped: whatever the caller named, it encodes
        self._send_child(sess, b'{"nonce":%d,"tool":%s,"args":%s}\n' % (sess.nonce, tool, body or b"{}"))
        self._restore(sess)  # after the request is on its way: a call that ran long left these (`_answered`)

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
        limit = self._reply_limit(sess)
        data = sess.rbuf + chunk
        cut = data.rfind(b"\n") + 1
        lines, sess.rbuf = data[:cut], data[cut:]  # whole lines; the rest waits for its newline
        sock, start = sess.sock, 0
        if not sess.isolated and cut:  # the first message comes before any tool code ran: it is trusted
            start = lines.index(b"\n") + 1
            self._isolated(sess, lines[:start - 1])
        # Only a line that holds the nonce of the request in flight can answer it, so the rest is skipped by a
        # search, not parsed: whatever tool code writes into its channel, during a call or between calls, costs the
        # worker a pass over the bytes. Parsed a line at a time, bare newlines held it 150 ms per MB while a
        # neighbour's call waited (issue 35); and counted, so a flood is stopped at the bound, not read to its end.
        while start < cut and sess.sock is sock and sess.pending is not None:
            at = lines.find(b"%d" % sess.nonce, start)
            if at < 0:
                break
            begin, end = max(start, lines.rfind(b"\n", start, at) + 1), lines.index(b"\n", at)
            sess.stray += begin - start
            start = end + 1
            msg = session_reply(lines[begin:end], sess.nonce, limit)
            if msg is not None:
                req = sess.pending
                self._answered(sess, msg)  # a next request may be in flight now, with a nonce of its own
                if sess.pending is not req:  # answered: what came before it was the call's, within its bound
                    sess.stray = 0
            else:
                sess.stray += end + 1 - begin
        if sess.sock is not sock:  # killed, or killed and forked afresh: the rest was the old process's
            return
        sess.stray += cut - start
        if not self._flooded(sess, limit):
            return
        if sess.pending is not None:
            self._tool_fault(sess, "the session process flooded its reply channel", "limit")
        else:  # no call in flight: tool code left writing (a thread), so its next call is the tool's `limit`
            self._kill(sess)
            sess.fault = ("the session process flooded its reply channel between calls; the session restarts from "
                          "its initial state")

    def _reply_limit(self, sess: Session) -> int:
        """The longest honest output of the request in flight: a state read back is the harness's and has its own."""
        state_read = sess.pending is not None and sess.pending.get("tool") == STATE_TOOL
        return int(self.limits["state_limit" if state_read else "output_limit"])

    @staticmethod
    def _flooded(sess: Session, limit: int) -> bool:
        """An honest reply is bounded by the output limit and is the only line: past this, tool code is writing.
        Between calls nothing is honest, and a thread left pouring is stopped at `IDLE_STRAY_BYTES`: at the bound
        for a call (2.3 MB) it had taken the worker's reads, and its neighbours' calls waited 2-8 ms beside it."""
        bound = 20 * limit + (1 << 20) if sess.pending is not None else IDLE_STRAY_BYTES
        return len(sess.rbuf) > bound or sess.stray > bound

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
            if "outcome" not in msg:
                sess.pending = req  # a readiness message during a call: not an answer
                return
            strays = self._strays(sess) if req.get("tool") != STATE_TOOL else 0
            if strays:  # a call's processes end with it: busy ones would take its neighbours' CPU (issue 35)
                sess.pending = req
                self._tool_fault(sess, f"the call returned while {_processes(strays)} it started kept running",
                                 "limit")
                return
            # a call that ran long leaves its session weighed down and on its cores until its next request is sent:
            # between calls a session has no work, and a thread its call left spinning gets no more
            if sess.pinned:
                self._keep_calm()  # its core is no longer kept clear for it (said before the reply: the pool's
                # thread has every core back by the time the caller sees the answer)
            self.reply({"id": req["id"], **msg})
        elif "ready" not in msg:
            sess.pending = req
            return
        elif msg["ready"] and (strays := self._strays(sess)):
            self._kill(sess)
            self._finish(sess, None, f"loading the tool code left {_processes(strays)} running", req)
            return
        elif msg["ready"]:
            if self.calm:
                self._keep_calm()  # off a busy session's core from its first call
            self.reply({"id": req["id"], "ok": True})
        else:
            self._kill(sess)
            self._finish(sess, None, msg.get("error") or "the tool code failed to load", req)
            return
        self._pump(sess)

    def _strays(self, sess: Session) -> int:
        return cgroups.strays(self.limits.get("cgroups") or {}, sess.uid, sess.pid)

    def _sweep_idle(self) -> None:
        """Tool code has no business running between calls: a session whose processes run on (started by a thread
        after its call returned), or whose process used more than IDLE_CPU_S of CPU (a thread left spinning), is
        ended like a flooding one, and its next call is that `limit`. Every STRAY_SWEEP_S: each idle session's group
        and its CPU clock (10 ms ticks)."""
        now = time.monotonic()
        if now < self.next_sweep:
            return
        self.next_sweep = now + STRAY_SWEEP_S
        for uid, (_, until) in list(self.dying_cores.items()):
            if until <= now:  # a process that will not die: its core is not kept clear for it any longer
                del self.dying_cores[uid]
        if self.calm:
            self._keep_calm()  # sessions started since the last change (they start on every core), or dying ones gone
        bases = self.limits.get("cgroups") or {}
        for uid in self.groups_to_remove:  # killed, and still there: a process the kill could not find is ended now
            cgroups.kill(bases, uid)
        for sess in list(self.sessions.values()):
            if sess.pending is not None or not sess.isolated or sess.sock is None:
                continue
            if strays := self._strays(sess):
                self._kill(sess)
                sess.fault = (f"{_processes(strays)} the session started kept running between calls; the session "
                              "restarts from its initial state")
                continue
            used = policy.cpu_seconds(sess.pid)
            if used is None:
                continue
            if sess.idle_cpu is None or sess.idle_cpu[0] != sess.serial:  # idle since a new request: counted from here
                sess.idle_cpu = (sess.serial, used)
            elif used - sess.idle_cpu[1] > IDLE_CPU_S:
                self._kill(sess)
                sess.fault = (f"the session used {used - sess.idle_cpu[1]:.2f} s of CPU between calls (tool code left "
                              f"running; at most {IDLE_CPU_S:g} s); the session restarts from its initial state")

    def _channel_closed(self, sess: Session) -> None:
        """The channel closed: wait briefly for the exit status that says why, no longer watching the channel. A
        closed channel is always readable: watched, the worker spun on it until the exit status came, 50 ms for a
        process freeing a 512 MB memfd as it died, and its neighbours' calls waited 2-5 ms beside it (issue 35)."""
        if sess.status is not None:
            self._died(sess)
        elif not sess.dying:
            self._forget_channel(sess)
            sess.dying = True
            sess.deadline = time.monotonic() + DEATH_GRACE_S
            heapq.heappush(self.deadlines, (sess.deadline, next(self.ticks), sess.serial, sess))

    def _exited(self, pid: int, status: int) -> None:
        sess = self.by_pid.pop(pid, None)
        if sess is not None and sess.pid == pid:
            sess.status = status
            self._died(sess)

    def _died(self, sess: Session) -> None:
        why = policy.describe_exit(sess.status, self.limits, sess.uid)
        own = policy.ended_itself(sess.status, self.limits, sess.uid)
        req = sess.pending
        self._kill(sess)
        if req is None and own:  # its own code or its own limits, between calls: the tool's, on its next call
            sess.fault = f"{why} between calls; the session restarts from its initial state"
            self._pump(sess)
        elif req is None:
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
            error = f"{why}; the session restarts from its initial state"
            self.reply({"id": req["id"], "outcome": outcome, "output": "", "error": error, "truncated": False})
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

    def _arm(self, sess: Session, req: dict, budget: float, cpu_only: bool = False) -> None:
        sess.pending, sess.serial, sess.stray = req, next(self.serials), 0
        sess.clock = RequestClock(budget, time.monotonic(), cpu_only)
        self._check_at(sess, sess.clock.first_check())
        first = PIN_AFTER_S if self._pinnable(sess) and self._few_sessions() else YIELD_AFTER_S
        heapq.heappush(self.yields, (sess.clock.started + first, next(self.ticks), sess.serial, sess))

    def _pinning(self) -> bool:
        return 0 < int(self.limits.get("busy_session_cores") or 0) < len(self.cores)

    def _pinnable(self, sess: Session) -> bool:
        """A call may pin its session; an open (a spare's too) only weighs less while it loads: a spare pinned as it
        loaded kept its core until its first call, and two busy calls beside it could tie for the other core."""
        return self._pinning() and sess.pending is not None and sess.pending.get("op") != "open"

    def _few_sessions(self) -> bool:
        """At most twice as many sessions as cores: a call still in flight at 1 ms is busy, not waiting for a core.
        With more, calls themselves wait milliseconds for one, and pinning each that did cost `bench sandbox`'s
        trivial calls/s @64 0.68x (process backend) and 0.86x (Docker); a look at each at 1 ms, 0.92x."""
        return len(self.sessions) <= 2 * len(self.cores)

    def _look_at_long_request(self, sess: Session, serial: int, now: float) -> None:
        """A request still in flight at `PIN_AFTER_S` on a worker of few sessions, else at `YIELD_AFTER_S`, and then
        at five times as long each time until its session is pinned. On a worker of few sessions it is pinned and
        weighs less at once; on a busy worker, if its session runs several tasks (one read: a single task holds one
        core at most), and otherwise it only weighs less, from `YIELD_AFTER_S`. Looked at again: a session that waited
        for a core from the start forks only once it runs."""
        bases = self.limits.get("cgroups") or {}
        elapsed = now - sess.clock.started
        if self._pinnable(sess) and (self._few_sessions() or cgroups.tasks(bases, sess.uid) > 1):
            sess.pinned = self._quietest_cores(int(self.limits["busy_session_cores"]))
            self._lighten(sess)
            self._keep_calm()
            return
        if elapsed >= YIELD_AFTER_S:
            self._lighten(sess)
        if self._pinnable(sess) or not sess.yielding:
            later = sess.clock.started + max(YIELD_AFTER_S, 5 * elapsed)
            heapq.heappush(self.yields, (later, next(self.ticks), serial, sess))

    def _lighten(self, sess: Session) -> None:
        if not sess.yielding:
            sess.yielding = True
            cgroups.weigh(self.limits.get("cgroups") or {}, sess.uid, True)

    def _restore(self, sess: Session) -> None:
        """Its worker's weight and every core again (the calm ones while another session is pinned: `_keep_calm`);
        cgroup writes only where they changed (a call answered before it was looked at, nearly all of them, costs
        none)."""
        bases = self.limits.get("cgroups") or {}
        if sess.yielding:
            sess.yielding = False
            cgroups.weigh(bases, sess.uid, False)
        if sess.pinned:
            sess.pinned = []
            self._keep_calm()

    def _keep_calm(self) -> None:
        """Each session on its cores, and everything else off the busy ones: while a pinned session's call runs, the
        worker and every other session run on the cores no such call holds, and the pool is told which, so that its
        thread does too; every core again once none runs. Why: a busy session's processes spend much of their time
        in the kernel (forking, faulting, creating files), where this kernel (`PREEMPT_NONE`) does not preempt them,
        so a hop of a neighbour's call woken onto their core waited there, 1-4 ms; kept off it, none does
        (docs/SANDBOX.md, "A busy session's core is its own"). A session that answered keeps its pin until its next
        request, but no core is kept clear for it: an idle session would otherwise take a core from all the others
        for as long as it waits. Where every core runs a pinned call, nothing is kept off any. cpuset writes only
        where a session's cores change."""
        busy = {core for s in self.sessions.values() if s.pending is not None for core in s.pinned}
        busy.update(core for cores, _ in self.dying_cores.values() for core in cores)
        calm = [core for core in self.cores if core not in busy] if busy else []
        bases = self.limits.get("cgroups") or {}
        for sess in self.sessions.values():
            if sess.uid and sess.held != (cores := sess.pinned or calm):
                cgroups.pin(bases, sess.uid, cores)
                sess.held = cores
        if calm != self.calm:
            self.calm = calm
            try:
                os.sched_setaffinity(0, calm or self.cores)
            except OSError:  # a core taken from this worker's cpuset meanwhile: the next change tries again
                pass
            self.notify({"calm": calm})

    def _quietest_cores(self, wanted: int) -> list[int]:
        """The `wanted` cores the fewest of this worker's sessions are pinned to; ties in an order of this worker's
        own, so the first busy sessions of several workers spread over the host."""
        pinned = Counter(core for s in self.sessions.values() for core in s.pinned)
        n = len(self.cores)
        order = [self.cores[(self.core_offset + i) % n] for i in range(n)]
        return sorted(sorted(order, key=lambda core: pinned[core])[:wanted])

    def _yield_long_requests(self, now: float) -> None:
        while self.yields and self.yields[0][0] <= now:
            entry = heapq.heappop(self.yields)
            if not self._answered_since(entry) and not entry[3].pinned:
                self._look_at_long_request(entry[3], entry[2], now)

    def _answered_since(self, entry: tuple) -> bool:
        _, _, serial, sess = entry
        return sess.pending is None or sess.serial != serial or self.sessions.get(sess.sid) is not sess

    def _check_at(self, sess: Session, when: float) -> None:
        sess.deadline = when
        heapq.heappush(self.deadlines, (when, next(self.ticks), sess.serial, sess))

    def _stale(self, entry: tuple) -> bool:
        deadline, _, serial, sess = entry
        return (sess.pending is None and not sess.dying) or sess.serial != serial or sess.deadline != deadline \
            or self.sessions.get(sess.sid) is not sess

    def _next_timeout(self) -> float:
        while self.deadlines and self._stale(self.deadlines[0]):
            heapq.heappop(self.deadlines)
        wake = min(self.deadlines[0][0], self.next_sweep) if self.deadlines else self.next_sweep
        if not self.sessions:
            wake = self.deadlines[0][0] if self.deadlines else time.monotonic() + 1.0
        while self.yields and self._answered_since(self.yields[0]):
            heapq.heappop(self.yields)
        if self.yields:
            wake = min(wake, self.yields[0][0])
        if self.groups_to_remove:
            wake = min(wake, self.next_removal)
        return max(0.0, min(wake - time.monotonic(), 1.0))  # at least once a second, and for each sweep

    def _expire(self) -> None:
        now = time.monotonic()
        self._yield_long_requests(now)
        while self.deadlines and self.deadlines[0][0] <= now:
            entry = heapq.heappop(self.deadlines)
            if self._stale(entry):
                continue
            sess = entry[3]
            if sess.dying:
                self._died(sess)
                continue
            clock, stretch = sess.clock, float(self.limits["load_stretch"])
            clock.sample(sess.pid, now)
            verdict = clock.verdict(now, stretch)
            if verdict is None:
                self._check_at(sess, clock.next_check(now, stretch))
            elif verdict == "overloaded":
                self._kill(sess)
                self._finish(sess, "overloaded", f"the sandbox is overloaded: the session got {clock.ran:.2f} s of CPU "
                             f"in {now - clock.started:.1f} s; its state is discarded")
            elif sess.pending["op"] == "open":
                self._kill(sess)
                self._finish(sess, None, f"TimeoutError: loading the tool code took more than {clock.budget:g} s")
            else:
                self._tool_fault(sess, f"the call exceeded its {clock.budget:g} s time limit", "timeout")

    def _kill(self, sess: Session) -> None:
        """Kill every process of the session and forget its channel (its state is gone)."""
        self._forget_channel(sess)
        pid, sess.pid, sess.dying = sess.pid, 0, False
        pinned, sess.yielding, sess.pinned, sess.held = sess.pinned, False, [], []  # its groups go with its uid
        self.by_pid.pop(pid, None)
        fallback_scratch = None if self.limits["namespaces"] else sess.scratch
        if sess.uid:
            if pinned:
                self.dying_cores[sess.uid] = (pinned, time.monotonic() + DYING_CALM_S)
            bases = self.limits.get("cgroups") or {}
            if pid and not fallback_scratch and cgroups.kill(bases, sess.uid):
                policy.kill_group(pid)  # just forked, it may not be in its group yet: its own process, by pid
                self.groups_to_remove.add(sess.uid)  # the uid is free once its group is gone (`_remove_groups`)
            else:  # no pid yet, no group that lists its processes, or its scratch is removed as its own
                self._kill_helper(sess.uid, fallback_scratch)
            sess.uid = 0
        elif pid:
            policy.kill_group(pid)
            if fallback_scratch:
                shutil.rmtree(fallback_scratch, ignore_errors=True)
        if pinned:
            self._keep_calm()  # no claim on a core is left behind

    def _kill_helper(self, uid: int, scratch: str | None) -> None:
        """Fork a helper that kills every process of `uid` as that uid (`policy.kill_uid`); the uid is free once the
        helper is done and its groups are gone."""
        self.helpers[policy.kill_uid(uid, scratch, self.limits.get("cgroups"))] = uid
        self.helpers_forked += 1

    def _forget_channel(self, sess: Session) -> None:
        if sess.sock is not None:
            self.sel.unregister(sess.sock)
            sess.sock.close()
            sess.sock = None


IDLE_STRAY_BYTES = 1 << 16  # what a session may write into its channel between calls before it is stopped


def _processes(n: int) -> str:
    return f"{n} process{'es' if n > 1 else ''}"


def _nonce() -> int:
    return int.from_bytes(os.urandom(8), "little") >> 2  # unguessable by the tool: a fresh one per request
