"""The typed parameters of the training track's jobs: one pydantic model per job, shared by the CLI,
the Prefect forms and the benchmarks."""

from __future__ import annotations

from dataclasses import fields
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from arenaforge.tracks.train.rollout.episodes import RolloutConfig

EngineName = Literal["hf", "vllm", "vllm-local"]


class _Params(BaseModel):
    model_config = ConfigDict(extra="forbid")

    config_path: str | None = Field(default=None, description="arenaforge.toml to load (default: ./arenaforge.toml).")
    db: str | None = Field(default=None, description="Warehouse file (overrides warehouse.path).")


class WeightUpdates(BaseModel):
    """How a trainer updates the weights: one declaration for SFT and GRPO."""

    precision: Literal["fp32", "bf16"] = Field(
        default="fp32", description="bf16: mixed precision (bf16 autocast, fp32 weights and optimizer); 1.2-2.2x faster "
                                    "for SmolLM2-135M on a CPU with AMX, `arenaforge bench train_speed`.")
    lora_rank: int = Field(default=0, ge=0, description="0: train every weight; r > 0: LoRA adapters of rank r on "
                           "every linear layer (needs peft: `arenaforge[lora]`); checkpoints hold the merged model.")


class PolicyParams(_Params):
    engine: EngineName = Field(default="hf", description="hf (transformers, in this process), vllm (HTTP server) or "
                               "vllm-local (in-process vLLM).")
    model_path: str | None = Field(default=None, description="HF model dir or checkpoint, or a named policy: arena-small "
                                   "(the default, built on first use), tiny, smollm2-135m.")
    policy_url: str | None = Field(default=None, description="vllm: the `vllm serve` endpoint, e.g. http://host:8000/v1.")
    served_model: str | None = Field(default=None, description="vllm: model name the server serves.")
    device: str = Field(default="cpu", description="Torch device for hf: cpu or cuda.")


class EnvSelection(BaseModel):
    model_config = ConfigDict(extra="forbid")

    env_ids: list[str] = Field(default_factory=list, description="Only these environments, by id or name (default: all).")
    limit: int | None = Field(default=None, ge=1, description="At most this many environments (the first ones).")
    split: Literal["all", "train", "test", "eval"] = Field(
        default="all", description="Split stored in the warehouse (table env_splits): train, test, or all; eval = test.")
    scheme: str = Field(default="default", description="Split scheme (a name; environments keep their split in it).")
    test_share: float = Field(default=0.2, ge=0, le=1,
                              description="Share of each stratum's near-duplicate groups held out as test, "
                              "for environments not yet assigned in the scheme.")
    split_seed: int = Field(default=0, description="Seed of the held-out group order.")
    suite: str | None = Field(default=None, description="Only environments imported into this suite "
                                                        "(`arenaforge envs import`; their native check is scored too).")


class EpisodeParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_turns: int = Field(default=8, ge=1, description="Assistant turns per episode.")
    max_length: int = Field(default=2048, ge=16, description="Response tokens per episode (model + tool).")
    max_tokens_per_turn: int = Field(default=256, ge=1, description="Tokens the policy may write in one turn.")
    temperature: float = Field(default=1.0, ge=0, description="Sampling temperature; 0 = greedy.")
    top_p: float = Field(default=1.0, gt=0, le=1, description="Nucleus sampling: keep the smallest set of tokens "
                         "whose probability reaches this.")
    constrain_tool_calls: bool = Field(default=True, description="hf engine: decode tool calls constrained to the "
                                       "environment's tool names and argument keys, well-formed JSON (the "
                                       "log-probs are the constrained distribution's).")
    ground_arguments: bool = Field(default=True, description="With constrained decoding: a call's top-level "
                                   "argument values are copied from the conversation (word-bounded spans, "
                                   "numbers that appear in it; free when it has none).")

    def rollout_config(self, seed: int | None = None) -> RolloutConfig:
        return RolloutConfig(**self.model_dump(), seed=seed)


# The episode limits training uses; evaluation of a trained policy uses the same limits, greedy.
TRAIN_EPISODE = EpisodeParams(max_turns=4, max_length=384, max_tokens_per_turn=96)


class RolloutParams(PolicyParams):
    envs: EnvSelection = Field(default=EnvSelection(), description="Which environments.")
    episode: EpisodeParams = Field(default=EpisodeParams(), description="Episode limits and sampling.")
    samples: int = Field(default=1, ge=1, description="Episodes per environment.")
    concurrency: int = Field(default=32, ge=1, description="Episodes in flight at once.")
    seed: int = Field(default=0, description="Sampling seed (episode i, turn t samples with seed + 1000 i + t).")


class EvalParams(RolloutParams):
    envs: EnvSelection = Field(default=EnvSelection(split="test"), description="Which environments (default: the test split).")
    episode: EpisodeParams = Field(default=TRAIN_EPISODE.model_copy(update={"temperature": 0.0}),
                                   description="Episode limits and sampling (default: training limits, greedy).")


class VerlParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ray_address: str | None = Field(default=None, description="Ray cluster (e.g. http://head:8265): submit to verl.")
    spec_only: bool = Field(default=False, description="Write the verl job files without submitting.")
    nnodes: int = Field(default=1, description="verl: nodes.")
    gpus_per_node: int = Field(default=8, description="verl: GPUs per node.")
    tensor_parallel: int = Field(default=2, description="verl: vLLM tensor-parallel size.")
    train_batch_size: int = Field(default=256, description="verl: prompts per batch.")
    max_prompt_length: int = Field(default=25600, description="verl: prompt token limit.")
    max_response_length: int = Field(default=49152, description="verl: response token limit.")
    total_steps: int = Field(default=200, description="verl: training steps.")


class GrpoParams(PolicyParams, WeightUpdates):
    experiment: str = Field(default="grpo", description="Name; checkpoints go to the folder `OUT_DIR/EXPERIMENT`, "
                            "the warm start to `OUT_DIR/EXPERIMENT-warmstart`.")
    out_dir: str | None = Field(default=None, description="Parent folder of experiments (default: the config's "
                                "out_dir + `/train`).")
    envs: EnvSelection = Field(default=EnvSelection(split="train"), description="Training environments (default: "
                               "the train split).")
    episode: EpisodeParams = Field(default=TRAIN_EPISODE, description="Episode limits and sampling of rollouts.")
    steps: int = Field(default=3, ge=1, description="GRPO steps in all (a resumed run continues up to this).")
    batch_groups: int = Field(default=4, ge=1, description="Groups (prompts) per optimisation step.")
    group_size: int = Field(default=8, ge=2, description="Rollouts per group (G).")
    delta: float = Field(default=0.0, ge=0, description="Use only groups whose reward std exceeds this.")
    roc: bool = Field(default=False, description="Resample-on-Correct: roll out 2G, keep G.")
    max_groups_per_step: int = Field(default=32, ge=1, description="Stop filling a batch after this many groups; "
                                     "a step that found no group with reward variance is skipped.")
    curriculum: bool = Field(default=True, description="Pick environments by measured pass rate (weight p(1-p)); "
                             "off: cycle through them in order.")
    lr: float = Field(default=5e-5, gt=0, description="GRPO learning rate (constant).")
    micro_batch_size: int = Field(default=8, ge=1, description="Rollouts per forward/backward pass.")
    old_logprobs: Literal["policy", "engine"] = Field(default="policy", description="policy: on-policy ratio 1; "
                                                      "engine: importance ratio against the engine's log-probs (vLLM).")
    skip_forced_tokens: bool = Field(default=True, description="hf engine: leave out of the loss the tokens sampled "
                                     "with probability 1 (those constrained decoding forced: no choice, no gradient).")
    checkpoint_every: int = Field(default=5, ge=1, description="Save weights every k steps (and at the last).")
    keep_optimizer: int = Field(default=2, ge=1, le=2, description="Checkpoints that keep optimizer state (resume).")
    concurrency: int = Field(default=32, ge=1, description="Episodes in flight at once.")
    seed: int = Field(default=0, description="Seed of sampling, curriculum and warm-start data order.")
    warmstart_steps: int = Field(default=0, ge=0, description="First SFT this many steps on gold-call replays of the "
                                 "training environments and kept SFT-track trajectories.")
    warmstart_lr: float = Field(default=1e-3, gt=0, description="Warm-start SFT learning rate (peak, after warm-up).")
    warmstart_batch_size: int = Field(default=8, ge=1, description="Warm-start SFT examples per step.")
    warmstart_trajectories: int = Field(default=200, ge=0, description="At most this many kept SFT-track trajectories "
                                        "join the warm-start data (best judge score first).")
    warmstart_copy_variants: int = Field(default=0, ge=0, description="Copy-forced variants per gold-call replay in the "
                                         "warm-start data: fresh values, shuffled tools "
                                         "(tracks/train/copy_forcing.py).")
    evaluate: bool = Field(default=True, description="Evaluate on the test split: the starting policy, after the warm "
                           "start and after GRPO (greedy, training episode limits); prints the table.")
    eval_limit: int | None = Field(default=None, ge=1, description="Evaluate on at most this many test environments.")
    verl: VerlParams = Field(default=VerlParams(), description="Scale-out: hand the job to verl on a Ray cluster.")


def recipe(**overrides: Any) -> dict[str, Any]:
    """A named set of GrpoParams overrides, checked when it is declared: a misspelt or removed field, a value out
    of range, or one that only restates the default (a second declaration of it) fails at import."""
    defaults = GrpoParams()
    GrpoParams(**overrides)
    restated = sorted(k for k, v in overrides.items() if getattr(defaults, k) == v)
    if restated:
        raise ValueError(f"recipe: {restated} restate GrpoParams' defaults")
    return overrides


# The default policy's training recipe (`demo --train`, `bench learning`; docs/TRAINING.md has its numbers); its
# group size (8), groups per step (4) and copy-forced variants (0) are GrpoParams' defaults.
RECIPE = recipe(warmstart_steps=200, warmstart_batch_size=16, warmstart_lr=3e-3, steps=48, lr=1e-4, eval_limit=150)


class WarmstartParams(_Params):
    out: str | None = Field(default=None, description="Folder to write warmstart.jsonl to (default: the config's "
                            "out_dir + `/warmstart`).")
    envs: EnvSelection = Field(default=EnvSelection(split="train"), description="Environments whose gold calls are "
                               "replayed (default: the train split).")
    copy_variants: int = Field(default=0, ge=0, description="Copy-forced variants per replay (fresh values, shuffled "
                               "tools) written after the replays.")
    seed: int = Field(default=0, description="Seed of the copy-forced variants.")


class SftParams(_Params, WeightUpdates):
    data: str | None = Field(default=None, description="SFT export: OpenAI messages+tools JSONL (default: the "
                             "config's out_dir + `/sft.jsonl`, where `arenaforge sft export` writes).")
    model_path: str | None = Field(default=None, description="Model dir or checkpoint, or a named policy "
                                   "(arena-small, the default; tiny; smollm2-135m).")
    experiment: str = Field(default="sft", description="Name; checkpoints go to the folder `OUT_DIR/EXPERIMENT`.")
    out_dir: str | None = Field(default=None, description="Parent folder of experiments (default: the config's "
                                "out_dir + `/train`).")
    epochs: int = Field(default=1, ge=1, description="Passes over the data.")
    max_steps: int | None = Field(default=None, ge=1, description="Stop after this many steps (default: all epochs).")
    batch_size: int = Field(default=4, ge=1, description="Examples per step.")
    lr: float = Field(default=1e-5, gt=0, description="Learning rate (constant after warm-up).")
    max_length: int = Field(default=4096, ge=16, description="Tokens per example (longer ones are cut).")
    checkpoint_every: int = Field(default=50, ge=1, description="Save weights every k steps (and at the last).")
    keep_optimizer: int = Field(default=2, ge=1, le=2, description="Checkpoints that keep optimizer state (resume).")
    seed: int = Field(default=0, description="Seed of the data order.")


# --------------------------------------------------------------------------- helpers


def derived_values(config: type, params: BaseModel) -> dict[str, Any]:
    """The values `params` sets for the fields of a dataclass derived from it (GrpoConfig, VerlJobSpec): each field
    named like one of the params' fields or of their nested models' (episode.max_turns, verl.nnodes)."""
    values: dict[str, Any] = {}
    for model in (params, *(v for v in params.__dict__.values() if isinstance(v, BaseModel))):
        values.update({f.name: getattr(model, f.name) for f in fields(config) if f.name in type(model).model_fields})
    return values
