"""The real Harbor CLI (PyPI `harbor`) run on exported task directories: `harbor lint` and `harbor run`.

Harbor needs Python >= 3.12 and Docker Compose v2, so it lives in a venv of its own that
`scripts/setup-harbor.sh` builds once per machine under ~/.cache/arenaforge/harbor (ARENAFORGE_CACHE moves it).
This module only finds that install and reads what Harbor wrote (trial result.json files); exporting the tasks
is `export.write_harbor`'s job. Used by `arenaforge bench harbor-run` and tests/tasks/envs/test_harbor_cli.py.
"""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from arenaforge.schemas.errors import InputError


@dataclass(frozen=True)
class HarborInstall:
    harbor: Path  # the CLI in its own venv
    docker_config: Path  # DOCKER_CONFIG whose cli-plugins hold Compose v2

    def env(self, **extra: str) -> dict[str, str]:
        # LiteLLM (a Harbor dependency) fetches a price list from the internet at import unless told not to
        return {**os.environ, "DOCKER_CONFIG": str(self.docker_config), "LITELLM_LOCAL_MODEL_COST_MAP": "True",
                **extra}


@dataclass(frozen=True)
class TrialOutcome:
    task: str
    reward: float | None  # None when the trial ended in an error (no verifier result)
    error: str | None  # Harbor's exception type and message
    seconds: float  # the trial's wall time, as Harbor recorded it


def cache_dir() -> Path:
    return Path(os.environ.get("ARENAFORGE_CACHE") or Path.home() / ".cache" / "arenaforge") / "harbor"


def find_harbor() -> HarborInstall:
    """The install scripts/setup-harbor.sh made; a one-line InputError naming that script when it is missing."""
    root = cache_dir()
    install = HarborInstall(root / "venv" / "bin" / "harbor", root / "docker-config")
    if not install.harbor.is_file() or not (install.docker_config / "cli-plugins" / "docker-compose").is_file():
        raise InputError(f"no Harbor install under {root}: run `bash scripts/setup-harbor.sh` (Python 3.12 venv with "
                         "PyPI harbor and Docker Compose v2)")
    return install


def lint(install: HarborInstall, task_dirs: list[Path], select_all: bool = False) -> tuple[bool, list[dict]]:
    """`harbor lint` (default rules, or every rule): (passed, findings as Harbor reports them)."""
    cmd = [str(install.harbor), "lint", "--json", *(["--select", "ALL"] if select_all else []), *map(str, task_dirs)]
    done = subprocess.run(cmd, env=install.env(), capture_output=True, text=True, timeout=600)
    try:
        findings = json.loads(done.stdout or "[]")
    except json.JSONDecodeError as err:
        raise RuntimeError(f"harbor lint printed no JSON (exit {done.returncode}): {done.stderr[-2000:]}") from err
    return done.returncode == 0 and not findings, findings


def run_job(install: HarborInstall, tasks: Path, agent: str, jobs_dir: Path, job_name: str, n_concurrent: int = 2,
            extra_args: list[str] | None = None, extra_env: dict[str, str] | None = None,
            timeout_s: float = 3600) -> list[TrialOutcome]:
    """`harbor run -p TASKS -a AGENT` with the local docker environment; one outcome per trial, by task name.

    `agent` is a built-in name (oracle, nop) or an import path `module:Class` (found on PYTHONPATH in extra_env);
    `extra_args` go to `harbor run` as they are (agent kwargs: `--ak key=value`).
    """
    cmd = [str(install.harbor), "run", "-p", str(tasks), "-a", agent, "-e", "docker", "-o", str(jobs_dir),
           "--job-name", job_name, "-n", str(n_concurrent), "-q", "-y", *(extra_args or [])]
    done = subprocess.run(cmd, env=install.env(**(extra_env or {})), capture_output=True, text=True,
                          timeout=timeout_s, stdin=subprocess.DEVNULL)
    job = jobs_dir / job_name
    results = sorted(p for p in job.glob("*/result.json"))
    if done.returncode != 0 and not results:
        raise RuntimeError(f"harbor run failed (exit {done.returncode}): {(done.stderr or done.stdout)[-3000:]}")
    return sorted((_outcome(json.loads(p.read_text())) for p in results), key=lambda o: o.task)


def _outcome(result: dict) -> TrialOutcome:
    verifier = result.get("verifier_result") or {}
    rewards = verifier.get("rewards") or {}
    error = result.get("exception_info")
    started, finished = result.get("started_at"), result.get("finished_at")
    seconds = (datetime.fromisoformat(finished) - datetime.fromisoformat(started)).total_seconds() \
        if started and finished else float("nan")
    return TrialOutcome(task=result["task_name"], reward=rewards.get("reward"),
                        error=f"{error['exception_type']}: {error['exception_message']}" if error else None,
                        seconds=seconds)
