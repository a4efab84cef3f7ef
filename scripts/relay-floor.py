"""What a neighbour's call meets beside a busy session, with none of Arenaforge's code (docs/SANDBOX.md, "A busy
session's core is its own"). A three-process relay (client -> relay -> server over pipes, each hop working HOP_US
microseconds, default 60) makes 500 back-to-back calls quiet, then 500 beside one attacker process, which runs on
core 1 in a CPU group of an eighth of the weight, as the sandbox places a busy session. Prints one JSON line per
round: the attack, the quiet p99 and median, the attacked p99 and median, and p99 over quiet.

    sudo python3 scripts/relay-floor.py ATTACK ROUNDS     ATTACK: spin, fork, mem, files, memfd or none

PIN=client,relay,server holds those hops on core 0 (sched_setaffinity); CHAIN_CORE=0 holds the whole relay there in
a cpuset group. Root on a cgroup v1 host (it makes the groups floor-att and floor-chain, and removes them)."""
import glob
import json
import mmap
import os
import shutil
import signal
import sys
import time

HOP_US = int(os.environ.get("HOP_US", "60"))
CALLS = 500
CHAIN_CORE = os.environ.get("CHAIN_CORE")
CG = "/sys/fs/cgroup"


def write(path, value):
    with open(path, "w") as fh:
        fh.write(str(value))


def read(path):
    with open(path) as fh:
        return fh.read()


def spin(us):
    end = time.perf_counter() + us / 1e6
    while time.perf_counter() < end:
        pass


PIN = os.environ.get("PIN", "").split(",")


def pin(name):
    if name in PIN:
        os.sched_setaffinity(0, {0})


def hop(rfd, wfd):
    pin("server")
    while True:
        b = os.read(rfd, 1)
        if not b:
            os._exit(0)
        spin(HOP_US)
        os.write(wfd, b)


def start_chain():
    """client <-> relay <-> server; returns (write to relay, read from relay, pids)."""
    c2r, r2s, s2r, r2c = os.pipe(), os.pipe(), os.pipe(), os.pipe()
    pids = []
    pid = os.fork()
    if pid == 0:  # server
        hop(r2s[0], s2r[1])
    pids.append(pid)
    pid = os.fork()
    if pid == 0:  # relay: a request down, a reply up
        pin("relay")
        while True:
            b = os.read(c2r[0], 1)
            if not b:
                os._exit(0)
            spin(HOP_US)
            os.write(r2s[1], b)
            os.read(s2r[0], 1)
            spin(HOP_US)
            os.write(r2c[1], b)
    pids.append(pid)
    return c2r[1], r2c[0], pids


def calls(w, r, n):
    times = []
    for _ in range(n):
        t = time.perf_counter()
        spin(HOP_US)
        os.write(w, b"x")
        os.read(r, 1)
        spin(HOP_US)
        times.append(time.perf_counter() - t)
    times.sort()
    return times[int(0.99 * len(times))] * 1000, times[len(times) // 2] * 1000


def group(name, shares, cores):
    for ctl in ("cpu", "cpuset"):
        os.makedirs(f"{CG}/{ctl}/{name}", exist_ok=True)
    write(f"{CG}/cpu/{name}/cpu.shares", shares)
    write(f"{CG}/cpuset/{name}/cpuset.mems", "0")
    write(f"{CG}/cpuset/{name}/cpuset.cpus", cores)


def join(name):
    for ctl in ("cpu", "cpuset"):
        write(f"{CG}/{ctl}/{name}/cgroup.procs", os.getpid())


def attacker(kind):
    join("floor-att")
    if kind == "spin":
        for _ in range(3):
            if os.fork() == 0:
                break
        while True:
            pass
    if kind == "fork":
        while True:
            pid = os.fork()
            if pid == 0:
                os._exit(0)
            os.waitpid(pid, 0)
    if kind == "mem":
        while True:
            m = mmap.mmap(-1, 256 << 20)
            for i in range(0, 256 << 20, 4096):
                m[i] = 1
            m.close()
    if kind == "files":
        d = f"/dev/shm/floor-{os.getpid()}"
        os.makedirs(d, exist_ok=True)
        while True:
            for i in range(5000):
                os.close(os.open(f"{d}/{i}", os.O_CREAT | os.O_WRONLY))
            for i in range(5000):
                os.unlink(f"{d}/{i}")
    if kind == "memfd":
        chunk = b"\0" * (1 << 20)
        while True:
            fd = os.memfd_create("x")
            for _ in range(256):
                os.write(fd, chunk)
            os.close(fd)
    while True:
        time.sleep(1)


def main():
    kind, rounds = sys.argv[1], int(sys.argv[2])
    group("floor-att", 128, "1")
    if CHAIN_CORE:
        group("floor-chain", 1024, CHAIN_CORE)
        join("floor-chain")
    w, r, pids = start_chain()
    pin("client")
    calls(w, r, 200)  # warm
    for _ in range(rounds):
        quiet, qmed = calls(w, r, CALLS)
        pid = os.fork()
        if pid == 0:
            attacker(kind)
        loud, lmed = calls(w, r, CALLS)
        os.kill(pid, signal.SIGKILL)
        for p in [int(x) for x in read(f"{CG}/cpu/floor-att/cgroup.procs").split()]:
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
        os.waitpid(pid, 0)
        while read(f"{CG}/cpu/floor-att/cgroup.procs").strip():
            time.sleep(0.05)
        for left in glob.glob("/dev/shm/floor-*"):  # what the file attack had made when it was killed
            shutil.rmtree(left, ignore_errors=True)
        time.sleep(0.3)
        print(json.dumps({"attack": kind, "quiet_p99": round(quiet, 3), "p99": round(loud, 3),
                          "ratio": round(loud / quiet, 2), "quiet_med": round(qmed, 3), "med": round(lmed, 3)}),
              flush=True)
    os.close(w)
    for p in pids:
        os.kill(p, signal.SIGKILL)
        os.waitpid(p, 0)
    for name in ("floor-att", "floor-chain"):
        for ctl in ("cpu", "cpuset"):
            if os.path.isdir(f"{CG}/{ctl}/{name}"):
                if name == "floor-chain":
                    write(f"{CG}/{ctl}/cgroup.procs", os.getpid())
                os.rmdir(f"{CG}/{ctl}/{name}")


if __name__ == "__main__":
    main()
