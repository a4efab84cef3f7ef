"""The Prefect stack behind `arenaforge serve`: server, work pool, limits, deployments, worker.

Owns process lifecycle only. What gets deployed (names, parameters, schedules) lives in
`arenaforge/flows/deployments.py`; the flows themselves in `flows/*_flows.py`.

`Stack` brings everything up in order and tears it down in reverse:
  1. a Prefect server subprocess (SQLite under `prefect.home`, or Postgres from
     `prefect.database_url`), or an existing API when `prefect.api_url` is set;
  2. the process work pool and the global concurrency limits (`model-endpoint`, `sandbox`);
  3. one deployment per entry of `arenaforge.flows.registry.FLOWS`;
  4. a `prefect worker` subprocess that runs flow runs as child processes.
Flow runs work in the user's project directory (`project_dir` in config, else the directory
`serve` was started in), never in the install directory: relative paths in run parameters,
the default `./out` and a relative warehouse path all resolve there. Deployments name their
flows by module path, so a wheel install works as well as a checkout.
Server and worker run in their own process groups, so one Ctrl-C in the terminal reaches
only `arenaforge serve`, which then stops the worker (and its flow runs) before the server.
Telemetry and analytics are off in every process we start.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arenaforge.schemas.config import Config
from arenaforge.schemas.errors import ArenaforgeError, ConfigError
from arenaforge.warehouse import absolute_location

# Everything Prefect could phone home with, off. Set for the server, the worker, flow runs
# and this process's client.
PHONE_HOME_OFF = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "1",
    "PREFECT_SERVER_UI_SHOW_PROMOTIONAL_CONTENT": "false",
    "PREFECT_CLOUD_ENABLE_ORCHESTRATION_TELEMETRY": "false",
}


class PrefectUnavailable(ArenaforgeError):
    """The Prefect API does not answer (server not started, wrong URL)."""


def quiet_env() -> None:
    """Turn telemetry off in this process (before prefect is imported anywhere)."""
    os.environ.update(PHONE_HOME_OFF)


def api_healthy(api_url: str, timeout_s: float = 2.0) -> bool:
    """True when `<api_url>/health` answers 200."""
    try:
        with urllib.request.urlopen(f"{api_url.rstrip('/')}/health", timeout=timeout_s) as resp:
            return resp.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def require_api(api_url: str) -> None:
    """Raise a one-line user error when the API is down."""
    if not api_healthy(api_url):
        raise PrefectUnavailable(
            f"Prefect API at {api_url} does not answer; start it with `arenaforge serve` "
            "(or set prefect.api_url to a running server)"
        )


def api_url_for(cfg: Config) -> str:
    return cfg.prefect.api_url or f"http://127.0.0.1:{cfg.prefect.port}/api"


def project_root(cfg: Config) -> Path:
    """The user's project directory: `project_dir` from config (relative to here), else the working directory."""
    root = Path(cfg.project_dir or ".").expanduser().resolve()
    if not root.is_dir():
        raise ConfigError(f"project_dir {root} is not a directory")
    return root


def in_project(cfg: Config, path: str | Path) -> Path:
    """`path` as flow runs see it: relative paths resolve against the project directory."""
    return (project_root(cfg) / Path(path).expanduser()).resolve()


def _wait(predicate: Any, deadline_s: float, what: str, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + deadline_s
    delay = 0.1
    while not predicate():
        if proc is not None and proc.poll() is not None:
            raise ArenaforgeError(f"{what}: process exited with code {proc.returncode} (see its log)")
        if time.monotonic() > deadline:
            raise ArenaforgeError(f"{what}: not ready after {deadline_s:.0f}s")
        time.sleep(delay)
        delay = min(delay * 1.5, 1.0)


def _die_with_parent(sig: int) -> Any:
    """preexec_fn: the child gets `sig` if `arenaforge serve` dies without cleaning up (Linux only).

    The server gets SIGTERM; the worker SIGKILL, because with the API gone its graceful shutdown
    retries forever (its flow runs then fail on their own when they cannot reach the API).
    """

    def arm() -> None:
        try:
            import ctypes

            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, int(sig))  # 1 = PR_SET_PDEATHSIG
        except (OSError, AttributeError):  # not Linux: the normal stop path still applies
            pass

    return arm


def stop_process(proc: subprocess.Popen | None, grace_s: float = 20.0) -> int | None:
    """SIGINT then SIGTERM then SIGKILL to the process's whole group; its exit code."""
    if proc is None or proc.poll() is not None:
        return None if proc is None else proc.returncode
    for sig, wait_s in ((signal.SIGINT, grace_s), (signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        try:
            return proc.wait(timeout=wait_s)
        except subprocess.TimeoutExpired:
            continue
    return proc.poll()


@dataclass
class Stack:
    """The running Prefect stack; use as a context manager (`with Stack(cfg) as s: ...`)."""

    cfg: Config
    flows: Mapping[str, str] | None = None  # deployment name -> "module:function"; default registry.FLOWS
    port: int | None = None
    home: Path | None = None
    log_dir: Path | None = None
    worker: bool = True
    extra_env: dict[str, str] = field(default_factory=dict)
    server_timeout_s: float = 120.0

    api_url: str = ""
    server_proc: subprocess.Popen | None = None
    worker_proc: subprocess.Popen | None = None
    deployments: dict[str, str] = field(default_factory=dict)  # name -> "flow-name/deployment-name"
    _saved_api_url: str | None = None  # this process's PREFECT_API_URL before start; put back on stop

    # ------------------------------------------------------------------ env
    def child_env(self) -> dict[str, str]:
        """Environment for server, worker and (inherited by) flow runs."""
        env = dict(os.environ)
        env.update(PHONE_HOME_OFF)
        env["PREFECT_HOME"] = str(self._home())
        env["PREFECT_API_URL"] = self.api_url
        # Flow runs resolve config exactly as this process did: absolute warehouse, same TOML.
        project = project_root(self.cfg)
        env["ARENAFORGE_WAREHOUSE__PATH"] = absolute_location(self.cfg.warehouse.path, project)
        if self.cfg.warehouse.data_path:
            env["ARENAFORGE_WAREHOUSE__DATA_PATH"] = absolute_location(self.cfg.warehouse.data_path, project)
        env.pop("ARENAFORGE_DB", None)
        if os.environ.get("ARENAFORGE_CONFIG"):
            env["ARENAFORGE_CONFIG"] = str(Path(os.environ["ARENAFORGE_CONFIG"]).resolve())
        elif Path("arenaforge.toml").exists():
            env["ARENAFORGE_CONFIG"] = str(Path("arenaforge.toml").resolve())
        # Poll often: a UI click should start a run within a couple of seconds.
        env.setdefault("PREFECT_WORKER_QUERY_SECONDS", "2")
        env.setdefault("PREFECT_WORKER_PREFETCH_SECONDS", "5")
        env.update(self.extra_env)
        return env

    def project_dir(self) -> Path:
        return project_root(self.cfg)

    def _home(self) -> Path:
        return in_project(self.cfg, self.home or self.cfg.prefect.home)

    def _logs(self) -> Path:
        path = (self.log_dir or self._home() / "logs").resolve()
        path.mkdir(parents=True, exist_ok=True)
        return path

    # ------------------------------------------------------------------ lifecycle
    def __enter__(self) -> "Stack":
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def start(self) -> None:
        quiet_env()
        self._home().mkdir(parents=True, exist_ok=True)
        if self.cfg.prefect.api_url:
            self.api_url = self.cfg.prefect.api_url.rstrip("/")
            require_api(self.api_url)
        else:
            self._start_server()
        self._saved_api_url = os.environ.get("PREFECT_API_URL")
        os.environ["PREFECT_API_URL"] = self.api_url  # this process's client talks to it too
        from arenaforge.flows.deployments import apply_deployments, ensure_concurrency_limits, ensure_work_pool

        with self.client_settings():
            ensure_work_pool(self.cfg.prefect.work_pool)
            ensure_concurrency_limits(
                {"model-endpoint": self.cfg.prefect.model_endpoint_limit, "sandbox": self.cfg.prefect.sandbox_limit}
            )
            self.deployments = apply_deployments(self.cfg, self.flows, env=self._flow_run_env(),
                                                 working_dir=self.project_dir())
        if self.worker:
            self._start_worker()

    def _flow_run_env(self) -> dict[str, str]:
        env = self.child_env()
        keep = [k for k in env if k.startswith(("ARENAFORGE_", "PREFECT_SERVER_ANALYTICS", "DO_NOT_TRACK"))]
        return {k: env[k] for k in keep + (["PYTHONPATH"] if "PYTHONPATH" in env else [])}

    @contextlib.contextmanager
    def client_settings(self) -> Iterator[None]:
        from prefect.settings import PREFECT_API_URL, temporary_settings

        with temporary_settings(updates={PREFECT_API_URL: self.api_url}):
            yield

    def _start_server(self) -> None:
        port = self.port or self.cfg.prefect.port
        self.api_url = f"http://127.0.0.1:{port}/api"
        if api_healthy(self.api_url):
            raise ConfigError(
                f"port {port} already has a Prefect API; set prefect.api_url = '{self.api_url}' to use it, "
                "or prefect.port to start another"
            )
        env = self.child_env()
        env.pop("PREFECT_API_URL")  # the server must not think it is a client of itself
        if self.cfg.prefect.database_url:
            env["PREFECT_SERVER_DATABASE_CONNECTION_URL"] = self.cfg.prefect.database_url
        env["PREFECT_UI_API_URL"] = self.api_url
        log = open(self._logs() / "server.log", "ab")  # noqa: SIM115 (closed with the process)
        self.server_proc = subprocess.Popen(
            [sys.executable, "-m", "prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_parent(signal.SIGTERM),
        )
        log.close()
        _wait(lambda: api_healthy(self.api_url), self.server_timeout_s, "Prefect server", self.server_proc)

    def _start_worker(self) -> None:
        log = open(self._logs() / "worker.log", "ab")  # noqa: SIM115
        self.worker_proc = subprocess.Popen(
            [
                sys.executable, "-m", "prefect", "worker", "start",
                "--pool", self.cfg.prefect.work_pool, "--type", "process",
                "--limit", str(self.cfg.prefect.worker_limit), "--name", "arenaforge-worker",
            ],
            env=self.child_env(),
            cwd=str(self.project_dir()),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            preexec_fn=_die_with_parent(signal.SIGKILL),
        )
        log.close()
        _wait(self._worker_online, 60.0, "Prefect worker", self.worker_proc)

    def _worker_online(self) -> bool:
        from prefect.client.orchestration import get_client

        with self.client_settings(), get_client(sync_client=True) as client:
            workers = client.read_workers_for_work_pool(self.cfg.prefect.work_pool)
        return any(w.name == "arenaforge-worker" and str(w.status).upper().endswith("ONLINE") for w in workers)

    def stop(self) -> None:
        """Worker first (it cancels its flow-run children), then the server."""
        stop_process(self.worker_proc)
        stop_process(self.server_proc)
        # a stopped stack must not leave later clients in this process pointing at a dead server
        if os.environ.get("PREFECT_API_URL") == self.api_url:
            if self._saved_api_url is None:
                os.environ.pop("PREFECT_API_URL", None)
            else:
                os.environ["PREFECT_API_URL"] = self._saved_api_url

    def alive(self) -> bool:
        procs = [p for p in (self.server_proc, self.worker_proc) if p is not None]
        return all(p.poll() is None for p in procs)

    def ui_url(self) -> str:
        return self.api_url[: -len("/api")] if self.api_url.endswith("/api") else self.api_url

    def wait(self) -> None:
        """Block until Ctrl-C, SIGTERM or a child dies; the caller's `with` then stops everything."""

        def interrupt(signum: int, frame: object) -> None:
            raise KeyboardInterrupt

        # SIGINT may arrive ignored (started with `&`/nohup); serve is interactive, so take it back.
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, interrupt)
        with contextlib.suppress(KeyboardInterrupt):
            while self.alive():
                time.sleep(0.5)
