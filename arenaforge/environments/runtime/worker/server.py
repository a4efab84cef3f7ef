"""The worker's event loop: requests from the pool on stdin, replies on stdout, one zygote per template.

On Docker with a local engine, stdin and stdout are a Unix socket the pool listens on (`connect_channel`), not the
engine's attach stream.

What it owns: reading and answering the pool's ops (hello, ping, load, unload, open, call, close),
starting a zygote for each environment version it is asked to load and routing its messages. The
life of each session (spawn, queue, deadlines, death) is `sessions.SessionServer`, which `Server`
extends; the wire format is `protocol`, confinement `policy`, tool code `execution`.
"""

import json
import os
import select
import selectors
import signal
import socket
import sys
import time

from . import cgroups, execution, policy, zygote
from .protocol import MAX_HEADER, Reader, encode
from .sessions import REMOVE_EVERY_S, Session, SessionServer

LIMITS = {
    "memory_mb": 512,  # RLIMIT_AS per session process
    "pids": 64,  # RLIMIT_NPROC per session uid
    "cpu_s": 60,  # RLIMIT_CPU per session process
    "output_limit": 65536,  # bytes of output / error text per call
    "state_limit": 16 << 20,  # bytes of a state read back (the harness's, not the agent's)
    "message_limit": 4 << 20,  # bytes of arguments per call
    "open_timeout_s": 10.0,
    "scratch_root": "/tmp",
    "scratch_mb": 64,  # size of each session's private /tmp and /dev/shm
    "scratch_files": 8192,  # inodes of each (400,000 empty files held ~400 MB of kernel memory)
    "uid_base": 0,  # 0: do not switch uid
    "uid_slots": 4096,
    "unshare_net": False,
    "hide_paths": [],
    "spares": 1,  # sessions kept ready ahead of opens, per template opened more than once
    "bind_shared": False,  # process backend: bind a template's requirement directories into each session (policy)
    "namespaces": False,  # set by the hello probe: private mounts/IPC/network per session work here
    "seccomp": False,
    "load_stretch": 4.0,  # a request starved of CPU may take this many times its limit
    "cgroups_wanted": ["memory", "pids", "cpu"],  # a group per session for each, where the worker can make them
    "busy_session_cores": 0,  # cores a session runs on while its request runs long (0: all of its worker's)
    "session_cpu_share": 0.5,  # of the worker's CPU quota, one session's cap (`sandbox.session_cpu_share`)
    "session_cpu_quota_us": 0,  # set at hello (`cgroups.session_cpu_quota`): 0, no cap
}


class Server(SessionServer):
    def __init__(self, group: str, channel: str = "stdio") -> None:
        super().__init__()
        self.group = group  # this worker's cgroup name (`cgroups.setup`)
        self.limits = dict(LIMITS)
        self.info_extra: dict = {"net_isolated": False, "namespaces": False, "seccomp": False, "channel": channel}
        self.reader = Reader(1 << 31)
        self.outq: list[bytes] = []
        self.topped_up = ""  # the template whose spares were last topped up (only it keeps more than one)

    # ---------------------------------------------------------------- loop and plumbing
    def run(self) -> None:
        os.set_blocking(0, False)
        self.sel.register(0, selectors.EVENT_READ, None)
        while True:
            for key, events in self.sel.select(self._next_timeout()):
                if self._gone(key):
                    continue
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
            self._sweep_idle()
            self._flush()

    def _gone(self, key: selectors.SelectorKey) -> bool:
        """Whether `key`'s file was unregistered (and closed) by an event handled earlier in the same turn, e.g. a
        zygote's channel by an `unload`: its event is stale, and handling it would touch a closed socket. Skipping a
        live one (its fd number reused meanwhile) costs nothing: readiness is level-triggered, the next turn has it."""
        current = self.sel.get_map().get(key.fd)
        return current is None or current.fileobj is not key.fileobj

    def reply(self, msg: dict) -> None:
        if msg.get("id") is not None:
            self.outq.append(encode(msg))

    def notify(self, msg: dict) -> None:
        self.outq.append(encode(msg))

    def _flush(self) -> None:
        """Replies of one loop turn leave in one write."""
        if self.outq:
            view, self.outq = memoryview(b"".join(self.outq)), []
            while view:
                try:
                    view = view[os.write(1, view):]
                except BlockingIOError:  # a channel socket is stdin too, and stdin is non-blocking (`run`)
                    select.select([], [1], [])

    def forget(self) -> None:
        """In a fresh zygote: drop every reference to other templates' and sessions' data."""
        self.sel.close()
        self.sessions.clear()
        self.by_pid.clear()
        self.templates.clear()
        self.spawning.clear()
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
                for spare in template["spares"]:
                    self._drop(spare)
                self.sel.unregister(template["ctl"])
                template["ctl"].close()  # the zygote exits once its last session is gone
            self.reply({"id": rid, "ok": True})
        elif op == "hello":
            self.limits.update(req.get("limits") or {})
            if self.limits["unshare_net"]:
                policy.unshare_net(self.is_root)
            self.info_extra["net_isolated"] = policy.net_isolated()
            self.info_extra.update(policy.probe(self.limits))
            self.limits.update({k: self.info_extra[k] for k in ("namespaces", "seccomp")})
            if self.is_root and self.limits["uid_base"]:
                bases, why = cgroups.setup(self.group, self.limits["scratch_root"], tuple(self.limits["cgroups_wanted"]))
            else:
                bases, why = {}, "sessions do not get uids of their own"
            self.limits["cgroups"] = bases
            try:
                self.cores = cgroups.cores(bases)
            except (OSError, ValueError):
                self.cores = []
            share = float(self.limits["session_cpu_share"])
            self.limits["session_cpu_quota_us"] = cgroups.session_cpu_quota(bases, share)
            self.info_extra.update({"cgroups": sorted(bases), "cgroups_missing": why, "cgroup_name": self.group,
                                    "session_cpu_quota_us": self.limits["session_cpu_quota_us"]})
            self.reply({"id": rid, "ok": True, "info": self._info()})
        elif op == "ping":
            self.reply({"id": rid, "ok": True, "info": self._info()})
        else:
            self.reply({"id": rid, "ok": False, "error": f"unknown op {op!r}"})

    def _info(self) -> dict:
        sessions = sum(not s.spare for s in self.sessions.values())
        spares = [s for s in self.sessions.values() if s.spare]
        ready = sum(s.isolated and s.pending is None for s in spares)
        return {"pid": os.getpid(), "uid": os.geteuid(), "sessions": sessions, "spares": len(spares), "spares_ready": ready,
                "templates": len(self.templates),
                # sessions held to fewer cores while (or since) a call ran long (`sessions._look_at_long_request`)
                "pinned": {s.sid: s.pinned for s in self.sessions.values() if s.pinned},
                "calm": self.calm,  # where the worker and its other sessions run meanwhile (`sessions._keep_calm`)
                "cpu_s": time.process_time(),  # the worker's own: what reading its sessions' channels costs it
                "kill_helpers": self.helpers_forked,  # forked to end sessions that had no pids group to list them
                "setuid": bool(self.is_root and self.limits["uid_base"]), "python": sys.version.split()[0],
                "group_throttled": cgroups.throttled(self.limits.get("cgroups") or {}), **self.info_extra}

    # ---------------------------------------------------------------- templates and opens
    def _load(self, req: dict, body: bytes) -> None:
        key = req["key"]
        template = self.templates.get(key)
        if template is None:
            pid, ctl = zygote.start(body, self.limits, self.forget)
            template = self.templates[key] = {"key": key, "pid": pid, "ctl": ctl, "ready": False, "waiting": [],
                                              "opens": 0, "spares": []}
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
            for serial, sess in list(self.spawning.items()):
                if sess.key == template["key"]:
                    del self.spawning[serial]
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
            sess = self.spawning.pop(msg.get("serial"), None)
            if sess is None or self.sessions.get(sess.sid) is not sess or sess.spawn != msg.get("serial"):
                # closed (or forked again) meanwhile: make sure that process is gone
                if msg.get("pid"):
                    policy.kill_group(msg["pid"])
                if msg.get("uid"):
                    self.uids_used.add(msg["uid"])
                    self._kill_helper(msg["uid"], None)
                return
            if "pid" in msg:
                sess.pid = msg["pid"]
                self.by_pid[sess.pid] = sess
            else:
                self._kill(sess)
                self._finish(sess, "spawn", msg.get("error") or "the session could not be forked")

    def _open(self, req: dict) -> None:
        sid, key = req["sid"], req["key"]
        template = self.templates.get(key)
        if sid in self.sessions:
            self.reply({"id": req["id"], "ok": False, "failure": "spawn", "error": "the session exists"})
        elif template is None or not template["ready"]:
            self.reply({"id": req["id"], "ok": False, "missing": True, "error": "the template is not loaded"})
        else:
            spare = self._take_spare(template)
            if spare is not None:
                del self.sessions[spare.sid]  # the open is a hand-over: answered now, or when the spare is ready
                spare.sid, spare.spare = sid, False
                self.sessions[sid] = spare
                if spare.pending is None:
                    self.reply({"id": req["id"], "ok": True})
                else:
                    spare.pending["id"] = req["id"]
            else:
                sess = self.sessions[sid] = Session(sid, key)
                sess.queue.append(({"id": req["id"], "op": "open"}, b""))
                self._pump(sess)
            template["opens"] += 1
            if template["opens"] >= 2:  # a version opened again will be again: have the next ones ready
                self._top_up(template)

    def _top_up(self, template: dict) -> None:
        """Spares for the version opened last, one more per open up to `spares` (a version opened twice gets one, as
        many are, so no fork is wasted on it); every other version keeps one (idle processes cost memory)."""
        previous = self.templates.get(self.topped_up) if self.topped_up != template["key"] else None
        if previous is not None and len(previous["spares"]) > 1:
            keep = sorted(previous["spares"], key=lambda s: s.pending is not None)  # a ready one first
            previous["spares"] = keep[:1]
            for extra in keep[1:]:
                self._drop(extra)
        self.topped_up = template["key"]
        while len(template["spares"]) < min(int(self.limits["spares"]), template["opens"] - 1):
            self._prepare_spare(template)

    def _take_spare(self, template: dict) -> Session | None:
        """A ready spare, else the one forked first (its open is answered once it is ready); dead ones are dropped.
        Several are kept because opens back to back use them up faster than one is forked, confined and loaded."""
        alive = []
        for spare in template["spares"]:
            if spare.sock is not None and not spare.lost and not spare.queue:
                alive.append(spare)
            else:
                self._drop(spare)
        ready = [s for s in alive if s.pending is None]
        chosen = (ready or alive or [None])[0]
        template["spares"] = [s for s in alive if s is not chosen]
        return chosen

    def _prepare_spare(self, template: dict) -> None:
        """Fork, confine and load one session ahead of its open (it gets a real id when one comes)."""
        sess = Session(f"~spare-{next(self.serials)}", template["key"])
        sess.spare = True
        self.sessions[sess.sid] = sess
        template["spares"].append(sess)
        sess.queue.append(({"id": None, "op": "open"}, b""))
        self._pump(sess)

    def _drop(self, sess: Session) -> None:
        if self.sessions.get(sess.sid) is sess:
            del self.sessions[sess.sid]
        self._kill(sess)

    def _reap(self) -> None:
        """Kill helpers, zygotes, and session processes orphaned by a zygote's death."""
        self._reap_children()
        self._remove_groups()

    def _reap_children(self) -> None:
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            if pid in self.helpers:
                self.groups_to_remove.add(self.helpers.pop(pid))
            else:
                self._exited(pid, status)

    def _remove_groups(self) -> None:
        """A uid is free again once its processes are gone and so is its cgroup (its counts start from zero). Tried
        every `REMOVE_EVERY_S`, not on every turn of the loop: a try is an rmdir per controller, 0.15 ms of a turn
        that a neighbour's reply may wait on, and a killed fork bomb's processes take tens of milliseconds to die."""
        now = time.monotonic()
        if not self.groups_to_remove or now < self.next_removal:
            return
        self.next_removal = now + REMOVE_EVERY_S
        for uid in list(self.groups_to_remove):
            if cgroups.remove(self.limits.get("cgroups") or {}, uid):
                self.groups_to_remove.discard(uid)
                self.uids_used.discard(uid)
                if self.dying_cores.pop(uid, None):
                    self._keep_calm()  # its processes are gone: its core is free for the others again

    def _shutdown(self) -> None:
        self._flush()
        for sess in list(self.sessions.values()):
            self._kill(sess)
        os._exit(0)


CHANNEL_ENV = "ARENAFORGE_CHANNEL"  # set by the Docker backend: the path of the pool's socket in this container
TOKEN_ENV = "ARENAFORGE_CHANNEL_TOKEN"  # and what to present on it (the pool takes no other connection)


def connect_channel() -> str:
    """Docker, local engine: connect to the pool's socket (a directory of the host's bind-mounted here, removed
    once this connection is accepted) and make it stdin and stdout. Every request and reply then skips the engine
    and the container's shim, two processes each way (docker_backend.py). It presents the token the pool gave
    it, since others may connect too. Where it cannot be reached, one line on stdout says so, and the pool talks
    through the attach stream instead. Returns what the worker reports as its `channel` (`arenaforge sandbox
    status`): "socket", or "stdio" and why not."""
    path, token = os.environ.pop(CHANNEL_ENV, ""), os.environ.pop(TOKEN_ENV, "")
    if not path:
        return "stdio"
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as channel:
            channel.connect(path)
            channel.sendall(token.encode() + b"\n")
            os.dup2(channel.fileno(), 0)
            os.dup2(channel.fileno(), 1)
    except OSError as err:
        os.write(1, encode({"channel": "stdio", "error": str(err)}))  # an OS message: plain text
        return f"stdio (the pool's socket: {err})"
    return "socket"


def main() -> None:
    if "--once" in sys.argv:
        execution.run_once()
        return
    channel = connect_channel()
    import ctypes

    try:
        ctypes.CDLL(None).prctl(policy.PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # die with the pool
    except (OSError, AttributeError):
        pass
    policy.leave_terminal()
    group = f"{cgroups.PREFIX}{os.getpid()}"  # the pid the pool knows (outside the PID namespace): unique on the host
    policy.own_pid_namespace()
    policy.wake_preempting()
    policy.become_subreaper()
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    Server(group, channel).run()
