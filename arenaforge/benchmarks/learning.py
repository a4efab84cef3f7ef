"""`arenaforge bench learning`: does a policy trained on Arenaforge data get better on held-out environments?

One command, one run, fixed seeds, offline:
  1. data: the bundled sample tools -> kept SFT-track trajectories; the sample knowledge source -> `n`
     verified environments; the stored split (near-duplicate groups stratified by source/structure);
  2. the default policy untrained, after the warm start (SFT on gold-call replays of the train split +
     kept trajectories), and after GRPO started from that same warm-start checkpoint, each evaluated
     greedily on the test split (the `train-grpo` job, exactly what `arenaforge train grpo` runs);
  3. the same three checkpoints on BFCL single-turn (simple, multiple, parallel), when its data is found;
  4. with `--suite NAME --suite-db WAREHOUSE`, on a suite nobody here wrote (`arenaforge envs import ...`): our F1
     and the suite's own metric (`native`), every environment of the suite (`--suite-limit`).

Reports test F1 per stage with a 95% bootstrap interval over test environments, the GRPO - warm start
difference with a paired interval, per-step curves, wall-clock per phase and tokens/s.
"""

from __future__ import annotations

import random
import statistics
import time
from importlib import resources
from pathlib import Path
from typing import Any

from arenaforge.schemas.config import load_config
from arenaforge.schemas.errors import InputError
from arenaforge.schemas.kinds_training import TrainStep
from arenaforge.schemas.models import Rollout
from arenaforge.tracks.train.params import RECIPE, GrpoParams
from arenaforge.warehouse import Warehouse

_RECIPE = GrpoParams(**RECIPE)  # the recipe's settings: this benchmark's defaults
BOOTSTRAP = 2000


def bootstrap_ci(values: list[float], seed: int = 0, resamples: int = BOOTSTRAP) -> list[float]:
    """95% percentile interval of the mean of `values`."""
    if not values:
        return [0.0, 0.0]
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choices(values, k=len(values))) for _ in range(resamples))
    return [round(means[int(0.025 * resamples)], 4), round(means[int(0.975 * resamples) - 1], 4)]


def progress_to_stderr() -> None:
    """Per-step lines of the `arenaforge` loggers on stderr; a bench's JSON result goes to stdout."""
    import logging
    import sys

    progress = logging.getLogger("arenaforge")
    if not progress.handlers:
        progress.addHandler(logging.StreamHandler(sys.stderr))
        progress.setLevel(logging.INFO)


def _episode_f1(rollouts: list[Rollout]) -> dict[str, float]:
    return {r.env_id: r.reward.f1 for r in rollouts if r.status != "env_failure"}


async def _synthesize(cfg: Any, wh: Warehouse, n: int, seed: int) -> dict[str, Any]:
    """Offline SFT-track trajectories and RL environments from the bundled sample data."""
    from arenaforge.services.run_scope import open_run_scope
    from arenaforge.tracks.envs.pipeline import EnvsSpec, build_environments, synthesize_qas
    from arenaforge.tracks.sft import stages

    data = resources.files("arenaforge.data")
    started = time.perf_counter()
    async with open_run_scope(cfg, wh, "bench-learning") as run:
        await stages.ingest(run, [str(data.joinpath("sample_tools"))])
        await stages.build_graphs(run)
        chains, _ = await stages.sample_chains(run, seed=seed)
        tasks, _ = await stages.synthesize_tasks(run, chains, seed=seed)
        trajectories, _ = await stages.run_trajectories(run, tasks, seed=seed)
        kept, _ = await stages.judge(run, trajectories)
        spec = EnvsSpec(sources=["sample"], n=n, seed=seed)
        qa_ids, _ = await synthesize_qas(run, spec)
        await build_environments(run, spec, qa_ids)
    return {"kept_trajectories": len(kept), "environments": wh.count("environments"),
            "seconds": round(time.perf_counter() - started, 1)}


async def _bfcl(paths: dict[str, str], limit: int, ground: bool = True) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from arenaforge.services.policy.hf import HfEngine
    from arenaforge.tracks.train.rollout.bfcl import BfclUnavailable, evaluate_bfcl, load_bfcl

    try:
        items, origin = load_bfcl(limit=limit)
    except BfclUnavailable as err:
        return {"skipped": str(err)}
    out: dict[str, Any] = {"data": origin, "per_category_limit": limit}
    for label, path in paths.items():
        started = time.perf_counter()
        tokenizer = AutoTokenizer.from_pretrained(path)
        engine = HfEngine(AutoModelForCausalLM.from_pretrained(path), tokenizer, policy=path)
        result = await evaluate_bfcl(engine, tokenizer, items, ground=ground)
        out[label] = {k: v for k, v in result.items() if k not in ("per_item", "answers")} | {
            "seconds": round(time.perf_counter() - started, 1)}
    return out


async def evaluate_suite(cfg: Any, wh: Warehouse, paths: dict[str, str], suite: str, suite_db: str,
                         limit: int | None = None, episode: Any = None, concurrency: int = 32) -> dict[str, Any]:
    """Each stage's policy on an imported suite (`envs import ...`, stored in `suite_db`), every split, greedy with the
    training episode limits (or `episode`): our F1 and the suite's own metric (`native`), beside the test split's
    numbers."""
    from arenaforge.tracks.train.env_selection import matching_envs
    from arenaforge.tracks.train.evaluation import evaluate_as_run, widened_output
    from arenaforge.tracks.train.params import TRAIN_EPISODE, EnvSelection, PolicyParams

    envs = matching_envs(Warehouse(suite_db), EnvSelection(suite=suite, split="all", limit=limit))
    if not envs:
        return {"skipped": f"no environments of suite {suite!r} in {suite_db}"}
    cfg = widened_output(cfg)  # an imported suite compares whole results and states: never cut them (`eval --suite`)
    episode = episode or TRAIN_EPISODE.model_copy(update={"temperature": 0.0})
    out: dict[str, Any] = {"suite": suite, "environments": len(envs)}
    for label, path in paths.items():
        row = await evaluate_as_run(cfg, wh, PolicyParams(model_path=path), path, envs, episode,
                                    label=f"{label} on {suite}", suite=suite, samples=1, seed=0,
                                    concurrency=concurrency)
        out[label] = {"f1": round(row["f1"], 4), "native": row.get("native"), "episodes": row["episodes"],
                      "statuses": row["statuses"]}
    return out


async def main(out: str = "out/bench-learning", n: int = 2000, model: str = "arena-small",
         warmstart_steps: int = _RECIPE.warmstart_steps, warmstart_batch_size: int = _RECIPE.warmstart_batch_size,
         warmstart_lr: float = _RECIPE.warmstart_lr, warmstart_copy_variants: int = _RECIPE.warmstart_copy_variants,
         grpo_steps: int = _RECIPE.steps, grpo_lr: float = _RECIPE.lr, group_size: int = _RECIPE.group_size,
         batch_groups: int = _RECIPE.batch_groups, temperature: float = _RECIPE.episode.temperature,
         test_share: float = _RECIPE.envs.test_share, eval_limit: int = _RECIPE.eval_limit, bfcl_limit: int = 20,
         sandbox: str = "process", seed: int = _RECIPE.seed, suite: str = "", suite_db: str = "",
         suite_limit: int = 50, ground_arguments: bool = _RECIPE.episode.ground_arguments,
         skip_forced_tokens: bool = _RECIPE.skip_forced_tokens) -> dict[str, Any]:
    """Untrained / warm start / warm start + GRPO on the test split (F1 with 95% bootstrap intervals) and BFCL, and
    with `--suite NAME --suite-db WAREHOUSE` on an imported suite (its native metric beside our F1).
    `--no-ground-arguments`: tool-call argument values decoded free instead of copied from the conversation.

    Args:
        out: Folder of the run: its warehouse (learning.duckdb), checkpoints and curves.
        n: QAs synthesized from the sample source (into environments).
        model: The policy trained: arena-small, tiny or smollm2-135m.
        warmstart_steps: Warm-start SFT steps (gold-call replays and kept SFT-track trajectories).
        warmstart_batch_size: Warm-start SFT examples per step.
        warmstart_lr: Warm-start SFT learning rate (peak, after warm-up).
        warmstart_copy_variants: Copy-forced variants per gold-call replay in the warm-start data.
        grpo_steps: GRPO steps from the warm start.
        grpo_lr: GRPO learning rate.
        group_size: Rollouts per GRPO group (G).
        batch_groups: GRPO groups per step.
        temperature: GRPO rollouts' sampling temperature (evaluations are greedy).
        test_share: Share of each structure's near-duplicate groups held out as test.
        eval_limit: Test environments each stage is evaluated on.
        bfcl_limit: BFCL single-turn questions per category (0: skip BFCL).
        sandbox: Sandbox backend: process, docker or auto.
        seed: Seed of synthesis, split, training and sampling.
        suite: An imported suite to evaluate each stage on as well (empty: none).
        suite_db: --suite: the warehouse the suite was imported into.
        suite_limit: --suite: at most this many of its environments.
        ground_arguments: Top-level argument values copied from the conversation (--no-ground-arguments: decoded free).
        skip_forced_tokens: Tokens constrained decoding forced stay out of the GRPO loss (--no-skip-forced-tokens: in).
    """
    from arenaforge.tracks.train.grpo_job import grpo_job
    from arenaforge.tracks.train.job_config import open_job_scope
    from arenaforge.tracks.train.params import EnvSelection, GrpoParams

    if suite and not (suite_db and Path(suite_db).exists()):  # checked before an hour of training, not after
        raise InputError(f"--suite needs --suite-db: the warehouse the suite was imported into ({suite_db!r} is not one)")
    progress_to_stderr()
    started = time.perf_counter()
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    db = root / "learning.duckdb"
    cfg = load_config(None, overrides={"warehouse.path": str(db), "sandbox.backend": sandbox, "model.backend": "offline"})
    wh = Warehouse(db)
    data = await _synthesize(cfg, wh, n, seed) if wh.count("environments") == 0 else {
        "environments": wh.count("environments"), "reused": str(db)}
    params = GrpoParams(db=str(db), model_path=model, out_dir=str(root / "train"), experiment=f"grpo-seed{seed}",
                        steps=grpo_steps, lr=grpo_lr, group_size=group_size, batch_groups=batch_groups,
                        warmstart_steps=warmstart_steps, warmstart_lr=warmstart_lr,
                        warmstart_batch_size=warmstart_batch_size, warmstart_copy_variants=warmstart_copy_variants,
                        eval_limit=eval_limit, seed=seed, skip_forced_tokens=skip_forced_tokens,
                        envs=EnvSelection(split="train", test_share=test_share, split_seed=seed))
    params = params.model_copy(update={"episode": params.episode.model_copy(
        update={"temperature": temperature, "ground_arguments": ground_arguments})})
    import os

    os.environ["ARENAFORGE_SANDBOX__BACKEND"] = sandbox  # the job reads config itself
    trained = time.perf_counter()
    eval_rollouts: dict[str, list[Rollout]] = {}
    async with open_job_scope(params, "train-grpo") as scope:
        result = await grpo_job(scope, params, eval_rollouts)
    train_s = time.perf_counter() - trained

    evals = result.get("eval", {})
    f1 = {label: _episode_f1(eval_rollouts.get(label, [])) for label in evals}
    stages: dict[str, Any] = {}
    for label, row in evals.items():
        values = list(f1[label].values())
        stages[label] = {"test_f1": round(row["f1"], 4), "ci95": bootstrap_ci(values, seed),
                         "recall": round(row["recall"], 4), "precision": round(row["precision"], 4),
                         "calls": round(row["calls_per_task"], 3), "format_errors": round(row["format_errors_per_task"], 3),
                         "episodes": row["episodes"], "policy": row["policy"]}
    delta: dict[str, Any] = {}
    if "warm start" in f1 and "warm start + GRPO" in f1:
        common = sorted(set(f1["warm start"]) & set(f1["warm start + GRPO"]))
        diffs = [f1["warm start + GRPO"][e] - f1["warm start"][e] for e in common]
        delta = {"grpo_minus_warmstart": round(statistics.fmean(diffs), 4) if diffs else 0.0,
                 "ci95_paired": bootstrap_ci(diffs, seed), "environments": len(common)}

    warm_run = (result.get("warmstart") or {}).get("run_id")
    warm_steps = sorted(wh.load(TrainStep, where="run_id = ?", params=[warm_run]), key=lambda s: s.step) if warm_run else []
    grpo_steps_rows = sorted(wh.load(TrainStep, where="run_id = ?", params=[result["run_id"]]), key=lambda s: s.step)
    curves = {
        "warmstart_loss": [round(s.metrics["loss"], 4) for s in warm_steps],
        "grpo": [{k: round(s.metrics.get(k, 0.0), 4) for k in ("reward", "recall", "precision", "zero_variance_share",
                                                                   "groups_used", "groups_generated", "skipped", "loss",
                                                                   "rollout_s", "train_s")} | {"step": s.step}
                 for s in grpo_steps_rows],
    }
    grpo_metrics = [s.metrics for s in grpo_steps_rows]
    generated = sum(m.get("model_tokens", 0.0) * m.get("groups_generated", 0.0) * group_size for m in grpo_metrics)
    rollout_s = sum(m.get("rollout_s", 0.0) for m in grpo_metrics)
    throughput = {
        "warmstart_train_tokens_per_s": round(statistics.fmean([s.metrics["tokens_per_s"] for s in warm_steps]), 1)
        if warm_steps else None,
        "grpo_rollout_model_tokens_per_s": round(generated / rollout_s, 1) if rollout_s else None,
        "grpo_train_tokens_per_s": round(statistics.fmean([m["tokens_per_s"] for m in grpo_metrics if "tokens_per_s" in m]), 1)
        if any("tokens_per_s" in m for m in grpo_metrics) else None,
    }
    wall = {"data_s": data.get("seconds"), "train_and_eval_s": round(train_s, 1),
            "warmstart_s": round(sum(s.metrics.get("train_s", 0.0) for s in warm_steps), 1),
            "grpo_s": round(sum(m.get("rollout_s", 0.0) + m.get("train_s", 0.0) for m in grpo_metrics), 1)}
    paths = {label: row["policy"] for label, row in evals.items()}
    bfcl_started = time.perf_counter()
    bfcl = await _bfcl(paths, bfcl_limit, ground_arguments) if bfcl_limit else {"skipped": "bfcl_limit 0"}
    wall["bfcl_s"] = round(time.perf_counter() - bfcl_started, 1)
    imported = await evaluate_suite(cfg, wh, paths, suite, suite_db, suite_limit) if suite else {"skipped": "no --suite"}
    wall["total_s"] = round(time.perf_counter() - started, 1)
    zero_var = [m["zero_variance_share"] for m in grpo_metrics if not m.get("skipped")] or [1.0]
    try:
        load = [round(x, 2) for x in os.getloadavg()]
    except OSError:
        load = []
    return {
        "config": {"model": model, "n": n, "warmstart_steps": warmstart_steps, "warmstart_lr": warmstart_lr,
                   "warmstart_batch_size": warmstart_batch_size, "warmstart_copy_variants": warmstart_copy_variants,
                   "eval_limit": eval_limit,
                   "grpo_steps": grpo_steps, "grpo_lr": grpo_lr, "group_size": group_size, "batch_groups": batch_groups,
                   "temperature": temperature, "test_share": test_share, "seed": seed,
                   "ground_arguments": ground_arguments, "skip_forced_tokens": skip_forced_tokens},
        "data": data, "stages": stages, "grpo_vs_warmstart": delta,
        "grpo": {"steps": len(grpo_metrics), "skipped_steps": int(sum(m.get("skipped", 0) for m in grpo_metrics)),
                 "zero_variance_share_mean": round(statistics.fmean(m["zero_variance_share"] for m in grpo_metrics), 4)
                 if grpo_metrics else None,
                 "zero_variance_share_used_steps": round(statistics.fmean(zero_var), 4)},
        "curves": curves, "bfcl": bfcl, "imported_suite": imported, "wall_clock": wall, "throughput": throughput, "load_average_end": load,
        "warehouse": str(db), "final_checkpoint": result.get("final_checkpoint"),
    }
