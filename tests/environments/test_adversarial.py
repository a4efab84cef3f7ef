"""Hostile tool code, on both backends: every attack ends in an observation, the pool stays healthy,
and the next call (in the same session) succeeds."""

from __future__ import annotations

import asyncio
import os
import socket
import time
from pathlib import Path

import pytest

from arenaforge.environments.runtime import SessionLost
from arenaforge.schemas.models import ToolObservation
from tests.environments.conftest import HOST_SECRET, PoolHandle
from tests.environments.toolsets import adversarial_env

FAST = 1.5  # call timeout for attacks that only stop when killed


def attack(h: PoolHandle, tool: str, args: dict | None = None, timeout_s: float | None = None) -> tuple[ToolObservation, ToolObservation]:
    """Run `tool` in a fresh session, then a normal call in the same session."""
    pool = h.pool

    async def scenario() -> tuple[ToolObservation, ToolObservation]:
        session = await pool.open(adversarial_env())
        try:
            bad = await pool.call(session, tool, args or {}, timeout_s=timeout_s)
            after = await pool.call(session, "get_order_details", {"order_id": "W1001"})
            return bad, after
        finally:
            await pool.close(session)

    bad, after = h.run(scenario())
    assert after.outcome == "ok" and '"pending"' in after.output, after
    assert h.pool.stats()["workers"] == h.pool.cfg.pool_size
    return bad, after


def needs_uid_isolation(h: PoolHandle) -> None:
    if h.backend == "process" and not h.pool.info.get("setuid"):
        pytest.skip("optional: the process backend run without root shares one uid (a documented gap)")


def test_infinite_loop_times_out(sandbox: PoolHandle) -> None:
    bad, _ = attack(sandbox, "spin", timeout_s=FAST)
    assert bad.outcome == "timeout"
    assert FAST <= bad.duration_s < FAST + 10
    assert "Timeout" in bad.text()


def test_fork_bomb_is_contained(sandbox: PoolHandle) -> None:
    bad, _ = attack(sandbox, "fork_bomb", timeout_s=FAST)
    assert bad.outcome in ("error", "timeout", "limit")
    if bad.outcome == "error":
        assert "BlockingIOError" in (bad.error or "") or "Resource temporarily unavailable" in (bad.error or "")


def test_memory_hog_hits_the_limit(sandbox: PoolHandle) -> None:
    bad, _ = attack(sandbox, "hog_memory", timeout_s=10)
    assert bad.outcome == "limit"
    assert "memory" in (bad.error or "").lower() or "killed" in (bad.error or "")


@pytest.mark.parametrize("tool", ["flood_return", "flood_print"])
def test_huge_output_is_truncated_with_a_marker(sandbox: PoolHandle, tool: str) -> None:
    bad, _ = attack(sandbox, tool, timeout_s=20)
    limit = sandbox.pool.cfg.output_limit_bytes
    assert bad.outcome == "ok" and bad.truncated
    assert "[truncated:" in bad.output
    assert limit <= len(bad.output.encode()) < limit + 200


def test_writes_to_stdio_fds_do_not_reach_the_protocol(sandbox: PoolHandle) -> None:
    bad, _ = attack(sandbox, "flood_fd", timeout_s=20)
    assert (bad.outcome, bad.output) == ("ok", "done")


def test_host_secrets_are_invisible(sandbox: PoolHandle, tmp_path: Path) -> None:
    needs_uid_isolation(sandbox)
    assert os.environ.get("ARENAFORGE_TEST_SECRET") == HOST_SECRET
    secret_file = tmp_path / "secret.txt"
    secret_file.write_text(HOST_SECRET)
    secret_file.chmod(0o600)
    env_dump, _ = attack(sandbox, "environ_dump")
    assert env_dump.outcome == "ok"
    assert HOST_SECRET not in env_dump.output
    assert "ARENAFORGE" not in env_dump.output
    shadow, _ = attack(sandbox, "read_path", {"path": "/etc/shadow"})
    assert shadow.outcome == "error" and "PermissionError" in (shadow.traceback or "")
    host_file, _ = attack(sandbox, "read_path", {"path": str(secret_file)})
    assert host_file.outcome == "error"
    assert HOST_SECRET not in host_file.output + (host_file.error or "")
    hidden = sandbox.backend == "docker" or sandbox.pool.info.get("namespaces")  # the host's /tmp is not its /tmp
    assert ("FileNotFoundError" if hidden else "PermissionError") in (host_file.traceback or "")


def test_network_is_unreachable(sandbox: PoolHandle) -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    listener.setblocking(False)
    try:
        port = listener.getsockname()[1]
        bad, _ = attack(sandbox, "connect", {"host": "127.0.0.1", "port": port})
        assert bad.outcome == "error"
        refusals = ("PermissionError", "ConnectionRefusedError", "Network is unreachable")  # no socket, or nowhere to go
        assert any(e in (bad.traceback or "") for e in refusals), bad
        with pytest.raises(BlockingIOError):
            listener.accept()  # nothing ever connected
        outside, _ = attack(sandbox, "connect", {"host": "1.1.1.1", "port": 53})
        assert outside.outcome in ("error", "timeout")
    finally:
        listener.close()


def test_writes_stay_in_the_private_scratch_dir(sandbox: PoolHandle, tmp_path: Path) -> None:
    ok, _ = attack(sandbox, "scratch_roundtrip")
    assert ok.outcome == "ok" and ok.output.endswith(":kept")
    scratch = ok.output.rsplit(":", 1)[0]
    needs_uid_isolation(sandbox)
    for path in ("/etc/owned", "/opt/arenaforge/worker/server.py", "/usr/lib/owned"):
        bad, _ = attack(sandbox, "write_file", {"path": path})
        assert bad.outcome == "error"
        assert any(e in (bad.traceback or "") for e in ("Read-only file system", "PermissionError", "FileNotFoundError"))
    if sandbox.backend == "process":
        target = tmp_path / "locked"
        target.mkdir(mode=0o777)  # even a world-writable host dir is out of reach
        bad, _ = attack(sandbox, "write_file", {"path": str(target / "owned")})
        assert bad.outcome == "error" if sandbox.pool.info.get("namespaces") else True
        assert not (target / "owned").exists()
    other, _ = attack(sandbox, "read_path", {"path": f"{scratch}/note.txt"})
    assert other.outcome == "error"  # a closed session's scratch is gone, and never another session's to read


def test_runs_as_a_non_root_session_uid(sandbox: PoolHandle) -> None:
    who, _ = attack(sandbox, "whoami")
    assert who.outcome == "ok"
    assert '"uid": 0' not in who.output


def test_killing_its_own_worker_fails_and_exit_is_contained(sandbox: PoolHandle) -> None:
    needs_uid_isolation(sandbox)
    kill, _ = attack(sandbox, "kill_parent")
    assert kill.outcome == "error" and "PermissionError" in (kill.traceback or "")
    exit_, _ = attack(sandbox, "exit_hard")
    assert exit_.outcome == "limit" and "exited with code 3" in (exit_.error or "")


def test_segfault_is_contained(sandbox: PoolHandle) -> None:
    bad, _ = attack(sandbox, "segfault")
    assert bad.outcome == "limit" and "SIGSEGV" in (bad.error or "")


def test_state_resets_after_a_crash(sandbox: PoolHandle) -> None:
    pool = sandbox.pool

    async def scenario() -> list[ToolObservation]:
        session = await pool.open(adversarial_env())
        try:
            return [
                await pool.call(session, "cancel_pending_order", {"order_id": "W1001", "reason": "r"}),
                await pool.call(session, "spin", {}, timeout_s=1.0),
                await pool.call(session, "get_order_details", {"order_id": "W1001"}),
            ]
        finally:
            await pool.close(session)

    obs = sandbox.run(scenario())
    assert [o.outcome for o in obs] == ["ok", "timeout", "ok"]
    assert "initial state" in (obs[1].error or "")
    assert '"pending"' in obs[2].output


def test_a_stuck_call_does_not_block_other_sessions(sandbox: PoolHandle) -> None:
    pool = sandbox.pool
    stuck_timeout = 6.0

    async def scenario() -> tuple[ToolObservation, list[float], float]:
        stuck_session = await pool.open(adversarial_env())
        started = time.monotonic()
        stuck = asyncio.ensure_future(pool.call(stuck_session, "sleep_forever", {}, timeout_s=stuck_timeout))
        stuck_done: list[float] = []
        stuck.add_done_callback(lambda _: stuck_done.append(time.monotonic() - started))

        async def quick(i: int) -> float:
            session = await pool.open(adversarial_env())
            for _ in range(3):
                obs = await pool.call(session, "get_user_balance", {"user_id": "u2"})
                assert obs.output == "5.0"
            await pool.close(session)
            return time.monotonic() - started

        finished = await asyncio.gather(*(quick(i) for i in range(20)))
        queued = asyncio.ensure_future(pool.call(stuck_session, "get_user_balance", {"user_id": "u1"}))
        result = await stuck
        after = await queued
        assert after.outcome == "ok" and after.output == "100.0"  # the same session's next call queued behind it
        await pool.close(stuck_session)
        return result, finished, stuck_done[0]

    stuck, finished, stuck_at = sandbox.run(scenario())
    assert stuck.outcome == "timeout"
    assert stuck_at >= stuck_timeout
    assert max(finished) < stuck_at  # all 60 other calls finished while the stuck one was still running


def test_a_dead_worker_is_replaced_and_its_sessions_are_told(sandbox: PoolHandle) -> None:
    pool = sandbox.pool

    async def scenario() -> tuple[BaseException | None, ToolObservation, int]:
        session = await pool.open(adversarial_env())
        before = pool.replaced
        await session.worker.transport.kill()  # the container / process vanishes under the session
        lost = None
        try:
            await pool.call(session, "get_order_details", {"order_id": "W1001"})
        except SessionLost as err:
            lost = err
        second = await pool.call(session, "get_user_balance", {"user_id": "u1"})
        await pool.close(session)
        deadline = time.monotonic() + 60
        while pool.stats()["workers"] < pool.cfg.pool_size and time.monotonic() < deadline:
            await asyncio.sleep(0.05)  # the replacement starts by itself; wait for that condition
        return lost, second, pool.replaced - before

    lost, second, replaced = sandbox.run(scenario())
    assert isinstance(lost, SessionLost) and "state was lost" in str(lost)  # an environment failure, not the agent's
    assert second.outcome == "ok" and second.output == "100.0"  # the next call runs from the initial state
    assert replaced == 1
    assert pool.stats()["workers"] == pool.cfg.pool_size
