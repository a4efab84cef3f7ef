"""The lake's writers' lock on one machine: waiters queue in the kernel, give up cleanly, and are counted."""

from __future__ import annotations

import fcntl
import os
import threading

import pytest

from arenaforge.schemas.errors import WarehouseError
from arenaforge.warehouse.writer_lock import FileWriterLock, lock_waits


def _hold_elsewhere(path) -> int:
    """Another holder of the lock (an open file description of its own, as another process has)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def test_a_waiter_that_gives_up_leaves_the_lock_free_once_the_holder_lets_go(tmp_path):
    lock = FileWriterLock(tmp_path / "write.lock")
    holder = _hold_elsewhere(lock.path)
    with pytest.raises(WarehouseError, match="stayed locked by another writer"), lock.hold(0.2):
        pass
    os.close(holder)
    # the abandoned waiter is granted the lock and must drop it at once: else this waits for ever
    with lock.hold(60):
        assert not _try_other(lock.path)  # and now this holder really holds it


def test_a_waiting_writer_gets_the_lock_when_the_holder_lets_go_and_its_wait_is_counted(tmp_path):
    lock = FileWriterLock(tmp_path / "write.lock")
    holder = _hold_elsewhere(lock.path)
    before = len(lock_waits())
    got = threading.Event()

    def writer() -> None:
        with lock.hold(60):
            got.set()

    thread = threading.Thread(target=writer)
    thread.start()
    assert not got.is_set()  # still held elsewhere
    os.close(holder)
    thread.join(60)
    assert got.is_set()
    waits = lock_waits()[before:]
    assert len(waits) == 1 and waits[0] >= 0


def _try_other(path) -> bool:
    fd = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except BlockingIOError:
        return False
    finally:
        os.close(fd)
