"""Whose fault is a late reply: the tool's (it ran too long) or the machine's (it never got a CPU).

A request's deadline is the tool's own time: running, sleeping or blocked, but not waiting for a
CPU. A request still in flight after a quarter of its limit is sampled then and every eighth of the
limit after (CPU seconds and scheduler state, from /proc; that first quarter counts as its own). An
interval in which the session stayed runnable but did not get the CPU is starvation and is given
back, up to `stretch` times the limit. (The kernel adds a task's run-queue delay only once it runs
again, and a CPU quota's throttling not at all, so it is sampled.) A tool that used up its own
time, or that was starved but still burned 1/`stretch` of its limit on a CPU, ran too long:
`timeout`, the tool's fault. One that barely got a CPU in the whole window was starved:
`overloaded`, the sandbox's fault.

The harness's own requests (a state read) are not tool time: their own time is only the CPU the session used.
A multi-megabyte reply waits, blocked, for a busy worker to read it; that wait is the worker's, and counting it
once turned a slow read at 50 sessions into a reset (issue 35).
"""

from . import policy


class RequestClock:
    """The time accounting of one request in flight."""

    __slots__ = ("budget", "started", "own", "ran", "sampled", "cpu", "state", "cpu_only")

    def __init__(self, budget: float, now: float, cpu_only: bool = False) -> None:
        self.budget, self.started, self.cpu_only = budget, now, cpu_only
        self.own = self.ran = 0.0  # the request's own time and CPU time so far
        self.sampled, self.cpu, self.state = now, -1.0, ""  # no sample yet: a call costs no /proc read until it is slow

    def first_check(self) -> float:
        return self.started + self.budget / 4  # trivial requests are answered long before

    def sample(self, pid: int, now: float) -> None:
        """Add the interval since the last sample to the own time, unless it was spent waiting for a CPU."""
        interval, self.sampled = now - self.sampled, now
        sample = policy.cpu_state(pid) if pid else None
        if sample is None:  # not forked yet (waiting in the zygote's queue), or no /proc to read (its own time)
            self.own += interval if pid else 0.0
            return
        cpu, state = sample
        if self.cpu < 0:  # the first sample, a quarter into the limit: that quarter counts as the tool's own time
            self.cpu, self.state = cpu, state
            self.own += 0.0 if self.cpu_only else interval
            return
        ran, self.cpu = max(0.0, cpu - self.cpu), cpu
        starved = state == "R" and self.state == "R"  # runnable at both ends: what it did not run, it waited
        self.state = state
        self.ran += ran
        self.own += ran if self.cpu_only or starved else interval

    def verdict(self, now: float, stretch: float) -> str | None:
        """"timeout" (the tool's fault), "overloaded" (the machine's), or None: not yet."""
        elapsed = now - self.started
        if self.own >= self.budget or (elapsed >= stretch * self.budget and self.ran >= self.budget / stretch):
            return "timeout"
        return "overloaded" if elapsed >= stretch * self.budget else None

    def next_check(self, now: float, stretch: float) -> float:
        return min(now + max(0.02, self.budget / 8), self.started + stretch * self.budget)
