"""Record kinds of the training capability: per-step metrics, checkpoints, eval runs."""

from __future__ import annotations

from pydantic import Field

from arenaforge.schemas.base import Record
from arenaforge.schemas.registry import register


@register
class TrainStep(Record):
    """Metrics of one optimisation step (GRPO or SFT) of one experiment."""

    KIND = "train_step"
    ID_PREFIX = "step"
    TABLE = "train_steps"

    experiment: str = Field(description="Experiment name (the output directory's name); steps resume under it.")
    algorithm: str = Field(description="grpo or sft.")
    step: int = Field(ge=0, description="1-based optimisation step.")
    policy: str = Field(default="", description="Model the step started from (path or served name).")
    metrics: dict[str, float] = Field(
        default_factory=dict,
        description="reward/recall/precision/calls means, zero_variance_share, lengths, loss, clip fractions, "
        "grad_norm, lr, time split (rollout_s, generate_s, tools_s, train_s) and tokens_per_s.",
    )


@register
class Checkpoint(Record):
    """Weights written by a trainer; optimizer state is kept only for the newest ones."""

    KIND = "checkpoint"
    ID_PREFIX = "ckpt"
    TABLE = "checkpoints"

    experiment: str
    algorithm: str
    step: int = Field(ge=0)
    path: str = Field(description="Directory holding save_pretrained weights and tokenizer.")
    has_optimizer: bool = Field(description="Whether optimizer/scheduler state was written with it.")


@register
class EvalRun(Record):
    """One evaluation of a policy on a held-out environment set."""

    KIND = "eval_run"
    ID_PREFIX = "eval"
    TABLE = "eval_runs"

    policy: str
    engine: str
    env_ids: list[str] = Field(description="Environments evaluated, in order.")
    samples: int = Field(ge=1, description="Episodes per environment.")
    episodes: int = Field(ge=0, description="Episodes scored (environment failures excluded).")
    f1: float = Field(ge=0, le=1, description="Mean F1 reward over scored episodes.")
    recall: float = Field(ge=0, le=1)
    precision: float = Field(ge=0)
    calls_per_task: float = Field(ge=0)
    statuses: dict[str, int] = Field(default_factory=dict, description="Episode count per rollout status.")
    failure_reasons: dict[str, int] = Field(default_factory=dict, description="env_failure reasons with counts.")
    started_at: str = Field(description="ISO-8601 UTC time the evaluation started (part of the id).")
