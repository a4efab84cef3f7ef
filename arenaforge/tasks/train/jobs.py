"""Entry points shared by the CLI and the Prefect flows: typed params in, a small summary out.

Each job opens what it needs (config, warehouse, sandbox pool, engine), records a `runs` row
(`recorded_run`), and writes its records at step boundaries. Flows wrap these functions
(`arenaforge/flows/train_flows.py`); the CLI builds the same params models from flags. Jobs that
roll out in the sandbox are coroutines run in the flow's event loop (the CLI starts it); training
steps are plain CPU work inside them.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any, TypeVar

from arenaforge.schemas.config import Config, load_config
from arenaforge.schemas.errors import ConfigError, InputError
from arenaforge.schemas.models import Environment, Rollout
from arenaforge.tasks.policy.base import PolicyEngine, build_engine
from arenaforge.tasks.rollout.episodes import SandboxPool, env_failure_rejections
from arenaforge.tasks.train.params import (EnvSelection, EpisodeParams, EvalParams, GrpoParams, PolicyParams,
                                           RolloutParams, SftParams, WarmstartParams, _Params)
from arenaforge.warehouse import Warehouse, recorded_run

T = TypeVar("T")
log = logging.getLogger("arenaforge.train")
BASE_POLICIES = ("arena-small", "tiny", "smollm2-135m")
WARMSTART_MAX_LENGTH = 1024  # tokens of one warm-start example (long SFT-track trajectories are cut)


def config_for(params: _Params) -> Config:
    return load_config(params.config_path, overrides={"warehouse.path": params.db})


def warehouse_for(cfg: Config) -> Warehouse:
    return Warehouse(cfg.warehouse.path, lock_timeout_s=cfg.warehouse.lock_timeout_s,
                     data_path=cfg.warehouse.data_path)


def model_path_for(path: str | None) -> str:
    """A model directory for `--model-path`: a path, a named policy (arena-small, tiny, smollm2-135m) or the default."""
    from arenaforge.tasks.train.base_models import policy_path

    return policy_path(path)


def local_model_path(path: str | None) -> str:
    """`model_path_for`, for a model loaded on this machine: a missing folder is the user's one-line error here,
    not transformers' traceback about repository ids. A Hugging Face id (`org/name`) passes when it is cached."""
    resolved = model_path_for(path)
    if Path(resolved).expanduser().is_dir():
        return resolved
    if resolved.count("/") == 1 and not resolved.startswith((".", "/", "~")):
        from huggingface_hub import try_to_load_from_cache

        try:
            if isinstance(try_to_load_from_cache(resolved, "config.json"), str):
                return resolved
        except ValueError:  # not a valid repository id either
            pass
    raise InputError(f"--model-path {path}: no model folder there (give a checkpoint folder, a cached Hugging Face "
                     "id, or arena-small, tiny, smollm2-135m)")


def select_envs(wh: Warehouse, sel: EnvSelection) -> list[Environment]:
    """Environments from the warehouse, filtered and restricted to the stored split; an input error when none."""
    envs = matching_envs(wh, sel)
    if not envs:
        raise InputError(f"no environments in {wh.path} match {sel.model_dump(exclude_defaults=True) or 'the selection'}"
                         " (run `arenaforge envs ...` first)")
    return envs


def matching_envs(wh: Warehouse, sel: EnvSelection) -> list[Environment]:
    """Environments from the warehouse, filtered and restricted to the stored split (assigned on first use)."""
    from arenaforge.tasks.train.splits import ensure_splits

    envs = wh.load(Environment)
    if sel.suite:
        envs = [e for e in envs if e.native is not None and e.native.suite == sel.suite]
    if sel.env_ids:
        wanted = set(sel.env_ids)
        envs = [e for e in envs if e.id in wanted or e.name in wanted]
    if sel.split != "all":
        split = "test" if sel.split == "eval" else sel.split
        rows = ensure_splits(wh, scheme=sel.scheme, test_share=sel.test_share, seed=sel.split_seed)
        envs = [e for e in envs if rows[e.id].split == split]
    return envs[: sel.limit] if sel.limit else envs


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
    from arenaforge.environments.containers import RoutedPool
    from arenaforge.environments.runtime import create_pool

    pool = RoutedPool(await create_pool(cfg.sandbox))  # container tasks (imported Harbor) run in their own containers
    try:
        return await body(pool)
    finally:
        await pool.shutdown()


def _load_tokenizer(path: str) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


# --------------------------------------------------------------------------- jobs
async def rollout_job(params: RolloutParams, flow: str = "rollout") -> dict[str, Any]:
    """Roll out a policy on warehouse environments; rollouts are stored with the F1 reward."""
    from arenaforge.tasks.rollout.episodes import run_rollouts

    cfg = config_for(params)
    wh = warehouse_for(cfg)
    envs = select_envs(wh, params.envs)
    path = local_model_path(params.model_path)
    tokenizer = _load_tokenizer(path)
    with recorded_run(wh, flow, params.model_dump(mode="json")) as (run, counts):
        model = None
        if params.engine == "hf":
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(path).to(params.device)
        engine = engine_factory(params.model_copy(update={"model_path": path}))(model, tokenizer)
        episodes = await _with_pool(cfg, lambda pool: run_rollouts(
            engine, tokenizer, pool, envs, params.episode.rollout_config(params.seed), params.samples,
            params.concurrency))
        rollouts = [e.rollout.model_copy(update={"run_id": run.id}) for e in episodes]
        rejections = env_failure_rejections(rollouts)
        counts["rollouts"] = wh.upsert([*rollouts, *rejections]) - len(rejections)
        counts["env_failures"] = sum(r.status == "env_failure" for r in rollouts)
    scored = [r for r in rollouts if r.status != "env_failure"]
    return {"run_id": run.id, "rollouts": len(rollouts), "env_failures": counts["env_failures"],
            "mean_f1": sum(r.reward.f1 for r in scored) / len(scored) if scored else 0.0}


async def eval_job(params: EvalParams) -> dict[str, Any]:
    """Evaluate a policy on held-out environments (default: the test split); one EvalRun row plus its rollouts."""
    cfg = config_for(params)
    wh = warehouse_for(cfg)
    envs = select_envs(wh, params.envs)
    if any(e.native is not None for e in envs):  # an imported suite compares whole results and states: never cut them
        cfg = cfg.model_copy(update={"sandbox": cfg.sandbox.model_copy(
            update={"output_limit_bytes": max(cfg.sandbox.output_limit_bytes, 8 << 20)})})
    return await evaluate_policy(cfg, wh, params, local_model_path(params.model_path), envs, params.episode,
                                 samples=params.samples, seed=params.seed, concurrency=params.concurrency,
                                 flow_params=params.model_dump(mode="json"), suite=params.envs.suite)


EVAL_COLUMNS = ("f1", "recall", "precision", "calls_per_task", "format_errors_per_task", "episodes")


async def evaluate_policy(cfg: Config, wh: Warehouse, policy: PolicyParams, path: str, envs: Sequence[Environment],
                    episode: EpisodeParams, *, samples: int = 1, seed: int = 0, concurrency: int = 32,
                    label: str | None = None, flow_params: dict[str, Any] | None = None,
                    suite: str | None = None, rollouts_out: list[Rollout] | None = None) -> dict[str, Any]:
    """Roll out the policy at `path` on `envs` (an `eval` run); the EvalRun's numbers and ids. `rollouts_out`
    receives this run's rollouts (the warehouse keeps an identical rollout once, under the run that first made it)."""
    from arenaforge.tasks.rollout.evaluate import EvalConfig, evaluate

    tokenizer = _load_tokenizer(path)
    run_params = flow_params or {"model_path": path, "label": label, "env_ids": [e.id for e in envs]}
    with recorded_run(wh, "eval", run_params) as (run, counts):
        model = None
        if policy.engine == "hf":
            from transformers import AutoModelForCausalLM

            model = AutoModelForCausalLM.from_pretrained(path).to(policy.device)
        engine = engine_factory(policy.model_copy(update={"model_path": path}))(model, tokenizer)
        eval_cfg = EvalConfig(samples=samples, concurrency=concurrency, rollout=episode.rollout_config(seed))
        summary, rollouts = await _with_pool(cfg, lambda pool: evaluate(engine, tokenizer, pool, envs, eval_cfg,
                                                                         run.id, label, suite))
        if rollouts_out is not None:
            rollouts_out.extend(rollouts)
        rejections = env_failure_rejections(rollouts, "eval")
        counts["rollouts"] = wh.upsert([summary, *rollouts, *rejections]) - 1 - len(rejections)
        counts["episodes"] = summary.episodes
    return {"run_id": run.id, "eval_id": summary.id, "policy": path, **({"label": label} if label else {}),
            **{k: getattr(summary, k) for k in EVAL_COLUMNS}, "statuses": summary.statuses,
            "failure_reasons": summary.failure_reasons,
            **({"suite": suite, "native": summary.native} if suite or summary.native is not None else {})}


def _out_dir(cfg: Config, out_dir: str | None, experiment: str) -> Path:
    return Path(out_dir or Path(cfg.out_dir) / "train") / experiment


async def grpo_job(params: GrpoParams, eval_rollouts: dict[str, list[Rollout]] | None = None) -> dict[str, Any]:
    """GRPO on one node, or — with verl.ray_address / verl.spec_only — the verl job hand-off.

    `eval_rollouts` receives each evaluated stage's rollouts by label (for paired comparisons: the warehouse keeps an
    identical rollout once, under the run that first made it)."""
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
    from arenaforge.tasks.train.checkpoints import CheckpointManager
    from arenaforge.tasks.train.grpo import GrpoConfig
    from arenaforge.tasks.train.run_grpo import GrpoRunConfig, train_grpo
    from arenaforge.tasks.train.splits import ensure_splits

    path = local_model_path(params.model_path)
    test_envs = matching_envs(wh, params.envs.model_copy(update={"split": "test", "env_ids": [],
                                                                 "limit": params.eval_limit})) if params.evaluate else []
    if params.evaluate and not test_envs:
        log.info("no test environments in this warehouse's split: nothing to evaluate on")
    evals: dict[str, dict[str, Any]] = {}
    eval_episode = params.episode.model_copy(update={"temperature": 0.0})

    async def stage_eval(label: str, model: str) -> None:
        if test_envs:
            log.info(f"evaluating {label} on {len(test_envs)} test environments")
            evals[label] = await evaluate_policy(cfg, wh, params, model, test_envs, eval_episode, seed=params.seed,
                                                 concurrency=params.concurrency, label=label,
                                                 rollouts_out=None if eval_rollouts is None else
                                                 eval_rollouts.setdefault(label, []))
            log.info(f"{label}: test F1 {evals[label]['f1']:.3f}")

    await stage_eval("untrained" if params.model_path in (None, *BASE_POLICIES) else "start", path)
    warm: dict[str, Any] = {}
    if params.warmstart_steps:
        warm = await warmstart_sft(params, cfg, wh, envs, path, out.with_name(f"{out.name}-warmstart"))
        path = warm["checkpoint"]
        await stage_eval("warm start", path)
    run_cfg = GrpoRunConfig.from_params(params, out_dir=str(out), grpo=GrpoConfig.from_params(
        params, skip_forced_tokens=params.skip_forced_tokens and params.engine == "hf"))
    factory = engine_factory(params.model_copy(update={"model_path": path}))
    structures = {env_id: row.stratum for env_id, row in
                  ensure_splits(wh, scheme=params.envs.scheme, test_share=params.envs.test_share,
                                seed=params.envs.split_seed).items()}
    with recorded_run(wh, "train-grpo", params.model_dump(mode="json")) as (run, counts):
        summary = await _with_pool(cfg, lambda pool: train_grpo(run_cfg, path, factory, pool, envs, wh, run.id,
                                                                 structures))
        counts["steps"] = summary.last_step - summary.first_step + 1
        counts["checkpoints"] = len(summary.checkpoints)
    final = str(CheckpointManager(out).checkpoints()[-1].path)
    await stage_eval("warm start + GRPO" if warm else "GRPO", final)
    last = summary.metrics[-1] if summary.metrics else {}
    steps = summary.metrics
    return {"run_id": run.id, "experiment": summary.experiment, "first_step": summary.first_step,
            "last_step": summary.last_step, "resumed_from": summary.resumed_from, "checkpoints": summary.checkpoints,
            "final_checkpoint": final, "last_metrics": last,
            "skipped_steps": int(sum(m.get("skipped", 0) for m in steps)),
            "zero_variance_share": _mean_of(steps, "zero_variance_share"),
            **({"warmstart": warm} if warm else {}), **({"eval": evals} if evals else {})}


def _mean_of(rows: Sequence[dict[str, float]], key: str) -> float | None:
    values = [r[key] for r in rows if key in r]
    return round(sum(values) / len(values), 4) if values else None


async def _warmstart_examples(cfg: Config, envs: Sequence[Environment], copy_variants: int = 0,
                              seed: int = 0) -> tuple[list[dict[str, Any]], list[Any]]:
    """Gold-call replays of `envs`, then `copy_variants` copy-forced variants of each; and the rejections."""
    from arenaforge.tasks.train.copy_forcing import copy_forced_variants
    from arenaforge.tasks.train.warmstart import warmstart_examples

    replays, rejections = await _with_pool(cfg, lambda pool: warmstart_examples(pool, envs))
    variants = [v for e in replays for v in copy_forced_variants(e, copy_variants, seed)]
    return replays + variants, rejections


async def warmstart_sft(params: GrpoParams, cfg: Config, wh: Warehouse, envs: Sequence[Environment], model_path: str,
                  out: Path) -> dict[str, Any]:
    """SFT from `model_path` on the gold-call replays of `envs` plus kept SFT-track trajectories (`out`).

    Returns its final checkpoint. Re-running the same experiment resumes (or, when done, reuses) it.
    """
    from arenaforge.tasks.train.checkpoints import CheckpointManager
    from arenaforge.tasks.train.sft import SftConfig, train_sft
    from arenaforge.tasks.train.warmstart import trajectory_examples, write_jsonl

    with recorded_run(wh, "train-warmstart", params.model_dump(mode="json")) as (run, counts):
        examples, rejections = await _warmstart_examples(cfg, envs, params.warmstart_copy_variants, params.seed)
        counts["rejections"] = wh.upsert([r.model_copy(update={"run_id": run.id}) for r in rejections])
        if not examples:
            raise InputError(f"warm start: no environment's gold calls replay cleanly ({len(rejections)} rejected)")
        variants = sum(1 for e in examples if e.get("copy_forced"))
        replays = len(examples) - variants
        if params.warmstart_trajectories:
            examples += trajectory_examples(wh, params.warmstart_trajectories)
        counts["examples"] = len(examples)
        data = write_jsonl(examples, out / "warmstart.jsonl")
        log.info(f"warm start: {replays} gold-call replays + {variants} copy-forced variants + "
                 f"{len(examples) - replays - variants} SFT-track trajectories, {params.warmstart_steps} steps")
        sft_cfg = SftConfig(out_dir=str(out), epochs=10**6, max_steps=params.warmstart_steps,
                            batch_size=params.warmstart_batch_size, lr=params.warmstart_lr,
                            warmup_steps=min(20, params.warmstart_steps // 10), decay=True,
                            max_length=WARMSTART_MAX_LENGTH,
                            checkpoint_every=params.warmstart_steps, keep_optimizer=1, seed=params.seed,
                            device=params.device)
        summary = train_sft(sft_cfg, model_path, data, wh, run.id)
        counts["steps"] = summary.last_step - summary.first_step + 1
    final = CheckpointManager(out).checkpoints()[-1]
    return {"run_id": run.id, "checkpoint": str(final.path), "examples": len(examples), "replays": replays,
            "copy_forced": variants, "trajectories": len(examples) - replays - variants, "rejected": len(rejections),
            "steps": final.step, "last_loss": summary.metrics[-1]["loss"] if summary.metrics else None}


async def warmstart_job(params: WarmstartParams) -> dict[str, Any]:
    """Write the warm-start SFT conversations of the selected environments to <out>/warmstart.jsonl."""
    from arenaforge.tasks.train.warmstart import write_jsonl

    cfg = config_for(params)
    wh = warehouse_for(cfg)
    envs = select_envs(wh, params.envs)
    with recorded_run(wh, "warmstart", params.model_dump(mode="json")) as (run, counts):
        examples, rejections = await _warmstart_examples(cfg, envs, params.copy_variants, params.seed)
        counts["rejections"] = wh.upsert([r.model_copy(update={"run_id": run.id}) for r in rejections])
        path = write_jsonl(examples, Path(params.out or Path(cfg.out_dir) / "warmstart") / "warmstart.jsonl")
        counts["examples"] = len(examples)
    return {"run_id": run.id, "path": str(path), "examples": len(examples), "rejected": len(rejections)}


def verl_job(params: GrpoParams, cfg: Config, wh: Warehouse, envs: Sequence[Environment], out: Path) -> dict[str, Any]:
    from arenaforge.tasks.verl.job import VerlJobSpec, submit, write_job

    v = params.verl
    if params.lora_rank or params.precision != "fp32":  # verl sets these in its own actor config, not ours
        raise InputError("train grpo: --lora-rank and --precision are for training here; verl's actor has its own "
                         "(actor_rollout_ref.model.lora_rank, its FSDP mixed precision) in the written job")
    spec = VerlJobSpec.from_params(params, model_path=model_path_for(params.model_path), out_dir=str(out / "verl"))
    eval_envs = matching_envs(wh, params.envs.model_copy(update={"split": "test", "env_ids": [], "limit": None}))
    with recorded_run(wh, "train-grpo", params.model_dump(mode="json")) as (run, counts):
        job = write_job(spec, envs, eval_envs)
        job_id = None if v.spec_only or not v.ray_address else submit(job, v.ray_address)
        counts["environments"] = len(envs)
    return {"run_id": run.id, "verl_job": str(Path(spec.out_dir) / "job.json"), "ray_job_id": job_id,
            "entrypoint": job.entrypoint}


def sft_job(params: SftParams) -> dict[str, Any]:
    from arenaforge.tasks.train.sft import SftConfig, train_sft

    cfg = config_for(params)
    data = params.data or str(Path(cfg.out_dir) / "sft.jsonl")
    if not Path(data).is_file():
        raise InputError(f"train-sft: data {data}: no such file (write it with `arenaforge sft export`, or set data)")
    wh = warehouse_for(cfg)
    out = _out_dir(cfg, params.out_dir, params.experiment)
    sft_cfg = SftConfig(out_dir=str(out), epochs=params.epochs, max_steps=params.max_steps,
                        batch_size=params.batch_size, lr=params.lr, max_length=params.max_length,
                        checkpoint_every=params.checkpoint_every, keep_optimizer=params.keep_optimizer,
                        seed=params.seed, precision=params.precision, lora_rank=params.lora_rank)
    with recorded_run(wh, "train-sft", params.model_dump(mode="json")) as (run, counts):
        summary = train_sft(sft_cfg, local_model_path(params.model_path), data, wh, run.id)
        counts["steps"] = summary.last_step - summary.first_step + 1
        counts["skipped_examples"] = summary.skipped
    return {"run_id": run.id, "experiment": summary.experiment, "first_step": summary.first_step,
            "last_step": summary.last_step, "resumed_from": summary.resumed_from,
            "last_loss": summary.metrics[-1]["loss"] if summary.metrics else None}
