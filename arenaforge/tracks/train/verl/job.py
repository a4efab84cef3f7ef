"""The verl GRPO job: hydra overrides, the files it reads, and Ray job submission.

The overrides encode ASTRA's recipe (METHOD.md §1c) in verl 0.9 terms: GRPO advantages,
no KL (neither in reward nor as a loss), no entropy term, clip-higher (0.2 / 0.28),
token-mean loss, zero-variance group filtering with refill (`algorithm.filter_groups`),
asynchronous multi-turn rollouts through our agent loop (`arena_agent`) on vLLM.
Launch: `python -m verl.trainer.main_ppo <overrides>`, as a Ray job when a cluster address
is configured (`submit`), otherwise printed for the user.
"""

from __future__ import annotations

import json
import shlex
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

from arenaforge.schemas.errors import ConfigError
from arenaforge.schemas.models import Environment
from arenaforge.tracks.train.params import GrpoParams, derived_values
from arenaforge.tracks.train.verl.dataset import AGENT_NAME, VerlFiles, write_dataset_dir

VERL_VERSION = "0.9.1"


@dataclass(frozen=True)
class VerlJobSpec:
    """What the verl job is given. The settings a run sets (GrpoParams' fields of the same name, and its episode's
    and verl's) have no default here: a run builds this from its params (`from_params`)."""

    model_path: str
    out_dir: str
    experiment: str
    train_batch_size: int
    group_size: int
    lr: float
    max_prompt_length: int
    max_response_length: int
    max_turns: int
    total_steps: int
    save_freq: int
    nnodes: int
    gpus_per_node: int
    tensor_parallel: int
    max_num_gen_batches: int = 10  # filter_groups: rollout batches tried before giving up on a full batch
    extra_overrides: tuple[str, ...] = ()

    @classmethod
    def from_params(cls, params: GrpoParams, model_path: str, out_dir: str, **changes: Any) -> VerlJobSpec:
        """The job `params` describe (verl saves every `checkpoint_every` steps), with `changes`."""
        return cls(**{**derived_values(cls, params), "save_freq": params.checkpoint_every, "model_path": model_path,
                      "out_dir": out_dir, **changes})


@dataclass(frozen=True)
class VerlJob:
    spec: VerlJobSpec
    train_files: str
    agent_config: str
    overrides: list[str]
    entrypoint: str
    runtime_env: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {**asdict(self), "spec": asdict(self.spec)}


def hydra_overrides(spec: VerlJobSpec, files: VerlFiles) -> list[str]:
    """verl 0.9.1 overrides of `verl/trainer/config/ppo_trainer.yaml` for ASTRA's recipe on `files`."""
    ppo_mini = max(1, spec.train_batch_size // 4)
    tokens = spec.max_prompt_length + spec.max_response_length  # one whole episode fits a micro-batch
    return [
        "algorithm.adv_estimator=grpo",
        "algorithm.use_kl_in_reward=False",
        "algorithm.filter_groups.enable=True",
        "algorithm.filter_groups.metric=reward",  # verl 0.9: the canonical rm_scores (our F1)
        f"algorithm.filter_groups.max_num_gen_batches={spec.max_num_gen_batches}",
        f"data.train_files={files.train}",
        f"data.val_files={files.val}",
        "data.prompt_key=prompt",
        "data.return_raw_chat=True",
        f"data.train_batch_size={spec.train_batch_size}",
        f"data.max_prompt_length={spec.max_prompt_length}",
        f"data.max_response_length={spec.max_response_length}",
        f"actor_rollout_ref.model.path={spec.model_path}",
        f"actor_rollout_ref.actor.optim.lr={spec.lr}",
        "actor_rollout_ref.actor.use_kl_loss=False",
        "actor_rollout_ref.actor.kl_loss_coef=0.0",
        "actor_rollout_ref.actor.entropy_coeff=0.0",
        "actor_rollout_ref.actor.clip_ratio_low=0.2",
        "actor_rollout_ref.actor.clip_ratio_high=0.28",
        "actor_rollout_ref.actor.loss_agg_mode=token-mean",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={ppo_mini}",
        # micro-batches by token count (episodes differ widely in length); verl refuses a config with neither this
        # nor a fixed micro-batch size per GPU
        "actor_rollout_ref.actor.use_dynamic_bsz=True",
        f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={tokens}",
        "actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True",
        f"actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu={tokens}",
        "actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True",
        f"actor_rollout_ref.ref.log_prob_max_token_len_per_gpu={tokens}",
        "actor_rollout_ref.rollout.name=vllm",
        "actor_rollout_ref.rollout.mode=async",
        f"actor_rollout_ref.rollout.n={spec.group_size}",
        f"actor_rollout_ref.rollout.tensor_model_parallel_size={spec.tensor_parallel}",
        "actor_rollout_ref.rollout.calculate_log_probs=True",
        "actor_rollout_ref.rollout.multi_turn.enable=True",
        f"actor_rollout_ref.rollout.multi_turn.max_assistant_turns={spec.max_turns}",
        "actor_rollout_ref.rollout.multi_turn.format=hermes",
        f"actor_rollout_ref.rollout.multi_turn.tool_config_path={files.tool_config}",  # for agent_name tool_agent
        f"actor_rollout_ref.rollout.agent.agent_loop_config_path={files.agent_config}",
        f"actor_rollout_ref.rollout.agent.default_agent_loop={AGENT_NAME}",
        f"reward.custom_reward_function.path={resources.files('arenaforge.tracks.train.verl').joinpath('reward.py')}",
        "reward.custom_reward_function.name=compute_score",
        "trainer.critic_warmup=0",
        "trainer.logger=[console]",
        "trainer.project_name=arenaforge",
        f"trainer.experiment_name={spec.experiment}",
        f"trainer.nnodes={spec.nnodes}",
        f"trainer.n_gpus_per_node={spec.gpus_per_node}",
        f"trainer.save_freq={spec.save_freq}",
        "trainer.max_actor_ckpt_to_keep=2",
        f"trainer.total_training_steps={spec.total_steps}",
        f"trainer.default_local_dir={Path(spec.out_dir) / 'checkpoints'}",
        *spec.extra_overrides,
    ]


def write_job(spec: VerlJobSpec, envs: Sequence[Environment], val_envs: Sequence[Environment] = ()) -> VerlJob:
    """Write the dataset directory (`dataset.write_dataset_dir`) and job.json under `spec.out_dir`; the job."""
    if not envs:
        raise ConfigError("a verl job needs at least one environment")
    out = Path(spec.out_dir)
    files = write_dataset_dir(envs, val_envs or envs[: max(1, len(envs) // 10)], out)
    overrides = hydra_overrides(spec, files)
    entrypoint = "python -m verl.trainer.main_ppo " + " ".join(shlex.quote(o) for o in overrides)
    runtime_env = {
        # ship the installed package itself (a checkout or a wheel alike), not a source tree
        "py_modules": [str(resources.files("arenaforge"))],
        "pip": [f"verl=={VERL_VERSION}"],
        "env_vars": {"HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"},
    }
    job = VerlJob(spec, str(files.train), str(files.agent_config), overrides, entrypoint, runtime_env)
    (out / "job.json").write_text(json.dumps(job.as_json(), indent=2))
    return job


def submit(job: VerlJob, address: str) -> str:
    """Submit `job` to the Ray cluster at `address`; the Ray job id."""
    try:
        from ray.job_submission import JobSubmissionClient
    except ImportError:
        raise ConfigError("submitting to a Ray cluster needs ray (pip install 'arenaforge[verl]')") from None
    client = JobSubmissionClient(address)
    return client.submit_job(entrypoint=job.entrypoint, runtime_env=job.runtime_env,
                             submission_id=f"{job.spec.experiment}-{int(time.time())}")
