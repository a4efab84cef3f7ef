"""A throwaway second Docker engine: its own socket, data root and exec root, removed with everything it made.

Needs root (as the default engine does). The default engine is never touched.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from arenaforge.environments.runtime.docker_backend import docker_engine_answers
from tests.support.requirements import skip_or_fail

START_DEADLINE_S = 120


@dataclass
class SecondEngine:
    url: str
    root: Path
    proc: subprocess.Popen[bytes]

    def kill(self) -> None:
        """SIGKILL the daemon, then what its containers run, as a host going down would. (The daemon alone is not the
        loss of a host: the pool talks to a local engine's workers over sockets of its own, so their containers live
        on without it and keep answering.)"""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(30)
        for pid in reversed(_processes_under(self.root)):  # children before their shim
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@contextlib.contextmanager
def second_dockerd() -> Iterator[SecondEngine]:
    """Start `dockerd` on a socket of its own and wait until it answers; on exit remove its containers, mounts,
    directories and cgroups (its containers' groups are under a parent group of its own)."""
    if os.geteuid() != 0 or shutil.which("dockerd") is None:
        skip_or_fail("a second Docker engine needs root and dockerd")
    root = Path(tempfile.mkdtemp(prefix="af-dockerd-", dir="/tmp"))  # short: a unix socket path has 107 bytes
    url = f"unix://{root}/docker.sock"
    log = (root / "dockerd.log").open("wb")
    proc = subprocess.Popen(
        ["dockerd", "--bridge=none", "--iptables=false", "--ip6tables=false", "--host", url,
         "--data-root", str(root / "data"), "--exec-root", str(root / "exec"), "--pidfile", str(root / "docker.pid"),
         # its containers' groups under a parent of its own (a path: the cgroupfs driver, whatever the host's
         # daemon.json says), so that what it leaves when it is killed can be found and removed
         "--exec-opt", "native.cgroupdriver=cgroupfs", "--cgroup-parent", f"/{root.name}"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )
    engine = SecondEngine(url, root, proc)
    try:
        deadline = time.monotonic() + START_DEADLINE_S
        while not docker_engine_answers(url):
            if proc.poll() is not None or time.monotonic() > deadline:
                tail = (root / "dockerd.log").read_text(errors="replace")[-2000:]
                raise RuntimeError(f"the second dockerd did not come up (exit {proc.poll()}): {tail}")
            time.sleep(0.2)  # polling the condition (the engine answers), not a timed wait
        yield engine
    finally:
        engine.kill()
        log.close()
        _remove_leftovers(root)


def _processes_under(root: Path) -> list[int]:
    """Containerd shims of this engine (their command line names its exec root), then everything below them."""
    shims = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if b"containerd-shim" in cmdline and str(root).encode() in cmdline:
                shims.append(int(entry.name))
    found = list(shims)
    for pid in shims:
        found += _descendants(pid)
    return found


def _descendants(pid: int) -> list[int]:
    out = []
    children = Path(f"/proc/{pid}/task/{pid}/children")
    try:
        kids = [int(x) for x in children.read_text().split()]
    except OSError:
        return out
    for kid in kids:
        out += [kid, *_descendants(kid)]
    return out


def _remove_leftovers(root: Path) -> None:  # after `kill`
    mounts = [line.split()[1] for line in Path("/proc/self/mounts").read_text().splitlines()]
    for mount in sorted((m for m in mounts if m.startswith(str(root))), reverse=True):
        subprocess.run(["umount", "-l", mount], check=False, capture_output=True)
    shutil.rmtree(root, ignore_errors=True)
    # With its engine killed nothing removes a container's cgroups (the worker's and its sessions' groups inside
    # them): each stayed on the host, holding kernel memory, until it rebooted.
    for hierarchy in _cgroup_hierarchies():
        _remove_cgroup(hierarchy / root.name)


def _cgroup_hierarchies() -> set[Path]:
    """Where each cgroup hierarchy's root is mounted (v1, and v2 beside it or alone)."""
    found = set()
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        head, _, tail = line.partition(" - ")
        fields, fstype = head.split(), tail.split()[:1]
        if fstype in (["cgroup"], ["cgroup2"]) and fields[3] == "/":
            found.add(Path(fields[4]))
    return found


def _remove_cgroup(top: Path) -> None:
    """Remove `top` and the groups inside it, innermost first, once the processes killed in them have exited."""
    deadline = time.monotonic() + START_DEADLINE_S
    for where, _, _ in os.walk(top, topdown=False):  # a group before the one holding it
        while True:
            try:
                os.rmdir(where)
                break
            except FileNotFoundError:
                break
            except OSError:  # EBUSY: a process killed above has not exited yet
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)  # polling the condition (the group is empty), not a timed wait
