"""Run stock verl 0.9.1's trainer, `python -m verl.trainer.main_ppo`, with our job's overrides on a real local Ray
head, on CPU, as far as it goes; print one JSON line saying how far it got and where it stopped.

Runs in the verl venv (.venv-verl, scripts/setup-verl.sh), from the repository root:

    .venv-verl/bin/python -m tests.support.verl_trainer_check WORK_DIR LOGICAL_GPUS

Our part is real: `write_job` exports four environments (train/val Parquet, agent_loops.yaml, tool_config.yaml) and
writes the overrides; the reward function is ours. The Ray head advertises LOGICAL_GPUS to Ray's scheduler (a
count, no device behind it): with 0, verl stops where it asks Ray for GPUs; with 1, it goes on until a worker
needs a real one. `trainer.use_v1=False`: verl's default V1 trainer imports `transfer_queue`, which only the
`verl[verl-core]` extra installs, and our verl venv holds plain `verl==0.9.1`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

CPU_ONLY = ("trainer.use_v1=False", "trainer.device=cpu")


def main(work: Path, logical_gpus: int) -> dict:
    from arenaforge.tracks.train.params import GrpoParams
    from arenaforge.tracks.train.verl.job import VerlJobSpec, write_job
    from tests.support.ray_cluster import RayCluster
    from tests.support.rl import tiny_env, tiny_model_path

    envs = [tiny_env(), tiny_env(country="Sylvania", capital="Ostia"), tiny_env(country="Borduria", capital="Szohod"),
            tiny_env(country="Syldavia", capital="Klow")]
    spec = VerlJobSpec.from_params(GrpoParams(), model_path=str(tiny_model_path()), out_dir=str(work / "job"),
                                   train_batch_size=2, max_prompt_length=1024, max_response_length=512, max_turns=4,
                                   tensor_parallel=1, gpus_per_node=1, group_size=2, total_steps=1, save_freq=-1,
                                   extra_overrides=CPU_ONLY)
    job = write_job(spec, envs, val_envs=envs[:1])
    # Ray's own temp paths must stay short (unix socket names are capped at 107 bytes)
    short = Path(os.environ.get("TMPDIR", "/tmp")) / f"vt{os.getpid()}"
    short.mkdir(exist_ok=True)
    cluster = RayCluster(short, worker_nodes=0, cpus=4, logical_gpus=logical_gpus)
    cluster.start()
    try:
        proc = subprocess.run([sys.executable, "-m", "verl.trainer.main_ppo", *job.overrides], cwd=work,
                              capture_output=True, text=True, timeout=900,
                              env={**os.environ, "RAY_ADDRESS": cluster.address, "HF_HUB_OFFLINE": "1",
                                   "HYDRA_FULL_ERROR": "1"})
    finally:
        cluster.stop()
        shutil.rmtree(short, ignore_errors=True)
    out = proc.stdout + proc.stderr
    (work / "main_ppo.log").write_text(out)
    lengths = [int(n) for n in re.findall(r"dataset len: (\d+)", out)]
    errors = re.findall(r"^(\w+(?:Error|Exception)): (.+)$", out, re.M)
    frames = re.findall(r'File "[^"]*/site-packages/(verl/[^"]+)", line \d+, in (\w+)', out)
    return {
        "returncode": proc.returncode,
        "config_valid": "[validate_config] All configuration checks passed successfully!" in out,
        "connected_to_head": "Connected to Ray cluster" in out,
        "dataset_lengths": lengths,
        "dataloaders": bool(re.search(r"Size of train dataloader: \d+, Size of val dataloader: \d+", out)),
        "error": list(errors[-1]) if errors else None,
        "verl_frames": [f"{path}:{func}" for path, func in frames],
        "log": str(work / "main_ppo.log"),
    }


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]), int(sys.argv[2]))))
