"""A busy SQLite catalog: a lake's reads and writes retry in milliseconds instead of SQLite's 1 s sleeps."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

from arenaforge.warehouse import Warehouse
from arenaforge.warehouse.lake import busy_retries

# Another process takes SQLite's PENDING byte of the catalog, as a closing SQLite connection does for a
# moment, and holds it until told to let go (a line on stdin). New catalog connections then find it busy.
_HOLD_PENDING = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.lockf(fd, fcntl.LOCK_EX, 1, 0x40000000, 0)
print("held", flush=True)
sys.stdin.readline()
"""


def _until(condition, timeout_s: float = 120) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.005)


def _busy_while(catalog, action) -> tuple[list, int]:
    """Run `action` in a thread while the catalog is busy; let go once it has retried. (results, retries)"""
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_PENDING, str(catalog)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = busy_retries()
        results: list = []
        thread = threading.Thread(target=lambda: results.append(action()))
        thread.start()
        _until(lambda: busy_retries() > before + 2)  # it failed fast and keeps trying, not sleeping 1 s in SQLite
        holder.stdin.write("go\n")
        holder.stdin.flush()
        thread.join(120)
        assert not thread.is_alive()
        return results, busy_retries() - before
    finally:
        holder.kill()
        holder.wait()


def test_a_read_and_a_write_retry_a_busy_catalog_and_succeed(tmp_path):
    wh = Warehouse(tmp_path / "w.lake")
    wh.query("INSERT INTO llm_cache (key, model, request, response) VALUES ('a', 'm', '{}', '{}')")
    catalog = tmp_path / "w.lake" / "catalog.sqlite"

    results, retries = _busy_while(catalog, lambda: wh.query("SELECT key FROM llm_cache")[1])
    assert results == [[("a",)]] and retries > 2

    write = "INSERT INTO llm_cache (key, model, request, response) VALUES ('b', 'm', '{}', '{}')"
    results, retries = _busy_while(catalog, lambda: wh.query(write))
    assert len(results) == 1 and retries > 2
    assert wh.query("SELECT key FROM llm_cache ORDER BY key")[1] == [("a",), ("b",)]


def test_a_slow_query_draws_no_progress_bar_on_stdout(tmp_path):
    # DuckDB draws its bar on stdout after 2 s even into a pipe: a test writer's "ready" line got it under load
    script = ("from arenaforge.warehouse import Warehouse; wh = Warehouse(__import__('sys').argv[1]); "
              "wh.query('SELECT sum(hash(i)) FROM range(400000000) t(i)'); print('done')")
    out = subprocess.run([sys.executable, "-c", script, str(tmp_path / "w.lake")], capture_output=True, text=True,
                         check=True).stdout
    assert out == "done\n"
