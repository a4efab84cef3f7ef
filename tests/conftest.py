"""Shared fixtures: a warehouse in tmp_path, the scripted OpenAI-compatible server, shared data."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("DO_NOT_TRACK", "1")
# A loaded CI box can take longer than the default 20 s to start the ephemeral API of in-process flow runs.
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "120")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

from arenaforge.warehouse import Warehouse  # noqa: E402
from tests.support.requirements import require_shared_data  # noqa: E402


def pytest_configure(config: pytest.Config) -> None:
    # Under pytest-xdist (scripts/test.sh) each worker becomes a session of its own, so the kernel schedules it as an
    # autogroup of its own, as a lone pytest is: the sandbox's niced workers (sandbox.nice) then yield only to their
    # own worker's pool, never to the other worker's test, which would starve them into `Overloaded`.
    if os.environ.get("PYTEST_XDIST_WORKER"):
        try:
            os.setsid()
        except OSError:  # already a session or group leader: it has its own autogroup
            pass


@pytest.fixture
def tmp_warehouse(tmp_path: Path) -> Warehouse:
    return Warehouse(tmp_path / "test.duckdb", lock_timeout_s=30)


@pytest.fixture
def shared_data() -> Path:
    return require_shared_data()


@pytest.fixture
def scripted_openai() -> Iterator["ScriptedOpenAI"]:  # noqa: F821
    from arenaforge.testing.scripted_openai import ScriptedOpenAI

    server = ScriptedOpenAI()
    server.start()
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def prefect_server(tmp_path_factory) -> Iterator["PrefectServer"]:  # noqa: F821
    """One real Prefect server for the whole session; PREFECT_API_URL points at it."""
    from tests.support.prefect_server import PrefectServer

    server = PrefectServer(tmp_path_factory.mktemp("prefect-home"))
    server.start()
    saved = {k: os.environ.get(k) for k in server.env()}
    os.environ.update(server.env())
    try:
        yield server
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        server.stop()


@pytest.fixture(scope="session")
def served(prefect_server, tmp_path_factory) -> Iterator["Stack"]:  # noqa: F821
    """`arenaforge serve` against the session server: work pool, limits, every deployment
    (FLOWS plus the `probe` test flow), a worker; flow runs write to `served.warehouse`."""
    from tests.support.served import start_served

    stack = start_served(prefect_server, tmp_path_factory.mktemp("served"))
    try:
        yield stack
    finally:
        stack.stop()
