"""Submit a verl job the way `train grpo` does with `train.ray_address` set, to a real Ray head on loopback.

Runs in the verl venv (.venv-verl: ray[default] and verl 0.9.1, scripts/setup-verl.sh), from the repository root:

    .venv-verl/bin/python -m tests.support.ray_submit_check WORK_DIR

Starts `ray start --head --block` on 127.0.0.1 (its own ports and temp dir, so it never touches another Ray on the
machine), points `ARENAFORGE_TRAIN__RAY_ADDRESS` at its job server, runs `grpo_job` on one environment, then reads
the job back from Ray (`JobSubmissionClient.get_job_info`), stops it and the head, and prints one JSON line.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_head(work: Path) -> tuple[subprocess.Popen, str]:
    ray = Path(sys.executable).with_name("ray")
    dashboard = _free_port()
    log = (work / "ray-head.log").open("w")
    head = subprocess.Popen(
        [str(ray), "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={_free_port()}",
         "--dashboard-host=127.0.0.1", f"--dashboard-port={dashboard}", "--include-dashboard=true",
         "--num-cpus=1", f"--temp-dir={work / 'ray'}", "--disable-usage-stats"],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return head, f"http://127.0.0.1:{dashboard}"


def _client_when_up(address: str, head: subprocess.Popen) -> object:
    """The job client once the head's job server answers (or the head's exit as an error)."""
    from ray.job_submission import JobSubmissionClient

    while True:
        if head.poll() is not None:
            raise RuntimeError(f"ray head exited with {head.returncode}")
        try:
            client = JobSubmissionClient(address)
            client.list_jobs()
            return client
        except Exception:  # noqa: BLE001 (not up yet: the dashboard starts after the GCS)
            time.sleep(0.5)  # a poll interval, not a wait for time to pass: the loop ends on the condition


def main(work: Path) -> dict:
    from arenaforge.flows.train_flows import on_configured_cluster
    from arenaforge.tracks.train.grpo_job import grpo_job
    from arenaforge.tracks.train.job_config import config_for, open_job_scope
    from arenaforge.tracks.train.params import EnvSelection, GrpoParams
    from arenaforge.warehouse import Warehouse
    from tests.support.rl import tiny_env

    # Ray's own temp paths must stay short (unix socket names are capped at 107 bytes)
    short = Path(os.environ.get("TMPDIR", "/tmp")) / f"rs{os.getpid()}"
    short.mkdir(exist_ok=True)
    head, address = _start_head(short)
    try:
        client = _client_when_up(address, head)
        os.environ["ARENAFORGE_TRAIN__RAY_ADDRESS"] = address
        wh = Warehouse(work / "w.duckdb")
        wh.upsert([tiny_env()])
        params = GrpoParams(db=str(wh.path), out_dir=str(work / "out"), model_path="/models/m",
                            envs=EnvSelection(split="all"), experiment="ray-check")

        async def hand_off() -> dict:  # as the train-grpo flow does: the config's cluster, then the job
            scaled = on_configured_cluster(params, config_for(params))
            async with open_job_scope(scaled, "train-grpo") as scope:
                return await grpo_job(scope, scaled)

        out = asyncio.run(hand_off())
        info = client.get_job_info(out["ray_job_id"])
        client.stop_job(out["ray_job_id"])
        return {"job_id": out["ray_job_id"], "entrypoint": info.entrypoint, "status": str(info.status),
                "pip": (info.runtime_env or {}).get("pip"), "jobs_on_head": [j.submission_id for j in client.list_jobs()]}
    finally:
        os.killpg(head.pid, signal.SIGTERM)  # `ray start --block` takes its cluster down with it
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)
            head.wait()
        for _ in range(50):  # the head's children may still be finishing writes as it exits
            shutil.rmtree(short, ignore_errors=True)
            if not short.exists():
                break
            time.sleep(0.2)


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]))))
