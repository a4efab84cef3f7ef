"""A template's zygote: one environment version, parsed once, from which its sessions are forked.

The worker forks one zygote per loaded template (content-addressed by the pool). The zygote parses
the environment payload it inherited (code, shape, initial state), freezes the garbage collector on
it (so the sessions' collections never touch, hence never copy, the state's pages), and then forks
one session process per `spawn`: a copy-on-write snapshot of the parsed state, ready in about a
millisecond whatever the state's size. The zygote runs only this trusted code, as root; tool code
runs only in the sessions, after `policy.isolate`.

Control socket (SOCK_SEQPACKET, one JSON message per packet), worker -> zygote:
    {"sid", "uid", "scratch", "nonce", "serial"} + the session's channel as an SCM_RIGHTS descriptor
zygote -> worker:
    {"ready": true, "rss_kb"} | {"ready": false, "error"} | {"spawned": sid, "serial", "pid"}
    | {"spawn_failed": sid, "serial", "error"} | {"exit": pid, "status"}
When the worker closes the socket the zygote stops spawning and exits once its sessions are gone.
"""

import gc
import json
import os
import resource
import selectors
import signal
import socket
import sys
import traceback
from collections.abc import Callable

from . import execution, policy
from .protocol import MAX_HEADER, clean, encode

MAX_FD = 4096


def _close_fds_except(*keep: int) -> None:
    top = max(min(resource.getrlimit(resource.RLIMIT_NOFILE)[0], 1 << 16), MAX_FD)
    low = 3
    for fd in sorted(keep):
        os.closerange(low, fd)
        low = fd + 1
    os.closerange(low, top)


def start(payload: bytes, limits: dict, forget: Callable[[], None]) -> tuple[int, socket.socket]:
    """Fork the zygote of `payload`; returns its pid and the worker's end of its control socket."""
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        try:
            ours.close()
            forget()  # other templates' and sessions' bytes must not reach this template's sessions
            _main(theirs, payload, dict(limits))
        finally:
            os._exit(70)
    theirs.close()
    return pid, ours


def _send(ctl: socket.socket, msg: dict) -> bool:
    try:
        ctl.send(encode(msg))
        return True
    except OSError:  # the worker is gone or closed us: nothing to tell
        return False


def _main(ctl: socket.socket, payload: bytes, limits: dict) -> None:
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    _close_fds_except(ctl.fileno())
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)
    try:
        template = json.loads(payload)
        if not isinstance(template, dict) or not isinstance(template.get("code"), str):
            raise ValueError("the payload is not an environment template")
    except (ValueError, RecursionError, MemoryError) as err:
        _send(ctl, {"ready": False, "error": f"the environment payload could not be parsed: {err}"})
        os._exit(0)
    del payload
    # compiling runs none of the code: done once here, each session only executes it
    for spec, file in [(template, execution.TOOLS_FILE)] + [(m, f"{m.get('name')}.py") for m in template.get("modules") or []
                                                             if isinstance(m, dict) and isinstance(m.get("code"), str)]:
        try:
            spec["compiled"] = compile(spec["code"], file, "exec", dont_inherit=True)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            pass  # the session compiles again and reports the error as the tool code's
    policy.warm_up()
    gc.collect()
    gc.freeze()  # sessions' collections skip the state: no copy-on-write of its pages
    _send(ctl, {"ready": True, "rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss})
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.set_wakeup_fd(wake_w)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so SIGCHLD reaches the wakeup fd
    sel = selectors.DefaultSelector()
    sel.register(ctl, selectors.EVENT_READ)
    sel.register(wake_r, selectors.EVENT_READ)
    children: set[int] = set()
    listening = True
    while listening or children:
        for key, _ in sel.select(1.0):
            if key.fileobj is not ctl:
                os.read(wake_r, 4096)
                continue
            try:
                data, fds, _, _ = socket.recv_fds(ctl, MAX_HEADER, 1)
            except OSError:
                data, fds = b"", []
            if not data:
                listening = False
                sel.unregister(ctl)
                continue
            spec = json.loads(data)
            if not fds:
                continue
            pid = _spawn(fds[0], template, limits, spec, (ctl.fileno(), wake_r, wake_w, sel))
            os.close(fds[0])
            if isinstance(pid, int):
                children.add(pid)
                listening = _send(ctl, {"spawned": spec["sid"], "serial": spec["serial"], "pid": pid, "uid": spec["uid"]}) and listening
            else:
                _send(ctl, {"spawn_failed": spec["sid"], "serial": spec["serial"], "error": pid})
        while children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                children.clear()
                break
            if pid == 0:
                break
            children.discard(pid)
            if listening:
                _send(ctl, {"exit": pid, "status": status})
    os._exit(0)


def _spawn(fd: int, template: dict, limits: dict, spec: dict, inherited: tuple) -> int | str:
    """Fork one session process on channel `fd`; its pid, or why it could not be forked."""
    try:
        pid = os.fork()
    except OSError as err:
        return f"cannot fork a session process: {err}"
    if pid:
        return pid
    try:  # ---- the session process
        ctl_fd, wake_r, wake_w, sel = inherited
        signal.set_wakeup_fd(-1)
        signal.signal(signal.SIGCHLD, signal.SIG_DFL)
        signal.signal(signal.SIGPIPE, signal.SIG_DFL)
        sel.close()
        for other in (ctl_fd, wake_r, wake_w):
            os.close(other)
        conn = socket.socket(fileno=fd)
        _close_fds_except(conn.fileno())  # nothing but its own channel: no other session's, no worker's
        try:
            sys.path[:0] = policy.isolate(int(spec["uid"]), limits, spec["scratch"], template.get("paths") or ())
        except BaseException as err:  # noqa: BLE001 - reported as the sandbox's failure, before any tool code ran
            detail = "".join(traceback.format_exception_only(type(err), err)).strip()
            conn.sendall(encode({"nonce": spec["nonce"], "failure": "isolation", "error": clean(detail, 2000)[0]}))
            os._exit(0)
        conn.sendall(encode({"nonce": spec["nonce"], "isolated": True}))  # the last message before tool code runs
        template = dict(template, nonce=spec["nonce"])
        execution.serve(conn, template, int(limits["output_limit"]), int(limits["state_limit"]))
    finally:
        os._exit(70)
