"""`arenaforge bench harbor-run`: our exported Harbor tasks under the real Harbor CLI (PyPI `harbor`).

On a folder of task directories (`arenaforge demo` or `envs export --format harbor --image <local base>` writes
one): `harbor lint` under its default rules and under every rule, then one job per agent with Harbor's docker
environment: `oracle` (the gold calls: reward 1 expected), `nop` (nothing: 0 expected) and the forgers of
`tracks/envs/harbor/forge_agents.py` (root in the agent's container, no tool call: 0 expected). Prints, per agent,
the rewards Harbor recorded, the trials that ended in an error, and trial wall times (median, p90), with the
machine's load average beside them. Needs `bash scripts/setup-harbor.sh` and a Docker engine.
"""

from __future__ import annotations

import os
import statistics
import tempfile
from collections import Counter
from importlib import resources
from pathlib import Path
from typing import Any

from arenaforge.schemas.errors import InputError
from arenaforge.tracks.envs import harbor_cli

FORGERS = ("RewardFile", "ForgedCallLog", "PoisonedPython", "LingeringProcess", "ToolsServiceProbe", "AllForgeries")


def _summary(outcomes: list[harbor_cli.TrialOutcome], expected: float) -> dict[str, Any]:
    seconds = sorted(o.seconds for o in outcomes)
    return {"trials": len(outcomes), "rewards": dict(Counter(str(o.reward) for o in outcomes if o.error is None)),
            "as_expected": sum(o.error is None and o.reward == expected for o in outcomes),
            "errors": [f"{o.task}: {o.error}" for o in outcomes if o.error],
            "trial_s_median": round(statistics.median(seconds), 2) if seconds else None,
            "trial_s_p90": round(seconds[min(len(seconds) - 1, int(0.9 * len(seconds)))], 2) if seconds else None}


def main(tasks: str, agents: str = "oracle,nop,AllForgeries", n_concurrent: int = 2, limit: int = 0,
         jobs_dir: str = "") -> dict[str, Any]:
    """Lint, then oracle / nop / forgers through `harbor run` on the task folder TASKS.

    Args:
        tasks: Folder of Harbor task directories (`arenaforge envs export --format harbor`).
        agents: Comma-separated agents: oracle, nop and the forgers (e.g. AllForgeries).
        n_concurrent: Trials Harbor runs at once.
        limit: At most this many tasks (0: all).
        jobs_dir: Where Harbor writes its jobs (default: a temporary folder).
    """
    root = Path(tasks).expanduser().resolve()
    dirs = sorted(d for d in root.iterdir() if (d / "task.toml").is_file()) if root.is_dir() else []
    if not dirs:
        raise InputError(f"{tasks}: no Harbor task directories (export some with `arenaforge envs export "
                         "--format harbor --image <local base image>`)")
    if limit:
        dirs = dirs[:limit]
    unknown = [a for a in agents.split(",") if a not in ("oracle", "nop", *FORGERS)]
    if unknown:
        raise InputError(f"unknown agents {unknown}; use oracle, nop or {', '.join(FORGERS)}")
    install = harbor_cli.find_harbor()
    jobs = Path(jobs_dir or tempfile.mkdtemp(prefix="arenaforge-harbor-jobs-"))
    with tempfile.TemporaryDirectory() as tmp:  # the chosen tasks, as links: one Harbor job runs them all
        chosen = Path(tmp) / "tasks"
        chosen.mkdir()
        for d in dirs:
            (chosen / d.name).symlink_to(d)
        passed, findings = harbor_cli.lint(install, dirs)
        passed_all, findings_all = harbor_cli.lint(install, dirs, select_all=True)
        out: dict[str, Any] = {"tasks": len(dirs), "jobs_dir": str(jobs), "n_concurrent": n_concurrent,
                               "lint_default": {"passed": passed, "findings": len(findings)},
                               "lint_all_rules": {"passed": passed_all, "findings": len(findings_all),
                                                  "rules": sorted({f["rule"] for f in findings_all})}}
        forgers = str(resources.files("arenaforge.tracks.envs").joinpath("harbor"))
        for agent in agents.split(","):
            spec = agent if agent in ("oracle", "nop") else f"forge_agents:{agent}"
            extra = [] if agent in ("oracle", "nop") else ["--ak", f"tasks_dir={chosen}"]
            load_before = os.getloadavg()[0]
            outcomes = harbor_cli.run_job(install, chosen, spec, jobs, f"{agent}-{os.getpid()}", n_concurrent,
                                          extra_args=extra, extra_env={"PYTHONPATH": forgers})
            out[agent] = {**_summary(outcomes, 1.0 if agent == "oracle" else 0.0),
                          "load_avg_1m": [round(load_before, 1), round(os.getloadavg()[0], 1)]}
    return out
