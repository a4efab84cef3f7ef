"""The sandbox worker: a standard-library-only fork server that runs tool code for many sessions.

It is copied into the sandbox image (and run directly by the process backend) and imports nothing
from the project. One worker serves many sessions; each environment version it is asked to load
gets a zygote holding the parsed state, and each session is a process forked from it.

    protocol.py   the wire format and the checks on everything the worker reads
    server.py     the event loop: the pool's requests and replies, templates
    sessions.py   the life of a session: spawn, one request at a time, death, teardown
    deadlines.py  whose fault a late reply is: the tool's (timeout) or the machine's (overloaded)
    zygote.py     one per loaded environment version: parse once, fork sessions
    policy.py     what confines a session process (namespaces, uid, rlimits, seccomp) and its teardown
    cgroups.py    a cgroup per session: memory (memfd and tmpfs included), processes, a CPU share (less for a
                  session whose call runs long)
    execution.py  tool code inside a session: load, call, render observations

Run it as `python -I -S -c "<BOOT>"` (see `runtime.image.worker_argv`): `-I` leaves the script's
directory off `sys.path`, so the boot line puts this package's parent there and starts `server.main`.
"""
