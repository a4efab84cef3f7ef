"""`arenaforge bench harbor`: what an imported Harbor task (a container task) costs, beside a sandbox environment.

Writes `tasks` Harbor task directories (FROM the project's sandbox base image: no registry here), imports them
(`import_tasks`: image build, gold solution replay, the task's own tests) and reports, in the same run:
  - import seconds per task (first: the image build; the rest: image reused when the Dockerfile is the same);
  - container session open + close (p50/p90), a `run_shell` call (p50/p90), the task's tests (`verdict`, p50);
  - the sandbox pool's session open + close and a trivial call on a format-1 environment, for scale.
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from arenaforge.schemas.config import SandboxConfig

TEST_SH = """#!/bin/bash
mkdir -p /logs/verifier
if [ "$(cat /app/answer.txt 2>/dev/null)" = "{answer}" ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt
"""


def _write_task(root: Path, index: int, base: str) -> None:
    d = root / f"task-{index}"
    for sub in ("environment", "tests", "solution"):
        (d / sub).mkdir(parents=True)
    (d / "instruction.md").write_text(f"Write {index * 7} to /app/answer.txt.\n")
    (d / "task.toml").write_text(f'version = "1.0"\n[metadata]\nname = "task-{index}"\n')
    (d / "environment" / "Dockerfile").write_text(f"FROM {base}\nRUN mkdir -p /app\nWORKDIR /app\n")
    (d / "tests" / "test.sh").write_text(TEST_SH.format(answer=index * 7))
    (d / "solution" / "solve.sh").write_text(f"#!/bin/bash\necho {index * 7} > /app/answer.txt\n")


def _quantiles(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    return {"p50_ms": round(1000 * statistics.median(ordered), 1),
            "p90_ms": round(1000 * ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))], 1), "n": len(ordered)}


async def _time_sessions(pool: Any, env: Any, sessions: int, calls: int, tool: str, args: dict[str, Any],
                         verdict: bool = False) -> tuple[list[float], list[float], list[float]]:
    """Seconds of each session's open + close, of each call, and (container tasks) of each run of the task's tests;
    `pool` is the sandbox pool or the task containers, which share open/call/close."""
    opens, call_times, verdicts = [], [], []
    for _ in range(sessions):
        started = time.perf_counter()
        session = await pool.open(env)
        opened = time.perf_counter() - started
        for _ in range(calls):
            started = time.perf_counter()
            await pool.call(session, tool, args)
            call_times.append(time.perf_counter() - started)
        if verdict:
            started = time.perf_counter()
            await pool.verdict(session)
            verdicts.append(time.perf_counter() - started)
        started = time.perf_counter()
        await pool.close(session)
        opens.append(opened + time.perf_counter() - started)
    return opens, call_times, verdicts


async def main(tasks: int = 3, sessions: int = 8, calls: int = 20, sandbox_backend: str = "auto") -> dict[str, Any]:
    """Import cost, container session open/close, run_shell and tests latency; sandbox open/call beside them.

    Args:
        tasks: Harbor tasks generated and imported.
        sessions: Sessions opened (and closed) on one task, and on the sandbox beside it.
        calls: Calls in all, spread over the sessions.
        sandbox_backend: Sandbox backend of the comparison: auto, docker or process.
    """
    import docker

    from arenaforge.benchmarks.large_module import large_module_environment
    from arenaforge.environments.containers import TaskContainers
    from arenaforge.environments.runtime import build_image, create_pool
    from arenaforge.environments.runtime.image import rootfs_hash
    from arenaforge.tracks.envs.import_harbor import import_tasks

    cfg = SandboxConfig(backend=sandbox_backend, pool_size=1)
    build_image(docker.from_env(), cfg.image)
    base = f"{cfg.image}-base:{rootfs_hash()}"
    containers = TaskContainers(call_timeout_s=60)
    with tempfile.TemporaryDirectory(prefix="bench-harbor-") as tmp:
        root = Path(tmp)
        for i in range(tasks):
            _write_task(root, i, base)
        started = time.perf_counter()
        envs, rejections = await import_tasks(containers, root, "bench-harbor")
        import_s = time.perf_counter() - started
    env = envs[0]
    opens, shell, verdicts = await _time_sessions(containers, env, sessions, calls // sessions or 1,
                                                  "run_shell", {"command": "echo hi"}, verdict=True)
    await containers.shutdown()

    small = large_module_environment(2_000)  # a small stateful class, for scale
    async with await create_pool(cfg) as pool:
        await pool.close(await pool.open(small))  # warm: the template is loaded once
        sandbox_opens, sandbox_calls, _ = await _time_sessions(pool, small, sessions, calls // sessions or 1,
                                                               "read_counter", {"name": "a"})
        backend = pool.backend
    return {
        "tasks": tasks, "imported": len(envs), "rejected": len(rejections),
        "import_s_per_task": round(import_s / max(tasks, 1), 2),
        "container_task": {"open_close": _quantiles(opens), "run_shell": _quantiles(shell),
                           "tests_verdict": _quantiles(verdicts)},
        "sandbox": {"backend": backend, "open_close": _quantiles(sandbox_opens), "call": _quantiles(sandbox_calls)},
        "load_average": [round(x, 2) for x in os.getloadavg()],
    }
