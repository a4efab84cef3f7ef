"""The pool's thread off the cores its workers' busy sessions hold.

A worker that pins a session whose call runs long to one core runs itself and its other sessions on the cores left,
and says which (`{"calm": [cores]}`, `worker/sessions.py`, `_keep_calm`). The pool's thread is the first and last hop
of every call, so it keeps to those cores as well, until no worker of this process holds one. A busy session's
processes spend much of their time in the kernel (forking, faulting pages, making files), where this kernel does not
preempt them, and a hop woken onto their core waited there 1-4 ms (docs/SANDBOX.md, "A busy session's core is its
own"). Only where a worker's cores are this host's: the process backend, a Docker engine on this Linux host
(`Transport.shares_host_cores`). Threads started by a held thread inherit its cores; they get every core back with it.
"""

from __future__ import annotations

import os
import threading

_lock = threading.Lock()
_calm: dict[int, set[int]] = {}  # id of a worker connection -> the cores it keeps calm, while it keeps any
_every: set[int] | None = None  # this process's cores before any was kept off
_given: set[int] | None = None  # the cores last given to the held threads (None: every core)


def keep_calm(worker: object, cores: list[int]) -> None:
    """`worker` now keeps `cores` calm ([]: none, it holds no core): this thread runs on the cores every such worker
    of this process keeps calm, or on every core where they have none in common."""
    with _lock:
        if cores:
            _calm[id(worker)] = set(cores)
        else:
            _calm.pop(id(worker), None)
        _apply()


def forget(worker: object) -> None:
    """A worker is gone: it keeps nothing calm any more."""
    with _lock:
        if _calm.pop(id(worker), None) is not None:
            _apply()


def _apply() -> None:
    global _every, _given
    if _every is None:
        _every = os.sched_getaffinity(0)
    want = set(_every)
    for cores in _calm.values():
        want &= cores
    want = want if _calm and want else None
    if want == _given:
        return
    threads = {threading.get_native_id()}
    if _given is not None:  # and every thread holding the cores given last: threads started meanwhile
        threads |= {tid for tid in _threads() if _affinity(tid) == _given}
    for tid in threads:
        try:
            os.sched_setaffinity(tid, want or _every)
        except OSError:  # gone meanwhile, or a core taken from this process's cpuset: left as it is
            pass
    _given = want


def _threads() -> list[int]:
    try:
        return [int(tid) for tid in os.listdir("/proc/self/task")]
    except OSError:
        return []


def _affinity(tid: int) -> set[int] | None:
    try:
        return os.sched_getaffinity(tid)
    except OSError:
        return None
