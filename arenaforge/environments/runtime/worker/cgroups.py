"""A cgroup per session: memory (memfd, tmpfs and kernel memory included), processes, a CPU share, a CPU cap and the
cores it may run on.

rlimits bound one process's address space and one uid's process count; they do not see pages a session keeps in a
`memfd` or a pipe, and they give a session with 64 busy processes 64 shares of the CPU against its neighbour's one.
A cgroup counts all of it: the worker makes a group of its own for memory and pids (`setup`), each session process
joins `<group>/u<uid>` while it is still root (`join`), and the worker removes that group once the uid's processes are
gone (`remove`). A session's CPU group is `<group>-u<uid>` instead, beside the worker rather than inside a group of
its own: every level of CPU groups costs the scheduler on each wake-up, and with a worker's level between, sessions
preempted each other ten times as often (`_session_group`). A session past `memory.limit_in_bytes` is killed by the
kernel inside its own group, never a neighbour; the worker reads `memory.oom_control` to say so (`oom_killed`).

cgroup v1 only (the hosts this runs on have it; on a v2 host `setup` says why not and sessions keep their rlimits).
Where the hierarchy is mounted read-only (a Docker container), the worker, which holds CAP_SYS_ADMIN there, mounts
each controller again, writable, beside it; with the container's private cgroup namespace that mount's root is the
container's own group, so nothing outside the container is reachable.
"""

import ctypes
import os
import signal
import threading
import time

CONTROLLERS = ("memory", "pids", "cpu", "cpuset")
OPTIONAL = ("cpuset",)  # a host without it keeps the others: only `pin` is lost
CLEANUP_S = 10.0
KILL_ROUNDS = 50  # of `kill`: each finds the children forked before their parents' signal
PERIOD_US = 100_000  # of a session's CPU quota: the kernel's default period
# the kernel's CPU weight of a task at nice -20 .. 19 (sched_prio_to_weight): a group's cpu.shares at the worker's
# nice weighs it as the worker's processes were weighed before they had groups (`sandbox.nice` keeps its meaning)
NICE_WEIGHT = (88761, 71755, 56483, 46273, 36291, 29154, 23254, 18705, 14949, 11916, 9548, 7620, 6100, 4904, 3906,
               3121, 2501, 1991, 1586, 1277, 1024, 820, 655, 526, 423, 335, 272, 215, 172, 137, 110, 87, 70, 56, 45,
               36, 29, 23, 18, 15)
MS_NOSUID, MS_NODEV, MS_NOEXEC = 2, 4, 8
# a session whose request has run `sessions.YIELD_AFTER_S` weighs this much less than one that answers at once: its
# neighbours' short calls, and the worker relaying them, are then owed the CPU when they wake, and preempt it (the
# fair scheduler lets a woken task preempt only a task that has had more than its share; at equal weights, one that
# has just run a burst has not, and waits for the next tick, 4 ms here: docs/SANDBOX.md, Scheduling)
YIELD_DIVISOR = 8


def _cgroup_mounts() -> list[tuple[str, list[str], str, str, bool]]:
    """(filesystem type, its options, mount point, root of the mount, writable) of each cgroup mount this process
    sees (v1, and a hybrid host's v2), in mount order."""
    found = []
    with open("/proc/self/mountinfo") as fh:
        for line in fh:
            head, _, tail = line.partition(" - ")
            fields, extra = head.split(), tail.split()
            if len(extra) >= 3 and extra[0] in ("cgroup", "cgroup2"):
                found.append((extra[0], extra[2].split(","), fields[4], fields[3], "rw" in fields[5].split(",")))
    return found


def _mounts() -> dict[str, tuple[str, str, bool]]:
    """controller -> (mount point, root of the mount, writable) for this process's cgroup v1 mounts."""
    found: dict[str, tuple[str, str, bool]] = {}
    for fstype, options, point, root, writable in _cgroup_mounts():
        for option in options if fstype == "cgroup" else ():
            if option in CONTROLLERS:
                found[option] = (point, root, writable)  # the last mount of a path wins, as it does there
    return found


def _own_paths() -> dict[str, str]:
    """controller -> this process's cgroup path, from /proc/self/cgroup."""
    paths: dict[str, str] = {}
    with open("/proc/self/cgroup") as fh:
        for line in fh:
            _, controllers, path = line.rstrip("\n").split(":", 2)
            for name in controllers.split(","):
                if name in CONTROLLERS:
                    paths[name] = path
    return paths


def _mount_writable(under: str, controller: str) -> None:
    """Mount `controller`'s hierarchy again, writable, in a root-only directory under `under` (not over the read-only
    one: the kernel refuses a second mount of a hierarchy on one path, and a container's /sys/fs/cgroup is not ours
    to write)."""
    target = os.path.join(under, f".arenaforge-cgroup-{controller}")
    os.makedirs(target, mode=0o700, exist_ok=True)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong, ctypes.c_char_p]
    flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
    if libc.mount(b"cgroup", target.encode(), b"cgroup", flags, controller.encode()) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mounting the {controller} cgroup: {os.strerror(err)}")


def _bases(name: str, mounts: dict[str, tuple[str, str, bool]], own: dict[str, str],
           controllers: tuple[str, ...] = CONTROLLERS) -> dict[str, str]:
    bases = {}
    for controller in controllers:
        point, root, _ = mounts[controller]
        path = own[controller]
        inside = os.path.relpath(path, root) if path.startswith(root) else path.lstrip("/")
        bases[controller] = os.path.normpath(os.path.join(point, inside, name))
    return bases


def setup(name: str, mount_under: str, controllers: tuple[str, ...] = CONTROLLERS) -> tuple[dict[str, str], str]:
    """Make this worker's group `name` under its own group for each of `controllers`; returns (controller -> that
    directory, "") or ({}, why not). Root only. A read-only hierarchy is mounted again under `mount_under` (where
    sessions see a private /tmp of their own)."""
    if os.geteuid() != 0:
        return {}, "the worker is not root"
    try:
        mounts, own = _mounts(), _own_paths()
        missing = [c for c in controllers if c not in mounts or c not in own]
        if [c for c in missing if c not in OPTIONAL]:
            return {}, f"no cgroup v1 hierarchy for {', '.join(missing)} (cgroup v2 is not supported yet)"
        usable = []
        for controller in controllers:
            if controller in missing:
                continue
            try:
                if not mounts[controller][2]:
                    _mount_writable(mount_under, controller)
                usable.append(controller)
            except OSError:
                if controller not in OPTIONAL:
                    raise
        bases = _bases(name, _mounts(), _own_paths(), tuple(usable))
        for controller, base in bases.items():
            if controller != "cpu":  # sessions' CPU groups sit beside the worker (`_session_group`)
                os.makedirs(base, exist_ok=True)
        if "cpuset" in bases:
            try:
                _inherit_cpuset(bases["cpuset"])  # a new cpuset has no CPUs: it takes its parent's
                _write(bases["cpuset"], "cgroup.clone_children", 1)  # and its sessions' take its, as they are made
            except OSError:
                os.rmdir(bases.pop("cpuset"))
        return bases, ""
    except OSError as err:
        return {}, str(err)


def session_cpu_quota(bases: dict[str, str], share: float) -> int:
    """The CPU quota (microseconds per `cpu.cfs_period_us`) each session's group gets: `share` of the tightest quota
    among the worker group's ancestors that this process sees (a container's `cpus`); 0 (none) where none has one,
    or where `share` is 1. A session whose busy processes used the whole quota would get the whole container
    throttled, its neighbours and the worker included, for the rest of each period; on the host there is nothing
    to exhaust."""
    base = bases.get("cpu")
    if not base or share >= 1:
        return 0
    limits = []
    group = os.path.dirname(base)
    while os.path.exists(os.path.join(group, "cpu.cfs_quota_us")):
        try:
            quota, period = _read(group, "cpu.cfs_quota_us"), _read(group, "cpu.cfs_period_us")
        except (OSError, ValueError):
            break
        if quota > 0 and period > 0:
            limits.append(quota / period)
        group = os.path.dirname(group)
    return int(share * min(limits) * PERIOD_US) if limits else 0


def join(bases: dict[str, str], uid: int, memory_mb: int, pids: int, cpu_quota_us: int = 0) -> None:
    """Put this process into its session's group (made here, with its limits), before it drops root."""
    for controller in bases:
        group = _session_group(bases, controller, uid)
        os.makedirs(group, exist_ok=True)
        if controller == "memory":
            _write(group, "memory.limit_in_bytes", memory_mb << 20)
        elif controller == "pids":
            _write(group, "pids.max", pids)
        elif controller == "cpuset":
            if not _read_text(group, "cpuset.cpus"):  # not cloned from its worker's (`setup`)
                _inherit_cpuset(group)
        else:  # one session, however many processes, weighs as one of the worker's processes; capped (see above)
            _write(group, "cpu.shares", _weight())
            if cpu_quota_us:
                _write(group, "cpu.cfs_period_us", PERIOD_US)
                _write(group, "cpu.cfs_quota_us", cpu_quota_us)
        _write(group, "cgroup.procs", os.getpid())


def cores(bases: dict[str, str]) -> list[int]:
    """The CPUs this worker's sessions may run on ([] without a cpuset group)."""
    if not bases.get("cpuset"):
        return []
    listed = []
    for part in _read_text(bases["cpuset"], "cpuset.cpus").split(","):
        first, _, last = part.partition("-")
        if first:
            listed += range(int(first), int(last or first) + 1)
    return listed


def tasks(bases: dict[str, str], uid: int) -> int:
    """How many tasks (processes and threads) a session's group holds now (0: not known)."""
    if not bases.get("pids") or not uid:
        return 0
    try:
        return _read(os.path.join(bases["pids"], f"u{uid}"), "pids.current")
    except (OSError, ValueError):
        return 0


def pin(bases: dict[str, str], uid: int, cores: list[int]) -> None:
    """Run a session's processes on `cores` only (while a request runs long), or on all its worker's CPUs again ([]).
    Docker caps a session at half a core by default, so one core costs it nothing over a quota period; what it loses
    is running its processes on every core at once, in the burst each new period allows, which is when its
    neighbours' calls, and the worker and the flow relaying them, found no core to wake on (issue 35). A cpuset is
    the kernel's: tool code cannot widen it with `sched_setaffinity`. A group already gone is left so."""
    if not bases.get("cpuset") or not uid:
        return
    try:
        cpus = ",".join(map(str, cores)) if cores else _read_text(bases["cpuset"], "cpuset.cpus")
        _write_text(_session_group(bases, "cpuset", uid), "cpuset.cpus", cpus)
    except OSError:
        pass


def weigh(bases: dict[str, str], uid: int, yielding: bool) -> None:
    """Set a session's CPU weight: its worker's (as `join` made it), or a `YIELD_DIVISOR`th of it while its request
    runs long. Only its place beside its worker and the sessions it shares a group with changes (the container, or
    the flow's group on the process backend): that group weighs as before against the rest of the machine, so nothing
    outside starves it. A group already gone is left so."""
    if not bases.get("cpu") or not uid:
        return
    weight = max(2, _weight() // YIELD_DIVISOR) if yielding else _weight()
    try:
        _write(_session_group(bases, "cpu", uid), "cpu.shares", weight)
    except OSError:
        pass


def enter_cpu_groups(bases: dict[str, str], uid: int) -> None:
    """Move this process (a helper that ends a session) into that session's CPU and cpuset groups: its work is then
    weighed, capped and placed as the session's own, on the core a busy session is pinned to. Forked from the worker,
    it would otherwise run at the worker's weight, on the worker's core: killing a fork bomb's 60 processes there
    held the worker 2.6 ms while its neighbours' replies waited (traced: docs/SANDBOX.md). A group already gone is
    left so."""
    for controller in ("cpu", "cpuset"):
        if bases.get(controller) and uid:
            try:
                _write(_session_group(bases, controller, uid), "cgroup.procs", os.getpid())
            except OSError:
                pass


def throttled(bases: dict[str, str]) -> list[float] | None:
    """[times, milliseconds]: how often the CPU quota of the group the worker runs in (its container, on Docker) ran
    out, and for how long in all. Each time, the worker and every session wait out the rest of the period, whatever
    their weights: a session held at its share still gets there with its neighbours' own load (docs/SANDBOX.md).
    None where the worker has no CPU groups."""
    base = bases.get("cpu")
    if not base:
        return None
    try:
        with open(os.path.join(os.path.dirname(base), "cpu.stat")) as fh:
            stat = dict(line.split() for line in fh if line.strip())
        return [int(stat["nr_throttled"]), round(int(stat["throttled_time"]) / 1e6, 1)]
    except (OSError, KeyError, ValueError):
        return None


def strays(bases: dict[str, str], uid: int, pid: int) -> int:
    """How many processes of a session's group are not its session process `pid` (0: not known yet): those its tool
    code started and left running (0 without a group to look in). Read afresh: a kept descriptor returns its first
    list."""
    base = bases.get("pids")
    if not base or not uid:
        return 0
    try:
        listed = _listed(os.path.join(base, f"u{uid}", "cgroup.procs"))  # a set: v1 may list a process twice
    except (OSError, ValueError):
        return 0
    if not pid:  # its ready message came before the zygote said which pid it is; it is in its group by then
        return max(0, len(listed) - 1)
    return len(listed - {pid})


def kill(bases: dict[str, str], uid: int) -> bool:
    """SIGKILL every process of a session's group from this process (the worker, root): no helper to fork. Forking
    the worker took 0.8 ms of its core, and the helper ran 1.1 ms there before it could join the session's groups,
    while a neighbour's reply waited behind both (traced at a fork bomb's end, issue 35). A pid is signalled through
    a pidfd opened before the group is read again, and only if it is listed then: a pid freed and reused meanwhile
    names another process, which that pidfd does not. Rounds until one lists nothing new: a child forked before its
    parent's signal shows up in the next, and none is forked after it (a fork fails while SIGKILL is pending). False
    where there is no group to list them (the caller kills by uid instead)."""
    base = bases.get("pids")
    if not base or not uid or not hasattr(os, "pidfd_open"):
        return False
    path, signalled = os.path.join(base, f"u{uid}", "cgroup.procs"), set()
    for _ in range(KILL_ROUNDS):
        try:
            listed = _listed(path) - signalled
        except FileNotFoundError:
            return True  # removed: nothing left in it
        except OSError:
            return False
        if not listed:
            return True
        opened = {}
        try:
            for pid in listed:
                try:
                    opened[pid] = os.pidfd_open(pid)
                except ProcessLookupError:
                    pass  # gone already
            still = _listed(path)
            for pid, fd in opened.items():
                if pid in still:
                    try:
                        signal.pidfd_send_signal(fd, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
        except OSError:  # not allowed here (no CAP_KILL): the caller's helper kills them as their own uid
            return False
        finally:
            for fd in opened.values():
                os.close(fd)
        signalled |= listed
    return True


def _listed(procs: str) -> set[int]:
    """The pids a `cgroup.procs` lists now (read afresh: a kept descriptor returns its first list)."""
    fd = os.open(procs, os.O_RDONLY)
    try:
        return {int(pid) for pid in os.read(fd, 1 << 20).split()}
    finally:
        os.close(fd)


def oom_killed(bases: dict[str, str], uid: int) -> bool:
    """Whether the kernel killed a process of this session's group for memory."""
    base = bases.get("memory")
    if not base:
        return False
    try:
        with open(os.path.join(base, f"u{uid}", "memory.oom_control")) as fh:
            counts = dict(line.split() for line in fh if line.strip())
    except (OSError, ValueError):
        return False
    return int(counts.get("oom_kill", 0)) > 0


def remove(bases: dict[str, str], uid: int) -> bool:
    """Remove a session's groups once its processes are gone; False while one is still busy (try again later)."""
    done = True
    for controller in bases:
        try:
            os.rmdir(_session_group(bases, controller, uid))
        except FileNotFoundError:
            pass
        except OSError:
            done = False
    return done


def remove_all(bases: dict[str, str]) -> bool:
    """The worker is gone: its whole group, sessions' groups first; False while one still holds a process."""
    done = True
    for controller, base in bases.items():
        # the worker's own group and its sessions' inside it; CPU: its sessions' groups beside it (`_session_group`)
        inside, prefix = (os.path.dirname(base), os.path.basename(base) + "-u") if controller == "cpu" else (base, "")
        try:
            entries = [e.path for e in os.scandir(inside)
                       if e.is_dir(follow_symlinks=False) and e.name.startswith(prefix)]
        except FileNotFoundError:
            continue
        except OSError:
            done = False
            continue
        for path in [*entries, base]:
            try:
                os.rmdir(path)
            except FileNotFoundError:
                pass
            except OSError:
                done = False
    return done


def _session_group(bases: dict[str, str], controller: str, uid: int) -> str:
    """A session's group: inside its worker's (`<group>/u<uid>`), or for the CPU beside it (`<group>-u<uid>`), so a
    session weighs as one process among its worker and the other workers' sessions, as processes without groups do.
    Measured at 64 sessions on 4 process-backend workers: with a worker level between, sessions preempted each other
    7,400 times in 2 s against 700 flat; Docker's `bench sandbox` calls/s @64 went up 1.27x flat (docs/SANDBOX.md)."""
    base = bases[controller]
    return f"{base}-u{uid}" if controller == "cpu" else os.path.join(base, f"u{uid}")


def _weight() -> int:
    return NICE_WEIGHT[min(max(os.getpriority(os.PRIO_PROCESS, 0), -20), 19) + 20]


def _inherit_cpuset(group: str) -> None:
    parent = os.path.dirname(group)
    for knob in ("cpuset.cpus", "cpuset.mems"):
        _write_text(group, knob, _read_text(parent, knob))


def _read_text(group: str, knob: str) -> str:
    with open(os.path.join(group, knob)) as fh:
        return fh.read().strip()


def _write_text(group: str, knob: str, value: str) -> None:
    with open(os.path.join(group, knob), "w") as fh:
        fh.write(value)


def _read(group: str, knob: str) -> int:
    with open(os.path.join(group, knob)) as fh:
        return int(fh.read())


def _write(group: str, knob: str, value: int) -> None:
    with open(os.path.join(group, knob), "w") as fh:
        fh.write(str(value))


def locate(name: str) -> dict[str, str]:
    """Where `setup(name)` puts a worker's groups when the hierarchy is writable ({} where it is not, or there is
    none), seen from the process that started it (the pool, whose groups it inherited): what that process removes
    once the worker is gone (`cleanup`)."""
    if os.geteuid() != 0:
        return {}
    try:
        mounts, own = _mounts(), _own_paths()
    except OSError:
        return {}
    present = tuple(c for c in CONTROLLERS if c in mounts and c in own and mounts[c][2])
    return _bases(name, mounts, own, present)


def cleanup(bases: dict[str, str]) -> None:
    """Once the worker is gone: its groups, and those of workers whose starting process died without cleaning up
    (`arenaforge-worker-<pid>` with no such pid)."""
    deadline = time.monotonic() + CLEANUP_S
    while not remove_all(bases) and time.monotonic() < deadline:
        time.sleep(0.05)  # the kernel is still taking down the worker's PID namespace
    for base in bases.values():
        _remove_stale(os.path.dirname(base), PREFIX)


PREFIX = "arenaforge-worker-"
POOL_PREFIX = "arenaforge-pool-"
_pool_group: dict = {}  # this process's CPU group while a pool uses it: {"path", "home", "users"}
_pool_group_lock = threading.Lock()  # pools of one process may start and stop on event loops of several threads


def enter_pool_group() -> str:
    """Move this process (the pool's: the flow) into a CPU group of its own, `arenaforge-pool-<pid>`, weighed as this
    process was (`cpu.shares` at its nice value), before it starts workers. Process backend: they inherit the group
    and make their sessions' groups inside it; Docker: their containers are made in it (`pool_group_parent`). There
    each session weighs as one however many processes it runs, and the workers (containers), at `sandbox.nice`,
    still yield the CPU to this process, as they did in its autogroup. A group of the workers' own beside it would
    weigh as an equal of every autogroup on the host (docs/SANDBOX.md). Returns the group, or "" where it cannot be
    made (not root, no writable cpu hierarchy); pools of one process share it."""
    with _pool_group_lock:
        return _enter_pool_group()


def _enter_pool_group() -> str:
    """`enter_pool_group`, under its lock."""
    if _pool_group:
        _pool_group["users"] += 1
        return _pool_group["path"]
    if os.geteuid() != 0:
        return ""
    try:
        mounts, own = _mounts(), _own_paths()
        if "cpu" not in mounts or "cpu" not in own or not mounts["cpu"][2]:
            return ""
        home = _bases("", mounts, own, ("cpu",))["cpu"]
        for hierarchy in _every_hierarchy(_cpu_hierarchy_path(home)):
            _remove_stale(hierarchy, POOL_PREFIX)  # a Docker pool's groups in other hierarchies as well
        path = os.path.join(home, f"{POOL_PREFIX}{os.getpid()}")
        os.makedirs(path, exist_ok=True)
        _write(path, "cpu.shares", _weight())
        _write(path, "cgroup.procs", os.getpid())
    except OSError:
        return ""
    _pool_group.update(path=path, home=home, users=1)
    return path


def leave_pool_group(wait_s: float = 0.0) -> None:
    """The last pool of this process is gone: back to the group it came from, and its group removed (with the groups
    of that name a Docker engine made beside it in its other hierarchies: `pool_group_parent`), waiting up to
    `wait_s` for what is still in them to go (a container's groups go a moment after it is removed)."""
    with _pool_group_lock:
        groups = _leave_pool_group()
    deadline = time.monotonic() + wait_s
    while True:
        for group in groups:
            _remove_tree(group)
        if not any(os.path.exists(group) for group in groups) or time.monotonic() >= deadline:
            return
        time.sleep(0.05)


def _leave_pool_group() -> list[str]:
    """`leave_pool_group` under its lock: the groups to remove, once this process has left them."""
    if not _pool_group:
        return []
    _pool_group["users"] -= 1
    if _pool_group["users"] > 0:
        return []
    path, home = _pool_group["path"], _pool_group["home"]
    parent = pool_group_parent()
    _pool_group.clear()
    try:
        _write(home, "cgroup.procs", os.getpid())
    except OSError:
        return []
    return [path, *_every_hierarchy(parent)]


def pool_group_parent() -> str:
    """The pool's CPU group as a Docker engine with the cgroupfs driver names a cgroup parent: its path in the
    hierarchy (`/arenaforge-pool-<pid>`), or "" without one. A container made with it sits beside this process in its
    group, weighed against it at its `cpu.shares` (docs/SANDBOX.md, "The flow's process first, on Docker too"); the
    engine makes the same path in its other hierarchies (memory, pids, ...)."""
    return _cpu_hierarchy_path(_pool_group["path"]) if _pool_group else ""


def _cpu_hierarchy_path(group: str) -> str:
    """The path in the cpu hierarchy (as /proc/<pid>/cgroup gives it) of the cpu group directory `group`."""
    point, root, _ = _mounts()["cpu"]
    return os.path.normpath(os.path.join(root, os.path.relpath(group, point)))


def _every_hierarchy(path: str) -> list[str]:
    """Where hierarchy path `path` is in each cgroup hierarchy mounted here (v1, and a hybrid host's v2 beside them)."""
    return sorted({os.path.normpath(os.path.join(point, os.path.relpath(path, root)))
                   for _, _, point, root, _ in _cgroup_mounts()
                   if (path + "/").startswith(root.rstrip("/") + "/")})


def _remove_stale(home: str, prefix: str) -> None:
    """Groups named `<prefix><pid>` (or `<prefix><pid>-u<uid>`) whose process is gone (it died before it could remove
    them)."""
    try:
        stale = [e.path for e in os.scandir(home)
                 if e.name.startswith(prefix) and not _alive(e.name[len(prefix):].split("-")[0])]
    except OSError:
        return
    for path in stale:
        _remove_tree(path)


def _remove_tree(path: str) -> None:
    for parent, _, _ in sorted(os.walk(path), key=lambda walked: -len(walked[0])):  # deepest first
        try:
            os.rmdir(parent)
        except OSError:
            pass


def _alive(pid: str) -> bool:
    if not pid.isdigit():
        return True  # not ours to judge
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except OSError:
        pass
    return True
