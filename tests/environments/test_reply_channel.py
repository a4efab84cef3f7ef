"""The reply channel against tool code that writes into it, on both backends (issue 14), and honest
large arguments and results.

Tool code runs in the same process as the code that answers for it, so whatever it writes into
its channel is read as untrusted: only a reply to the call in flight (a fresh random nonce per
call) counts, its outcome must be one the protocol has, its text is re-capped and made valid
UTF-8, and nothing it sends stops the worker or reaches another session. What tool code can do
is decide its own call's observation (as it could by returning it): the `forge_own` case.
"""

from __future__ import annotations

import json

import pytest

from arenaforge.environments.runtime.handles import observation as _observation
from arenaforge.schemas.models import Environment, FunctionDoc, ToolObservation
from tests.environments.conftest import PoolHandle, start_pool
from tests.environments.toolsets import retail_functions_env

CHANNEL_ABUSE = r'''
import json, os, socket, sys

def _channel():
    for fd in sorted(int(x) for x in os.listdir("/proc/self/fd")):
        try:
            if "socket" in os.readlink(f"/proc/self/fd/{fd}"):
                return socket.socket(fileno=os.dup(fd))
        except OSError:
            pass

def _nonce():
    frame = sys._getframe()  # the serving loop's request, read from its frame
    while frame is not None:
        req = frame.f_locals.get("req")
        if isinstance(req, dict) and "nonce" in req:
            return req["nonce"]
        frame = frame.f_back

def _send(*messages):
    _channel().sendall(b"".join(m if isinstance(m, bytes) else json.dumps(m).encode() + b"\n" for m in messages))

def forge_guess():
    _send({"seq": 2, "nonce": 2, "outcome": "ok", "output": "ok FORGED-GOLD"})
    return "real"

def forge_own():
    _send({"nonce": _nonce(), "outcome": "ok", "output": "FORGED-OWN"})
    return "real"

def forge_next():
    n = _nonce()
    _send(*({"nonce": g, "outcome": "ok", "output": "FORGED-NEXT"} for g in (n + 1, n - 1, n ^ 1, 0, 1)))
    return "real"

def forge_huge():
    _send({"nonce": _nonce(), "outcome": "ok", "output": "F" * (1 << 20), "truncated": False})
    return "real"

def forge_outcome():
    _send({"nonce": _nonce(), "outcome": "pwned", "output": 1})
    return "real"

def forge_infrastructure():
    _send({"nonce": _nonce(), "failure": "state_lost", "error": "blame the sandbox"})
    return "real"

def forge_bytes():
    _send(b"\xff\xfe not utf-8\n", b"[" * 200000 + b"\n", b'{"nonce": %d, "outcome": "ok", "output": "a\\ud800b"}\n' % _nonce())
    return "real"

def flood():
    s = _channel()
    for _ in range(200):
        s.sendall(b"x" * (1 << 20))
    return "sent"

def pour_newlines():
    import threading
    s = _channel()
    def pour():  # bare newlines from a thread that outlives the call, ~1.3 GB unless the session ends first
        try:
            for _ in range(20000):
                s.sendall(b"\n" * (1 << 16))
        except OSError:
            pass
    threading.Thread(target=pour, daemon=True).start()
    return "pouring"

def pour_during(n: int, line: str):
    s, block = _channel(), (line + "\n").encode() * 4096
    for _ in range(n // len(block)):
        s.sendall(block)
    return "poured"

def lone_surrogate():
    return "a\ud800b"

def ok():
    return "fine"

def echo(blob: str):
    return {"size": len(blob), "head": blob[:4], "tail": blob[-4:]}

def big(n: int):
    return "r" * n
'''
TOOLS = ("forge_guess", "forge_own", "forge_next", "forge_huge", "forge_outcome", "forge_infrastructure",
         "forge_bytes", "flood", "pour_newlines", "pour_during", "lone_surrogate", "ok", "echo", "big")


def abuse_env() -> Environment:
    return Environment(name="channel-abuse", tools=[FunctionDoc(name=n) for n in TOOLS], code=CHANNEL_ABUSE)


def run_each(h: PoolHandle, calls: list[tuple[str, dict]]) -> tuple[list[ToolObservation], str, int]:
    """Run the calls, each followed by `ok`, in one session, beside a neighbour that holds changed state."""
    pool = h.pool

    async def scenario() -> tuple[list[ToolObservation], str, int]:
        neighbour = await pool.open(retail_functions_env())
        await pool.call(neighbour, "cancel_pending_order", {"order_id": "W1001", "reason": "r"})
        session = await pool.open(abuse_env())
        out = []
        for tool, args in calls:
            out += [await pool.call(session, tool, args), await pool.call(session, "ok", {})]
        order = await pool.call(neighbour, "get_order_details", {"order_id": "W1001"})
        await pool.close(session)
        await pool.close(neighbour)
        return out, json.loads(order.output)["status"], pool.replaced

    return h.run(scenario())


def test_forged_replies_never_become_other_calls_observations(sandbox: PoolHandle) -> None:
    tools = ["forge_guess", "forge_own", "forge_next", "forge_huge", "forge_outcome", "forge_infrastructure",
             "forge_bytes", "lone_surrogate"]
    observations, neighbour_status, replaced = run_each(sandbox, [(t, {}) for t in tools])
    got = dict(zip(tools, observations[0::2], strict=True))
    limit = sandbox.pool.cfg.output_limit_bytes
    assert (got["forge_guess"].outcome, got["forge_guess"].output) == ("ok", "real")  # guessed framing: dropped
    assert got["forge_own"].output == "FORGED-OWN"  # its own call, framing read from memory: the tool's to decide
    assert got["forge_next"].output == "real"  # replies for other calls: dropped
    assert got["forge_huge"].truncated and len(got["forge_huge"].output.encode()) < limit + 100  # re-capped
    assert got["forge_outcome"].outcome == "error" and "invalid reply" in (got["forge_outcome"].error or "")
    forged_failure = got["forge_infrastructure"]  # a tool cannot pass its failure off as the sandbox's:
    assert forged_failure.outcome == "error" and "invalid reply" in (forged_failure.error or "")  # no EnvironmentFailure
    assert got["forge_bytes"].output == "a\ufffdb"  # garbage and 200k-deep nesting dropped; a lone surrogate replaced
    assert got["lone_surrogate"].output == "a\ufffdb"
    assert [o.output for o in observations[1::2]] == ["fine"] * len(tools)  # every next call is its own
    assert neighbour_status == "cancelled" and replaced == 0  # the worker and the neighbour never noticed


def test_a_flood_into_the_channel_restarts_only_that_session(sandbox: PoolHandle) -> None:
    (flood, after), neighbour_status, replaced = run_each(sandbox, [("flood", {})])
    assert flood.outcome == "limit" and "flooded its reply channel" in (flood.error or "")
    assert after.output == "fine"
    assert neighbour_status == "cancelled" and replaced == 0


def test_newlines_poured_between_calls_cost_a_neighbour_nothing(sandbox: PoolHandle) -> None:
    """Tool code that leaves a thread writing bare newlines into its channel while no call is pending: the
    worker drops them in one step (cutting a line at a time was quadratic, and neighbours' trivial calls timed out
    after 7-21 s) and stops the session at the flood bound instead of reading all 1.3 GB; the flooder's next call
    is its tool's `limit` (or, where the newlines beat the reply out under load, the pouring call itself is its
    tool's `limit` or `timeout`: CI saw that once). The neighbour's calls are fine either way."""
    pool = sandbox.pool

    async def scenario() -> tuple[ToolObservation, list[ToolObservation], ToolObservation]:
        neighbour = await pool.open(abuse_env())
        session = await pool.open(abuse_env())
        started = await pool.call(session, "pour_newlines", {})
        calls = [await pool.call(neighbour, "ok", {}) for _ in range(200)]
        own = await pool.call(session, "ok", {})
        while started.outcome == "ok" and (own.outcome, own.output) == ("ok", "fine"):  # a starved pouring thread
            own = await pool.call(session, "ok", {})  # may not have reached the bound yet (CI at load 30): it will
        await pool.close(session)
        await pool.close(neighbour)
        return started, calls, own

    started, calls, own = sandbox.run(scenario())
    assert [(c.outcome, c.output) for c in calls] == [("ok", "fine")] * 200
    flooded = [o for o in (started, own) if o.outcome == "limit" and "flooded its reply channel" in (o.error or "")]
    if started.outcome == "ok":  # the flood came after the reply: stopped between calls, or during the next one
        assert started.output == "pouring" and flooded == [own], own
    else:  # under load the newlines can beat the reply out: that call is its tool's failure (the flood bound, or
        # its time spent blocked behind its own flood), and the next one finds the session fresh
        assert flooded == [started] or started.outcome == "timeout", started
        assert (own.outcome, own.output) == ("ok", "fine"), own
    assert sandbox.pool.replaced == 0


def test_lines_written_into_the_channel_during_a_call_cost_the_worker_a_search_not_a_parse(sandbox: PoolHandle) -> None:
    """Bare newlines, then junk lines, written into the channel by the tool's own call, up to just under the flood
    bound: the call is still answered, its reply found among them. Only a line holding the call's nonce is parsed,
    so the worker spends a pass over the bytes: 4 ms and 2 ms of its CPU here. Parsed a line at a time, 2.2 MB of them
    cost it 0.2 s (newlines) and 3.3 s (junk), and a neighbour's call in flight waited as long (issue 35)."""
    pool = sandbox.pool
    under_bound = 20 * pool.cfg.output_limit_bytes + (1 << 20) - (1 << 16)

    async def worker_cpu_s() -> float:
        return sum(w["cpu_s"] for w in await pool.ping())

    async def scenario() -> list[tuple[ToolObservation, float]]:
        session = await pool.open(abuse_env())
        out = []
        for line in ("", "x"):
            before = await worker_cpu_s()
            obs = await pool.call(session, "pour_during", {"n": under_bound, "line": line})
            out.append((obs, await worker_cpu_s() - before))
        out.append((await pool.call(session, "ok", {}), 0.0))
        await pool.close(session)
        return out

    (newlines, newlines_cpu), (junk, junk_cpu), (after, _) = sandbox.run(scenario())
    assert [(o.outcome, o.output) for o in (newlines, junk, after)] == [("ok", "poured")] * 2 + [("ok", "fine")]
    assert newlines_cpu < 0.1 and junk_cpu < 0.1, (newlines_cpu, junk_cpu)


def test_odd_tool_names_and_arguments_are_the_callers_error(sandbox: PoolHandle) -> None:
    pool = sandbox.pool

    async def scenario() -> list[ToolObservation]:
        session = await pool.open(abuse_env())
        out = [await pool.call(session, "ok\ud800", {}), await pool.call(session, "echo", {"blob": "a\ud800"}),
               await pool.call(session, "echo", {"blob": {1, 2}}), await pool.call(session, "ok", {})]  # type: ignore[dict-item]
        await pool.close(session)
        return out

    name, surrogate_arg, not_json, after = sandbox.run(scenario())
    assert name.outcome == "error" and "unknown tool" in (name.error or "")
    assert surrogate_arg.outcome == "error" and "not JSON" in (surrogate_arg.error or "")
    assert not_json.outcome == "error" and "not JSON" in (not_json.error or "")
    assert after.output == "fine"


def test_invalid_replies_become_error_observations_not_exceptions() -> None:
    for reply in ({"outcome": "pwned"}, {"outcome": "ok", "output": 5}, {"outcome": "ok", "truncated": "yes", "output": "x"},
                  {}, {"outcome": "error", "error": ["a"]}):
        obs = _observation(reply, 0.0)
        assert isinstance(obs, ToolObservation)
        if reply.get("truncated") == "yes":
            assert (obs.outcome, obs.truncated) == ("ok", False)
        else:
            assert obs.outcome == "error" and "invalid reply" in (obs.error or "")


@pytest.fixture(scope="module", params=["process", pytest.param("docker", marks=pytest.mark.docker)])
def roomy(request: pytest.FixtureRequest):
    """A pool whose calls may return as much as they may take: 4 MiB each way."""
    yield from start_pool(request.param, output_limit_bytes=4 << 20)


def test_large_arguments_and_results_up_to_the_configured_size(roomy: PoolHandle) -> None:
    pool = roomy.pool
    limit = pool.cfg.message_limit_bytes
    assert limit >= 4_000_000

    async def scenario() -> list[ToolObservation]:
        session = await pool.open(abuse_env())
        out = [await pool.call(session, "echo", {"blob": "a" * n + "tail"}) for n in (300_000, limit - 1000)]
        out.append(await pool.call(session, "echo", {"blob": "a" * (limit + 1)}))  # over the limit: the caller's error
        out.append(await pool.call(session, "big", {"n": 3_000_000}))
        out.append(await pool.call(session, "ok", {}))
        await pool.close(session)
        return out

    small, large, too_large, result, after = roomy.run(scenario())
    assert json.loads(small.output) == {"size": 300_004, "head": "aaaa", "tail": "tail"}
    assert json.loads(large.output)["size"] == limit - 1000 + 4
    assert too_large.outcome == "error" and "message_limit_bytes" in (too_large.error or "")
    assert (result.outcome, len(result.output), result.truncated) == ("ok", 3_000_000, False)
    assert after.output == "fine"
