"""SFT on the SFT export: OpenAI `{"messages": [...], "tools": [...]}` JSONL, loss on assistant tokens only.

Each example is rendered with the model's own chat template; the template marks assistant
turns (`{% generation %}`), and transformers returns that as `assistant_masks`, so system,
user and tool text never enters the loss. The loss is the token-level mean over assistant
tokens of the batch. Checkpoints follow the same policy as GRPO (`checkpoints.py`); resume
restores model, optimizer, scheduler and the position in the data.

`precision = "bf16"` runs the forward and backward passes under bf16 autocast (mixed precision: the weights, their
gradients and AdamW's state stay fp32, and so do the saved checkpoints). On a CPU with AMX, SmolLM2-135M then trains
at 1.2-2.2x the fp32 rate (`arenaforge bench train_speed`, docs/TRAINING.md).

`lora_rank = r` trains LoRA adapters (peft; rank r, alpha 2r, every linear layer) instead of all weights. Each
checkpoint holds the merged model, so eval, the hf engine and vLLM load it as any model; its trainer state holds the
adapters, so a resume starts from the base model and the saved adapters, with their optimizer state.
"""

from __future__ import annotations

import copy
import json
import logging
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from arenaforge.schemas.errors import ConfigError, InputError
from arenaforge.schemas.kinds_training import Checkpoint, TrainStep
from arenaforge.tracks.train.checkpoints import CheckpointManager
from arenaforge.tracks.train.params import SftParams, derived_values
from arenaforge.warehouse import Warehouse

log = logging.getLogger("arenaforge.train")
LOG_EVERY = 10  # steps between progress lines


@dataclass(frozen=True)
class SftConfig:
    """One SFT run; its settings' defaults are `SftParams`' (`from_params`), the rest are the trainer's own."""

    out_dir: str
    epochs: int
    max_steps: int | None
    batch_size: int
    lr: float
    max_length: int
    checkpoint_every: int
    keep_optimizer: int
    seed: int
    precision: str  # "bf16": forward and backward under bf16 autocast; weights and optimizer stay fp32
    lora_rank: int  # > 0: train LoRA adapters of this rank on every linear layer; checkpoints are merged
    warmup_steps: int = 0
    decay: bool = False  # after warm-up, decay the lr linearly to 10% at the last step (warm start from scratch)
    max_grad_norm: float = 1.0
    device: str = "cpu"

    @classmethod
    def from_params(cls, params: SftParams, **changes: Any) -> SftConfig:
        """The params' values of this config's fields, with `changes` (out_dir, and what a warm start sets)."""
        return cls(**{**derived_values(cls, params), **changes})


@dataclass
class SftSummary:
    experiment: str
    first_step: int
    last_step: int
    resumed_from: str | None
    skipped: int
    metrics: list[dict[str, float]]


def load_examples(path: str | Path) -> list[dict[str, Any]]:
    """Examples of an SFT JSONL export; a line without `messages` is an input error."""
    examples = []
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as err:
        raise InputError(f"cannot read SFT data {Path(path).resolve()}: {err.strerror}") from None
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise InputError(f"{path}:{number}: not JSON ({err.msg})") from None
        if not isinstance(row, dict) or not isinstance(row.get("messages"), list):
            raise InputError(f"{path}:{number}: expected an object with a messages list")
        examples.append(row)
    return examples


def encode(tokenizer: Any, example: dict[str, Any], max_length: int) -> tuple[list[int], list[int]] | None:
    """(input ids, assistant mask), or None when the example has no assistant token left after truncation."""
    messages = [{k: v for k, v in m.items() if v is not None} for m in example["messages"]]
    for m in messages:  # the template reads arguments as a string or an object; normalise once
        for call in m.get("tool_calls") or []:
            args = call.get("function", {}).get("arguments")
            if isinstance(args, str):
                try:
                    call["function"]["arguments"] = json.loads(args)
                except json.JSONDecodeError:
                    pass
    tools = example.get("tools") or None
    if isinstance(tools, str):  # the Parquet export (and exports before 0.2) hold tools as one JSON string
        tools = json.loads(tools)
    out = tokenizer.apply_chat_template(messages, tools=tools, tokenize=True,
                                        return_dict=True, return_assistant_tokens_mask=True)
    ids, mask = list(out["input_ids"])[:max_length], list(out["assistant_masks"])[:max_length]
    return (ids, mask) if sum(mask) else None


def _collate(rows: list[tuple[list[int], list[int]]], pad_id: int) -> tuple[torch.Tensor, ...]:
    width = max(len(ids) for ids, _ in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attn = torch.zeros((len(rows), width), dtype=torch.long)
    target = torch.zeros((len(rows), width))
    for i, (seq, mask) in enumerate(rows):
        ids[i, : len(seq)] = torch.tensor(seq)
        attn[i, : len(seq)] = 1
        target[i, : len(seq)] = torch.tensor(mask, dtype=torch.float)
    return ids, attn, target


def sft_loss(model: Any, ids: torch.Tensor, attn: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, int]:
    logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]
    # rows of the vocabulary, contiguous: cross-entropy over a transposed (batch, vocab, time) view strided through a
    # 49k vocabulary and cost SmolLM2 a quarter of its step time (`bench train_speed`)
    nll = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), ids[:, 1:].reshape(-1),
                                            reduction="none").view(ids.shape[0], -1)
    mask = target[:, 1:]
    tokens = mask.sum()
    return (nll * mask).sum() / tokens.clamp(min=1.0), int(tokens)


def with_lora(model: Any, rank: int) -> Any:
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError:
        raise ConfigError("LoRA needs peft: pip install 'arenaforge[lora]'") from None
    return get_peft_model(model, LoraConfig(r=rank, lora_alpha=2 * rank, target_modules="all-linear",
                                            lora_dropout=0.0))


def merged(model: Any) -> Any:
    """A plain model with the adapters folded in (a copy: training goes on with the adapters)."""
    return copy.deepcopy(model).merge_and_unload()


def train_sft(cfg: SftConfig, model_path: str | Path, data_path: str | Path, wh: Warehouse | None = None,
              run_id: str | None = None) -> SftSummary:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = Path(cfg.out_dir)
    manager = CheckpointManager(out, cfg.checkpoint_every, cfg.keep_optimizer)
    saved = manager.latest_resumable()
    source = str(saved.path) if saved else str(model_path)
    # LoRA resumes from the base model and the saved adapters: the checkpoint's merged weights have them folded in
    model = AutoModelForCausalLM.from_pretrained(str(model_path) if cfg.lora_rank else source).to(cfg.device)
    if cfg.lora_rank:
        model = with_lora(model, cfg.lora_rank)
    tokenizer = AutoTokenizer.from_pretrained(source)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    encoded = [encode(tokenizer, ex, cfg.max_length) for ex in load_examples(data_path)]
    rows = [e for e in encoded if e is not None]
    if not rows:
        raise InputError(f"{data_path}: no example has an assistant token")
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=cfg.lr)
    warmup = cfg.warmup_steps
    per_epoch = -(-len(rows) // cfg.batch_size)
    total = per_epoch * cfg.epochs if cfg.max_steps is None else min(cfg.max_steps, per_epoch * cfg.epochs)

    def lr_factor(s: int) -> float:
        if warmup and s < warmup:
            return (s + 1) / warmup
        if cfg.decay:
            return 1.0 - 0.9 * (s - warmup) / max(1, total - warmup)
        return 1.0

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_factor)
    step = 0
    if saved is not None:
        state, meta = CheckpointManager.load_state(saved)
        if cfg.lora_rank:
            from peft import set_peft_model_state_dict

            if "adapter" not in state:
                raise InputError(f"{saved.path}: not a LoRA checkpoint; resume it without --lora-rank")
            set_peft_model_state_dict(model, state["adapter"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        step = int(meta["step"])
    summary = SftSummary(out.name, step + 1, step, str(saved.path) if saved else None, len(encoded) - len(rows), [])
    model.train()
    while step < total:
        epoch, offset = divmod(step, per_epoch)
        order = list(range(len(rows)))
        random.Random(cfg.seed + epoch).shuffle(order)  # same order on resume
        chunk = [rows[i] for i in order[offset * cfg.batch_size : (offset + 1) * cfg.batch_size]]
        started = time.perf_counter()
        device = next(model.parameters()).device
        ids, attn, target = (t.to(device) for t in _collate(chunk, pad_id))
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.precision == "bf16"):
            loss, tokens = sft_loss(model, ids, attn, target)
        loss.backward()
        grad_norm = float(torch.nn.utils.clip_grad_norm_(trained, cfg.max_grad_norm))
        optimizer.step()
        lr = scheduler.get_last_lr()[0]
        scheduler.step()
        step += 1
        elapsed = time.perf_counter() - started
        metrics = {"loss": float(loss.detach()), "assistant_tokens": float(tokens), "tokens": float(attn.sum()),
                   "grad_norm": grad_norm, "lr": lr, "epoch": float(epoch), "train_s": elapsed,
                   "tokens_per_s": float(attn.sum()) / max(elapsed, 1e-9)}
        records: list[Any] = [TrainStep(experiment=out.name, algorithm="sft", step=step, policy=source,
                                        metrics=metrics, run_id=run_id)]
        if manager.due(step, last=step == total):
            state = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}
            if cfg.lora_rank:
                from peft import get_peft_model_state_dict

                state["adapter"] = get_peft_model_state_dict(model)
            ckpt = manager.save(step, merged(model) if cfg.lora_rank else model, tokenizer, state,
                                {"algorithm": "sft", "lora_rank": cfg.lora_rank})
            records.append(Checkpoint(experiment=out.name, algorithm="sft", step=step, path=str(ckpt.path),
                                      has_optimizer=True, run_id=run_id))
        if wh is not None:
            wh.upsert(records)
        summary.metrics.append(metrics)
        summary.last_step = step
        if step % LOG_EVERY == 0 or step == total:
            log.info(f"sft {out.name} step {step}/{total}: loss {metrics['loss']:.4f}, lr {lr:.2g}, "
                     f"{metrics['tokens_per_s']:.0f} tokens/s")
    return summary


def validation_loss(model_path: str | Path, data_path: str | Path, max_length: int = 4096, batch_size: int = 4,
                    precision: str = "fp32") -> float:
    """Mean assistant-token loss of `model_path` on `data_path` (no gradient): what picks a checkpoint, never test."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(str(model_path)).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(model_path))
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    rows = [e for e in (encode(tokenizer, ex, max_length) for ex in load_examples(data_path)) if e is not None]
    total, tokens = 0.0, 0
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
        for start in range(0, len(rows), batch_size):
            loss, n = sft_loss(model, *_collate(rows[start:start + batch_size], pad_id))
            total, tokens = total + float(loss) * n, tokens + n
    return total / max(tokens, 1)
