"""Record kinds of the training capability: per-step metrics, checkpoints, eval runs."""

from __future__ import annotations

from typing import Literal

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
    format_errors_per_task: float = Field(default=0.0, ge=0, description="Mean malformed calls per scored episode.")
    label: str | None = Field(default=None, description="What was evaluated, e.g. untrained, warm start, warm start + GRPO.")
    statuses: dict[str, int] = Field(default_factory=dict, description="Episode count per rollout status.")
    failure_reasons: dict[str, int] = Field(default_factory=dict, description="env_failure reasons with counts.")
    started_at: str = Field(description="ISO-8601 UTC time the evaluation started (part of the id).")
    suite: str | None = Field(default=None, description="The imported suite evaluated (`eval --suite`), if any.")
    native: float | None = Field(default=None, ge=0, le=1,
                                 description="The suite's own metric: share of scored episodes its native check passed.")

    def compute_id(self) -> str:  # unset suite fields stay out of the id: evaluations without them keep theirs
        from arenaforge.schemas.ids import content_id

        unset = {f for f in ("suite", "native") if getattr(self, f) is None}
        return content_id(self.ID_PREFIX, self.model_dump(mode="json", exclude=set(self.ID_EXCLUDE) | unset))


@register
class EnvSplit(Record):
    """Which split of a split scheme an environment belongs to: train or test.

    One row per (scheme, environment): the id ignores everything else, so an environment keeps
    its split when the scheme is extended to environments synthesized later.
    """

    KIND = "env_split"
    ID_PREFIX = "split"
    TABLE = "env_splits"

    scheme: str = Field(description="Split scheme name; `default` unless a run asks for another.")
    env_id: str = Field(description="The environment.")
    split: Literal["train", "test"] = Field(description="train: may reach any training input; test: evaluation only.")
    stratum: str = Field(description="Stratification cell: `<source>/<QA structure>`.")
    group: str = Field(description="Near-duplicate group (hash of the gold tool set and the question template); "
                       "a group never straddles splits.")
    test_share: float = Field(ge=0, le=1, description="Share of each stratum's groups held out when first assigned.")
    seed: int = Field(description="Seed of the group order within a stratum.")

    def compute_id(self) -> str:  # one split per environment and scheme
        from arenaforge.schemas.ids import content_id

        return content_id(self.ID_PREFIX, {"scheme": self.scheme, "env_id": self.env_id})
