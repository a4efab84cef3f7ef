"""Entry points shared by the CLI and the Prefect flows: typed params in, a small summary out.

Each job opens what it needs (config, warehouse, sandbox pool, engine), records a `runs` row
(`recorded_run`), and writes its records at step boundaries. Flows wrap these functions
(`arenaforge/flows/train_flows.py`); the CLI builds the same params models from flags.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from arenaforge.schemas.config import Config, load_config
from arenaforge.schemas.errors import ConfigError, InputError
from arenaforge.schemas.models import Environment
from arenaforge.tasks.policy.base import PolicyEngine, build_engine
from arenaforge.tasks.rollout.episodes import RolloutConfig, SandboxPool, env_failure_rejections
from arenaforge.warehouse import Warehouse, recorded_run

T = TypeVar("T")
EngineName = Literal["hf", "vllm", "vllm-local"]


class _Params(BaseModel):
    model_config = ConfigDict(extra="forbid")

    config_path: str | None = Field(default=None, description="arenaforge.toml to load (default: ./arenaforge.toml).")
    db: str | None = Field(default=None, description="Warehouse file (overrides warehouse.path).")


class PolicyParams(_Params):
    engine: EngineName = Field(default="hf", description="hf (transformers), vllm (HTTP server) or vllm-local.")
    model_path: str | None = Field(default=None, description="HF model dir; default: the tiny model, built on demand.")
    policy_url: str | None = Field(default=None, description="vllm: the `vllm serve` endpoint, e.g. http://host:8000/v1.")
    served_model: str | None = Field(default=None, description="vllm: model name the server serves.")
    device: str = "cpu"


class EnvSelection(BaseModel):
    model_config = ConfigDict(extra="forbid")

    env_ids: list[str] = Field(default_factory=list, description="Only these environments (default: all).")
    limit: int | None = Field(default=None, ge=1, description="At most this many environments.")
    split: Literal["all", "train", "eval"] = Field(default="all", description="Deterministic split by env id hash.")
    eval_share: float = Field(default=0.1, ge=0, le=1, description="Share of environments held out for eval.")


class EpisodeParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_turns: int = Field(default=8, ge=1)
    max_length: int = Field(default=2048, ge=16, description="Response tokens per episode (model + tool).")
    max_tokens_per_turn: int = Field(default=256, ge=1)
    temperature: float = Field(default=1.0, ge=0)
    top_p: float = Field(default=1.0, gt=0, le=1)

    def rollout_config(self, seed: int | None = None) -> RolloutConfig:
        return RolloutConfig(max_turns=self.max_turns, max_length=self.max_length,
                             max_tokens_per_turn=self.max_tokens_per_turn, temperature=self.temperature,
                             top_p=self.top_p, seed=seed)


class RolloutParams(PolicyParams):
    envs: EnvSelection = EnvSelection()
    episode: EpisodeParams = EpisodeParams()
    samples: int = Field(default=1, ge=1, description="Episodes per environment.")
    concurrency: int = Field(default=32, ge=1)
    seed: int = 0


class EvalParams(RolloutParams):
    envs: EnvSelection = EnvSelection(split="eval")
    episode: EpisodeParams = EpisodeParams(temperature=0.0)


class VerlParams(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ray_address: str | None = Field(default=None, description="Ray cluster (e.g. http://head:8265): submit to verl.")
    spec_only: bool = Field(default=False, description="Write the verl job files without submitting.")
    nnodes: int = 1
    gpus_per_node: int = 8
    tensor_parallel: int = 2
    train_batch_size: int = 256
    max_prompt_length: int = 25600
    max_response_length: int = 49152
    total_steps: int = 200


class GrpoParams(PolicyParams):
    experiment: str = Field(default="grpo", description="Name; checkpoints go to <out_dir>/<experiment>.")
    out_dir: str | None = Field(default=None, description="Default: <config out_dir>/train.")
    envs: EnvSelection = EnvSelection(split="train")
    episode: EpisodeParams = EpisodeParams(max_turns=4, max_length=512, max_tokens_per_turn=64)
    steps: int = Field(default=3, ge=1)
    batch_groups: int = Field(default=2, ge=1)
    group_size: int = Field(default=4, ge=2)
    delta: float = Field(default=0.0, ge=0, description="Buffer groups whose reward std exceeds this.")
    roc: bool = Field(default=False, description="Resample-on-Correct: roll out 2G, keep G.")
    max_groups_per_step: int = Field(default=32, ge=1)
    lr: float = Field(default=2e-6, gt=0)
    micro_batch_size: int = Field(default=4, ge=1)
    old_logprobs: Literal["policy", "engine"] = "policy"
    checkpoint_every: int = Field(default=1, ge=1)
    keep_optimizer: int = Field(default=2, ge=1, le=2)
    concurrency: int = Field(default=32, ge=1)
    seed: int = 0
    warmstart_steps: int = Field(default=0, ge=0, description="SFT steps on the envs' gold-call conversations first.")
    warmstart_lr: float = Field(default=5e-3, gt=0, description="Warm-start SFT learning rate.")
    warmstart_batch_size: int = Field(default=2, ge=1)
    verl: VerlParams = VerlParams()


class WarmstartParams(_Params):
    out: str = Field(description="Directory for warmstart.jsonl.")
    envs: EnvSelection = EnvSelection(split="train")


class SftParams(_Params):
    data: str = Field(description="SFT export: OpenAI messages+tools JSONL.")
    model_path: str | None = None
    experiment: str = "sft"
    out_dir: str | None = None
    epochs: int = Field(default=1, ge=1)
    max_steps: int | None = Field(default=None, ge=1)
    batch_size: int = Field(default=4, ge=1)
    lr: float = Field(default=1e-5, gt=0)
    max_length: int = Field(default=4096, ge=16)
    checkpoint_every: int = Field(default=50, ge=1)
    keep_optimizer: int = Field(default=2, ge=1, le=2)
    seed: int = 0


# --------------------------------------------------------------------------- helpers
def config_for(params: _Params) -> Config:
    return load_config(params.config_path, overrides={"warehouse.path": params.db})


def warehouse_for(cfg: Config) -> Warehouse:
    return Warehouse(cfg.warehouse.path, lock_timeout_s=cfg.warehouse.lock_timeout_s,
                     data_path=cfg.warehouse.data_path)


def model_path_for(path: str | None) -> str:
    if path:
        return path
    from arenaforge.tasks.train.tiny_model import ensure_tiny_model

    return str(ensure_tiny_model())


def in_eval_split(env_id: str, eval_share: float) -> bool:
    return int(hashlib.sha256(env_id.encode()).hexdigest()[:8], 16) % 10_000 < eval_share * 10_000


def select_envs(wh: Warehouse, sel: EnvSelection) -> list[Environment]:
    """Environments from the warehouse (`Warehouse.load(Environment)`), filtered and split."""
    envs = wh.load(Environment)
    if sel.env_ids:
        wanted = set(sel.env_ids)
        envs = [e for e in envs if e.id in wanted or e.name in wanted]
    if sel.split != "all":
        envs = [e for e in envs if in_eval_split(e.id, sel.eval_share) == (sel.split == "eval")]
    if sel.limit:
        envs = envs[: sel.limit]
    if not envs:
        raise InputError(f"no environments in {wh.path} match {sel.model_dump(exclude_defaults=True) or 'the selection'}"
                         " (run `arenaforge envs ...` first)")
    return envs


def engine_factory(params: PolicyParams) -> Callable[[Any, Any], PolicyEngine]:
    """(model, tokenizer) -> engine: hf shares the trainer's model; vllm talks to its server."""
    if params.engine == "hf":
        from arenaforge.tasks.policy.hf import HfEngine

        return lambda model, tok: HfEngine(model, tok, policy=params.model_path or "tiny", device=params.device)
    if params.engine == "vllm" and not params.policy_url:
        raise ConfigError("engine vllm needs --policy-url (the `vllm serve` endpoint)")
    return lambda model, tok: build_engine(params.engine, model_path=params.model_path, base_url=params.policy_url,
                                           served_model=params.served_model)


async def _with_pool(cfg: Config, body: Callable[[SandboxPool], Awaitable[T]]) -> T:
    from arenaforge.environments.runtime import create_pool

    pool = await create_pool(cfg.sandbox)
    try:
        return await body(pool)
    finally:
        await pool.shutdown()


def _load_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


# --------------------------------------------------------------------------- jobs
def rollout_job(params: RolloutParams, flow: str = "rollout") -> dict[str, Any]:
    """Roll out a policy on warehouse environments; rollouts are stored with the F1 reward."""
    from arenaforge.tasks.rollout.episodes import run_rollouts

    cfg = config_for(params)
    wh = warehouse_for(cfg)
    envs = select_envs(wh, params.envs)
    path = model_path_for(params.model_path)
    tokenizer = _load_tokenizer(path)
    with recorded_run(wh, flow, params.model_dump(mode="json")) as (run, counts):
        model = None
        if params.engine == "hf":
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(path).to(params.device)
        engine = engine_factory(params.model_copy(update={"model_path": path}))(model, tokenizer)
        episodes = asyncio.run(_with_pool(cfg, lambda pool: run_rollouts(
            engine, tokenizer, pool, envs, params.episode.rollout_config(params.seed), params.samples,
            params.concurrency)))
        rollouts = [e.rollout.model_copy(update={"run_id": run.id}) for e in episodes]
        rejections = env_failure_rejections(rollouts)
        counts["rollouts"] = wh.upsert([*rollouts, *rejections]) - len(rejections)
        counts["env_failures"] = sum(r.status == "env_failure" for r in rollouts)
    scored = [r for r in rollouts if r.status != "env_failure"]
    return {"run_id": run.id, "rollouts": len(rollouts), "env_failures": counts["env_failures"],
            "mean_f1": sum(r.reward.f1 for r in scored) / len(scored) if scored else 0.0}


def eval_job(params: EvalParams) -> dict[str, Any]:
    """Evaluate a policy on held-out environments; one EvalRun row plus its rollouts."""
    from arenaforge.tasks.rollout.evaluate import EvalConfig, evaluate

    cfg = config_for(params)
    wh = warehouse_for(cfg)
    envs = select_envs(wh, params.envs)
    path = model_path_for(params.model_path)
    tokenizer = _load_tokenizer(path)
    with recorded_run(wh, "eval", params.model_dump(mode="json")) as (run, counts):
        model = None
        if params.engine == "hf":
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(path).to(params.device)
        engine = engine_factory(params.model_copy(update={"model_path": path}))(model, tokenizer)
        eval_cfg = EvalConfig(samples=params.samples, concurrency=params.concurrency,
                              rollout=params.episode.rollout_config(params.seed))
        summary, rollouts = asyncio.run(_with_pool(cfg, lambda pool: evaluate(engine, tokenizer, pool, envs,
                                                                              eval_cfg, run.id)))
        rejections = env_failure_rejections(rollouts, "eval")
        counts["rollouts"] = wh.upsert([summary, *rollouts, *rejections]) - 1 - len(rejections)
        counts["episodes"] = summary.episodes
    return {"run_id": run.id, "eval_id": summary.id, "f1": summary.f1, "recall": summary.recall,
            "precision": summary.precision, "calls_per_task": summary.calls_per_task,
            "failure_reasons": summary.failure_reasons, "episodes": summary.episodes}


def _out_dir(cfg: Config, out_dir: str | None, experiment: str) -> Path:
    return Path(out_dir or Path(cfg.out_dir) / "train") / experiment


def grpo_job(params: GrpoParams) -> dict[str, Any]:
    """GRPO on one node, or — with verl.ray_address / verl.spec_only — the verl job hand-off."""
    cfg = config_for(params)
    wh = warehouse_for(cfg)
    envs = select_envs(wh, params.envs)
    out = _out_dir(cfg, params.out_dir, params.experiment)
    if not params.verl.ray_address and cfg.train.ray_address:  # a configured cluster: scale out
        params = params.model_copy(update={"verl": params.verl.model_copy(update={"ray_address": cfg.train.ray_address})})
    if params.warmstart_steps and (params.engine == "vllm" or params.verl.ray_address or params.verl.spec_only):
        raise ConfigError("--warmstart-steps trains a local copy (engines hf, vllm-local); for a vllm server or verl "
                          "run `train warmstart` + `train sft` and serve/pass that checkpoint")
    if params.verl.ray_address or params.verl.spec_only:
        return verl_job(params, cfg, wh, envs, out)
    from arenaforge.tasks.train.grpo import GrpoConfig
    from arenaforge.tasks.train.run_grpo import GrpoRunConfig, train_grpo

    path = model_path_for(params.model_path)
    warm: dict[str, Any] = {}
    if params.warmstart_steps:
        warm = warmstart_sft(params, cfg, wh, envs, path, out.with_name(f"{out.name}-warmstart"))
        path = warm["checkpoint"]
    run_cfg = GrpoRunConfig(
        out_dir=str(out), steps=params.steps, batch_groups=params.batch_groups, group_size=params.group_size,
        delta=params.delta, roc=params.roc, max_groups_per_step=params.max_groups_per_step,
        checkpoint_every=params.checkpoint_every, keep_optimizer=params.keep_optimizer,
        concurrency=params.concurrency, seed=params.seed, device=params.device, rollout=params.episode.rollout_config(params.seed),
        grpo=GrpoConfig(lr=params.lr, micro_batch_size=params.micro_batch_size, old_logprobs=params.old_logprobs),
    )
    factory = engine_factory(params.model_copy(update={"model_path": path}))
    with recorded_run(wh, "train-grpo", params.model_dump(mode="json")) as (run, counts):
        summary = asyncio.run(_with_pool(cfg, lambda pool: train_grpo(run_cfg, path, factory, pool, envs, wh, run.id)))
        counts["steps"] = summary.last_step - summary.first_step + 1
        counts["checkpoints"] = len(summary.checkpoints)
    last = summary.metrics[-1] if summary.metrics else {}
    return {"run_id": run.id, "experiment": summary.experiment, "first_step": summary.first_step,
            "last_step": summary.last_step, "resumed_from": summary.resumed_from, "checkpoints": summary.checkpoints,
            "last_metrics": last, **({"warmstart": warm} if warm else {})}


async def _warmstart_examples(cfg: Config, envs: Sequence[Environment]) -> tuple[list[dict[str, Any]], list[Any]]:
    from arenaforge.tasks.train.warmstart import warmstart_examples

    return await _with_pool(cfg, lambda pool: warmstart_examples(pool, envs))


def warmstart_sft(params: GrpoParams, cfg: Config, wh: Warehouse, envs: Sequence[Environment], model_path: str,
                  out: Path) -> dict[str, Any]:
    """SFT from `model_path` on the gold-call conversations of `envs` (`out`); returns its final checkpoint.

    Re-running the same experiment resumes (or, when done, reuses) the warm-start checkpoints.
    """
    from arenaforge.tasks.train.checkpoints import CheckpointManager
    from arenaforge.tasks.train.sft import SftConfig, train_sft
    from arenaforge.tasks.train.warmstart import write_jsonl

    with recorded_run(wh, "train-warmstart", params.model_dump(mode="json")) as (run, counts):
        examples, rejections = asyncio.run(_warmstart_examples(cfg, envs))
        counts["rejections"] = wh.upsert([r.model_copy(update={"run_id": run.id}) for r in rejections])
        if not examples:
            raise InputError(f"warm start: no environment's gold calls replay cleanly ({len(rejections)} rejected)")
        data = write_jsonl(examples, out / "warmstart.jsonl")
        sft_cfg = SftConfig(out_dir=str(out), epochs=10**6, max_steps=params.warmstart_steps,
                            batch_size=params.warmstart_batch_size, lr=params.warmstart_lr,
                            checkpoint_every=params.warmstart_steps, keep_optimizer=1, seed=params.seed,
                            device=params.device)
        summary = train_sft(sft_cfg, model_path, data, wh, run.id)
        counts["steps"] = summary.last_step - summary.first_step + 1
    final = CheckpointManager(out).checkpoints()[-1]
    return {"checkpoint": str(final.path), "examples": len(examples), "rejected": len(rejections),
            "steps": final.step, "last_loss": summary.metrics[-1]["loss"] if summary.metrics else None}


def warmstart_job(params: WarmstartParams) -> dict[str, Any]:
    """Write the warm-start SFT conversations of the selected environments to <out>/warmstart.jsonl."""
    from arenaforge.tasks.train.warmstart import write_jsonl

    cfg = config_for(params)
    wh = warehouse_for(cfg)
    envs = select_envs(wh, params.envs)
    with recorded_run(wh, "warmstart", params.model_dump(mode="json")) as (run, counts):
        examples, rejections = asyncio.run(_warmstart_examples(cfg, envs))
        counts["rejections"] = wh.upsert([r.model_copy(update={"run_id": run.id}) for r in rejections])
        path = write_jsonl(examples, Path(params.out) / "warmstart.jsonl")
        counts["examples"] = len(examples)
    return {"run_id": run.id, "path": str(path), "examples": len(examples), "rejected": len(rejections)}


def verl_job(params: GrpoParams, cfg: Config, wh: Warehouse, envs: Sequence[Environment], out: Path) -> dict[str, Any]:
    from arenaforge.tasks.verl.job import VerlJobSpec, submit, write_job

    v = params.verl
    spec = VerlJobSpec(
        model_path=model_path_for(params.model_path), out_dir=str(out / "verl"), experiment=params.experiment,
        train_batch_size=v.train_batch_size, group_size=params.group_size, lr=params.lr,
        max_prompt_length=v.max_prompt_length, max_response_length=v.max_response_length,
        max_turns=params.episode.max_turns, total_steps=v.total_steps, save_freq=params.checkpoint_every,
        nnodes=v.nnodes, gpus_per_node=v.gpus_per_node, tensor_parallel=v.tensor_parallel,
    )
    eval_envs = [e for e in wh.load(Environment) if in_eval_split(e.id, params.envs.eval_share)]
    with recorded_run(wh, "train-grpo", params.model_dump(mode="json")) as (run, counts):
        job = write_job(spec, envs, eval_envs)
        job_id = None if v.spec_only or not v.ray_address else submit(job, v.ray_address)
        counts["environments"] = len(envs)
    return {"run_id": run.id, "verl_job": str(Path(spec.out_dir) / "job.json"), "ray_job_id": job_id,
            "entrypoint": job.entrypoint}


def sft_job(params: SftParams) -> dict[str, Any]:
    from arenaforge.tasks.train.sft import SftConfig, train_sft

    cfg = config_for(params)
    wh = warehouse_for(cfg)
    out = _out_dir(cfg, params.out_dir, params.experiment)
    sft_cfg = SftConfig(out_dir=str(out), epochs=params.epochs, max_steps=params.max_steps,
                        batch_size=params.batch_size, lr=params.lr, max_length=params.max_length,
                        checkpoint_every=params.checkpoint_every, keep_optimizer=params.keep_optimizer,
                        seed=params.seed)
    with recorded_run(wh, "train-sft", params.model_dump(mode="json")) as (run, counts):
        summary = train_sft(sft_cfg, model_path_for(params.model_path), params.data, wh, run.id)
        counts["steps"] = summary.last_step - summary.first_step + 1
        counts["skipped_examples"] = summary.skipped
    return {"run_id": run.id, "experiment": summary.experiment, "first_step": summary.first_step,
            "last_step": summary.last_step, "resumed_from": summary.resumed_from,
            "last_loss": summary.metrics[-1]["loss"] if summary.metrics else None}
