"""The sandbox policy of one session process, applied before any tool code runs; and its teardown.

A session process starts as a root fork (of its template's zygote) and, in this order:
  0. joins its own cgroup, where the worker has them (`cgroups`): memory, processes, an equal CPU share and,
     inside a container, at most half of the container's CPU quota;
  1. leaves the worker's mount and IPC namespaces: a private tmpfs on /tmp, /dev/shm and /var/tmp,
     capped in size and in files (its scratch space, gone with it), host paths hidden on the process
     backend (its template's requirement directories bound back read-only under /tmp), no SysV/POSIX
     IPC shared with other sessions (its own /dev/mqueue);
  2. drops to its own uid (random in the worker's range), no capabilities;
  3. gets rlimits (address space, CPU seconds, processes and message-queue bytes of its uid, no core dumps);
  4. sets no-new-privileges and a seccomp filter that refuses sockets (no network, no loopback or
     abstract-socket channel to another session) and namespace, mount, ptrace, bpf, keyring,
     io_uring and module syscalls (so it cannot undo 1-2 with what the container allows);
  5. dies with its zygote (parent-death signal), runs in its scratch dir with an empty environment.
Where namespaces are not permitted (the process backend without root or user namespaces) it
falls back to an exclusively created, unguessable scratch dir and says so in the worker's info.
Teardown is `kill_uid`: a helper running as the session's uid kills every process of that uid.
"""

import ctypes
import functools
import os
import resource
import shutil
import signal
import struct

from . import cgroups

CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWNET = 0x20000, 0x08000000, 0x40000000
CLONE_NEWUSER, CLONE_NEWPID = 0x10000000, 0x20000000
NAMESPACE_FLAGS = 0x7E020080  # every CLONE_NEW* flag (cgroup, uts, ipc, user, pid, net, mount, time)
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 1, 2, 4, 8, 16384, 1 << 18
MS_REMOUNT, MS_BIND = 32, 4096
SHARED_MOUNT = "/tmp/.site-{}"  # where a session sees the i-th read-only directory its template shares (requirements)
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, PR_SET_CHILD_SUBREAPER = 1, 38, 22, 36
PRIVATE_DIRS = ("/tmp", "/dev/shm", "/var/tmp")
MQUEUE_DIR = "/dev/mqueue"
CGROUP_ROOT = "/sys/fs/cgroup"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
MSGQUEUE_BYTES = 256 << 10  # POSIX queue bytes per session uid (RLIMIT_MSGQUEUE): two queues of default size

# seccomp: syscalls a session never needs and that could undo its isolation, per architecture. socket() is among
# them: a session has no network, and a socket it cannot make is no loopback or abstract-socket channel to another
# session (socketpair() still works, for subprocess and multiprocessing).
AUDIT_ARCH = {"x86_64": 0xC000003E, "aarch64": 0xC00000B7}
DENIED = {
    "x86_64": (41, 101, 103, 134, 135, 155, 161, 163, 165, 166, 167, 168, 169, 175, 176, 179, 212, 246, 248, 249, 250,
               272, 298, 303, 304, 308, 310, 311, 313, 320, 321, 323, 425, 426, 427, 428, 429, 430, 431, 432, 433, 442),
    "aarch64": (198, 117, 116, 92, 41, 51, 89, 40, 39, 224, 225, 142, 105, 106, 60, 18, 104, 217, 218, 219, 97, 241, 264,
                265, 268, 270, 271, 273, 294, 280, 282, 425, 426, 427, 428, 429, 430, 431, 432, 433, 442),
}  # fmt: skip
CLONE_NR = {"x86_64": 56, "aarch64": 220}
CLONE3_NR = 435  # answered ENOSYS, so libc falls back to clone, whose flags the filter can read
EPERM, ENOSYS = 1, 38


def _libc() -> ctypes.CDLL:
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    return libc


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


def own_pid_namespace() -> None:
    """Process backend as root: run the worker as PID 1 of a new PID namespace with its own /proc.

    Then the worker's death takes down every process its sessions started (daemons included),
    and sessions see only the worker's processes. The outer process only relays the exit status.
    """
    if os.geteuid() != 0 or os.getpid() == 1:
        return
    libc = _libc()
    if libc.unshare(CLONE_NEWPID | CLONE_NEWNS) != 0:
        return
    pid = os.fork()
    if pid:
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        _, status = os.waitpid(pid, 0)
        code = os.waitstatus_to_exitcode(status)
        os._exit(code if code >= 0 else 128 - code)  # killed by signal N: 128+N, as a shell says it
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # (our parent is outside the namespace: getppid() is 0)
    libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None)
    libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)


def wake_preempting() -> None:
    """The default policy for the worker (its zygotes and sessions inherit it), whatever the pool's process runs
    under: a task woken under SCHED_BATCH never preempts the one running, so every hop of a call (the worker woken by
    the pool's request and by its session's reply, the session woken by its request) waited behind a neighbour's busy
    processes for the next tick, 4 ms here. Under the default policy a woken task preempts where its group is owed
    the CPU (a session's own cgroup is an equal of its neighbour's: `cgroups`). The flow's process still comes
    first on the process backend: workers run at `sandbox.nice`, and a task of low weight does not preempt on waking
    one of higher weight."""
    _set_policy("SCHED_OTHER")


def _set_policy(name: str) -> None:
    try:
        os.sched_setscheduler(0, getattr(os, name), os.sched_param(0))
    except (OSError, AttributeError):  # not Linux, or refused: the policy this process has
        pass


def leave_terminal() -> None:
    """Give up the controlling terminal the worker may share with the pool's session (the process backend keeps
    workers in that session, and so in its scheduling group): no session can then open /dev/tty, write to the
    user's terminal or push input into it. A no-op without one (Docker, a service, CI)."""
    try:
        fd = os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY)
    except OSError:
        return
    try:
        import fcntl
        import termios

        fcntl.ioctl(fd, termios.TIOCNOTTY)  # not a session leader: detaches this process alone
    except OSError:
        pass
    finally:
        os.close(fd)


def become_subreaper() -> None:
    """Orphans of sessions come back to the worker for reaping."""
    _libc().prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)


def unshare_net(is_root: bool) -> bool:
    """The whole worker in a private network namespace (process backend); a user namespace when not root."""
    libc = _libc()
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


@functools.cache  # built once in the zygote (`warm_up`): every session fork inherits the bytes
def _seccomp_program() -> bytes | None:
    arch = os.uname().machine
    if arch not in AUDIT_ARCH:
        return None
    ld, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    code: list[tuple[int, object, object, int]] = [(ld, None, None, 4), (jeq, "next", "deny", AUDIT_ARCH[arch]),
                                                    (ld, None, None, 0)]
    if arch == "x86_64":
        code.append((jge, "deny", "next", 0x40000000))  # the x32 ABI's numbering
    code += [(jeq, "deny", "next", nr) for nr in DENIED[arch]]
    code += [(jeq, "nosys", "next", CLONE3_NR), (jeq, "next", "allow", CLONE_NR[arch]),
             (ld, None, None, 16), (jset, "deny", "allow", NAMESPACE_FLAGS)]  # clone's flags: no new namespaces
    labels = {"allow": len(code), "deny": len(code) + 1, "nosys": len(code) + 2}
    tail = [0x7FFF0000, 0x00050000 | EPERM, 0x00050000 | ENOSYS]
    out = b""
    for i, (op, jt, jf, k) in enumerate(code):
        offs = [0 if t in (None, "next") else labels[t] - i - 1 for t in (jt, jf)]  # type: ignore[index]
        out += struct.pack("HBBI", op, offs[0], offs[1], k)
    return out + b"".join(struct.pack("HBBI", ret, 0, 0, k) for k in tail)


def warm_up() -> None:
    """What every session's confinement computes the same way, computed once before the forks."""
    _seccomp_program()


def install_seccomp() -> bool:
    """No new privileges, then the syscall filter; False where the architecture is unknown or seccomp refused."""
    program = _seccomp_program()
    libc = _libc()
    _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    if program is None:
        return False
    buf = ctypes.create_string_buffer(program)
    fprog = struct.pack("HxxxxxxQ", len(program) // 8, ctypes.addressof(buf))
    return libc.prctl(PR_SET_SECCOMP, 2, ctypes.c_char_p(fprog), 0, 0) == 0


def _drop_capabilities() -> None:
    """Clear every capability (a session that keeps its uid may still hold them in the worker's user namespace)."""
    header = struct.pack("Ii", 0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this thread
    data = ctypes.create_string_buffer(24)  # two zeroed {effective, permitted, inheritable}
    _check(_libc().capset(ctypes.c_char_p(header), data), "capset")


def _private_mounts(owner: int, limits: dict, shared: list[str] | tuple = ()) -> dict[str, str]:
    """Private /tmp, /dev/shm and IPC, hidden host paths; with `bind_shared` (the process backend, where they may be
    hidden or unreadable by the session's uid; the worker is root with every capability there), the `shared`
    directories bound read-only under the private /tmp; returns where the session sees those."""
    libc = _libc()
    # a network namespace per session costs milliseconds to make and more to tear down; with the filter on socket()
    # it buys nothing, so it is only the fallback where seccomp is unavailable
    _check(libc.unshare(CLONE_NEWNS | CLONE_NEWIPC | (0 if limits.get("seccomp") else CLONE_NEWNET)), "unshare")
    _check(libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "private mounts")
    shared = list(shared) if limits.get("bind_shared") else []
    sources = [os.open(path, os.O_PATH | os.O_DIRECTORY) for path in shared]  # reachable still once they are hidden
    files = int(limits.get("scratch_files") or 8192)  # empty files cost no size, but an inode of kernel memory each
    opts = f"size={int(limits['scratch_mb'])}m,nr_inodes={files},mode=0700,uid={owner},gid={owner}".encode()
    for path in PRIVATE_DIRS:
        if os.path.isdir(path):
            _check(libc.mount(b"tmpfs", path.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, opts), f"tmpfs on {path}")
    if os.path.isdir(MQUEUE_DIR):
        # /dev/mqueue still shows the worker's IPC namespace: a queue made through it outlived its session and a
        # later session read its message. A fresh mount shows this session's own namespace, gone with it.
        flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
        _check(libc.mount(b"mqueue", MQUEUE_DIR.encode(), b"mqueue", flags, None), f"mqueue on {MQUEUE_DIR}")
    hidden = list(limits.get("hide_paths") or ()) + ([CGROUP_ROOT] if limits.get("cgroups") else [])
    for path in hidden:  # the cgroup tree too: a session has no business reading its neighbours' usage
        if os.path.isdir(path):
            flags = MS_RDONLY | MS_NOSUID | MS_NODEV | MS_NOEXEC
            _check(libc.mount(b"tmpfs", path.encode(), b"tmpfs", flags, b"size=4k,mode=0755"), f"hiding {path}")
    seen = {}
    for i, fd in enumerate(sources):
        target = SHARED_MOUNT.format(i)
        os.mkdir(target, 0o755)
        _check(libc.mount(f"/proc/self/fd/{fd}".encode(), target.encode(), None, MS_BIND, None), f"binding {shared[i]}")
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV
        _check(libc.mount(None, target.encode(), None, flags, None), f"read-only {shared[i]}")
        os.close(fd)
        seen[shared[i]] = target
    return seen


def net_isolated() -> bool:
    """Whether this process's network namespace has no interface but loopback: a private one (`unshare_net`) or a
    container's `network_mode: none`. Read from /proc, so it says what is, not what was asked for."""
    try:
        with open("/proc/self/net/dev") as fh:
            names = {line.split(":", 1)[0].strip() for line in fh.readlines()[2:]}
    except OSError:
        return False
    return names <= {"lo"}


def probe(limits: dict) -> dict:
    """What session isolation this worker can give, tried in a throwaway child: {"namespaces", "seccomp"}."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        result = 0
        try:
            _private_mounts(os.getuid(), limits)
            result |= 1
        except OSError:
            pass
        try:
            result |= 2 if install_seccomp() else 0
        except OSError:
            pass
        os.write(write, bytes([result]))
        os._exit(0)
    os.close(write)
    got = os.read(read, 1)
    os.close(read)
    os.waitpid(pid, 0)
    flags = got[0] if got else 0
    return {"namespaces": bool(flags & 1), "seccomp": bool(flags & 2)}


def isolate(uid: int, limits: dict, scratch: str, shared: list[str] | tuple = ()) -> list[str]:
    """Apply steps 1-5 of the module docstring to this (session) process; returns where it sees the read-only
    directories `shared` (its template's installed requirements)."""
    seen = list(shared)
    if uid and limits.get("cgroups"):  # while still root: the groups are root's to make
        cgroups.join(limits["cgroups"], uid, int(limits["memory_mb"]), int(limits["pids"]),
                     int(limits["session_cpu_quota_us"]))
    if limits.get("namespaces"):
        moved = _private_mounts(uid or os.getuid(), limits, shared)
        seen = [moved.get(p, p) for p in shared]
        scratch = "/tmp"
    if uid:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)
    else:
        # no uid of its own: its processes are found by process group. A group, not a session of its own: a new
        # session is a new autogroup, which the kernel would weigh against the pool's process as an equal
        os.setpgid(0, 0)
        _drop_capabilities()  # and no privilege, even as root or in the worker's user namespace
    mem = int(limits["memory_mb"]) * 1024 * 1024
    resource.setrlimit(resource.RLIMIT_AS, (mem, mem))
    cpu = int(limits["cpu_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if uid:
        resource.setrlimit(resource.RLIMIT_MSGQUEUE, (MSGQUEUE_BYTES, MSGQUEUE_BYTES))
        resource.setrlimit(resource.RLIMIT_NPROC, (int(limits["pids"]), int(limits["pids"])))
    else:  # shared uid: allow what the user already runs plus this session's budget
        nproc = count_user_procs() + int(limits["pids"])
        hard = resource.getrlimit(resource.RLIMIT_NPROC)[1]
        resource.setrlimit(resource.RLIMIT_NPROC, (nproc if hard == resource.RLIM_INFINITY else min(nproc, hard), hard))
    if not limits.get("namespaces"):  # as the session's uid, exclusively: never adopt a directory someone made first
        os.mkdir(scratch, 0o700)
    if limits.get("seccomp"):
        install_seccomp()
    parent = os.getppid()
    _libc().prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)  # after setuid, which clears it
    if os.getppid() != parent:
        os._exit(0)
    os.chdir(scratch)
    os.environ.clear()
    os.environ.update({"HOME": scratch, "TMPDIR": scratch, "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"})
    return seen


def count_user_procs() -> int:
    uid, count = os.getuid(), 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                count += os.stat(f"/proc/{entry}").st_uid == uid
            except OSError:
                continue
    return count


def kill_uid(uid: int, scratch: str | None, bases: dict[str, str] | None = None) -> int:
    """Start a helper that, as `uid`, kills every process of `uid` (fork bombs included); returns its pid. With the
    worker's cgroup `bases`, it first joins that session's CPU groups, to do its work as the session's."""
    pid = os.fork()
    if pid == 0:
        try:
            if bases:
                cgroups.enter_cpu_groups(bases, uid)
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
    return pid


def kill_group(pid: int) -> None:
    """Without uid switching: the session's process group, then the process itself."""
    for target in (lambda: os.killpg(pid, signal.SIGKILL), lambda: os.kill(pid, signal.SIGKILL)):
        try:
            target()
        except OSError:
            pass


def _stat(pid: int) -> list[bytes]:
    """The fields of /proc/<pid>/stat after "pid (comm)", which may hold spaces: [0] the state, [11] + [12] user and
    system clock ticks of all its threads."""
    with open(f"/proc/{pid}/stat", "rb") as fh:
        return fh.read().rsplit(b")", 1)[1].split()


def cpu_seconds(pid: int) -> float | None:
    """Seconds `pid` has spent on a CPU, all its threads together (schedstat counts the first thread only), or None
    where it is gone. Clock ticks: 10 ms."""
    try:
        fields = _stat(pid)
        return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS
    except (OSError, ValueError, IndexError):
        return None


def cpu_state(pid: int) -> tuple[float, str] | None:
    """(seconds `pid` has spent on a CPU, its scheduler state letter: R runnable, S sleeping, ...), or None."""
    try:
        fields = _stat(pid)
        state = fields[0].decode()
        try:
            with open(f"/proc/{pid}/schedstat", "rb") as fh:
                return int(fh.read().split()[0]) / 1e9, state
        except (OSError, ValueError, IndexError):  # no schedstat: user + system clock ticks
            return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS, state
    except (OSError, ValueError, IndexError):
        return None


def ended_itself(status: int | None, limits: dict, uid: int = 0) -> bool:
    """Whether a session process ended by its own doing: it exited, or died of its own signal or its own limits
    (SIGXCPU, its group's OOM kill). A SIGKILL from outside (the container's OOM killer, an operator) is not."""
    if status is None or (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
        return _killed_for_memory(status, limits, uid)
    return True


def _killed_for_memory(status: int | None, limits: dict, uid: int) -> bool:
    """SIGKILLed by its group's OOM killer; also where no status came (None: the worker stopped waiting for it). A
    process killed holding a large memfd frees it in its own exit, after its sockets close and before its status
    exists (SIGKILLed with 500 MB held: EOF 17 ms, status 280 ms after the kill, beside 4 busy loops); under its CPU
    quota on a loaded host that once took longer than the worker's grace (`sessions.DEATH_GRACE_S`, CI on
    2026-12-06). The group's count of kills is there from the kill on."""
    if status is not None and not (os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL):
        return False
    return bool(uid) and cgroups.oom_killed(limits.get("cgroups") or {}, uid)


def describe_exit(status: int | None, limits: dict, uid: int = 0) -> str:
    """Why a session process ended, from its wait status (and its cgroup's count of kills for memory)."""
    if _killed_for_memory(status, limits, uid):
        return f"the session process was killed for memory (its limit is {limits['memory_mb']} MB: memory_mb)"
    if status is None:
        return "the session process died"
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        name = signal.Signals(sig).name if sig in signal.Signals._value2member_map_ else str(sig)
        hint = {"SIGXCPU": f" (CPU time limit of {limits['cpu_s']} s)", "SIGKILL": " (killed: memory or another limit)",
                "SIGSEGV": " (segmentation fault)"}.get(name, "")
        return f"the session process was killed by {name}{hint}"
    return f"the session process exited with code {os.WEXITSTATUS(status) if os.WIFEXITED(status) else status}"
