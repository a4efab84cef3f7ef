"""GRPO on one node: group-relative advantages, clip-higher token-level loss, no KL, no entropy.

The objective (METHOD.md §1c, §2): for each group of G rollouts of one prompt,
    A_i = (r_i - mean(r)) / (std(r) + 1e-4)          std unbiased, as TRL computes it
and for every model token t of every rollout (response_mask = 1; tool tokens never count)
    ratio = exp(logp_t - old_logp_t)
    loss_t = -min(ratio * A, clip(ratio, 1 - eps_low, 1 + eps_high) * A)
averaged over all model tokens of the batch (token-level mean, DAPO / TRL loss_type="dapo").
eps_low 0.2 / eps_high 0.28 are rStar2-Agent's clip-higher values. No KL and no entropy term.

`old_logp` is either the policy's own detached log-probs (`old_logprobs="policy"`: one update
per batch, ratio 1, the plain on-policy gradient) or the rollout engine's (`"engine"`: the
importance ratio against what vLLM actually sampled, METHOD.md §4).
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any, Literal

import torch

from arenaforge.schemas.errors import InputError
from arenaforge.schemas.models import Rollout
from arenaforge.tracks.train.params import GrpoParams

ADV_EPS = 1e-4  # TRL's constant, so advantages agree exactly


@dataclass(frozen=True)
class GrpoConfig:
    """The trainer's settings. Those a run sets (GrpoParams' fields of the same name) have no default here: a run
    builds this from its params (`from_params`); the others are the recipe's constants."""

    lr: float
    micro_batch_size: int
    old_logprobs: Literal["policy", "engine"]
    # Leave out of the loss the tokens the rollout engine sampled with probability 1 (log-prob exactly 0): with
    # constrained decoding those are the tokens the tool-call grammar forced (JSON syntax, a key, the rest of a
    # copied value). No choice was made there, so the constrained policy's gradient is 0; the unmasked log-prob
    # the trainer computes would instead push probability onto or off tokens the constraint never lets through.
    # Only for engines whose log-probs are those of the distribution sampled from (hf, constrained or not).
    skip_forced_tokens: bool
    # As in SFT (train/sft.py): bf16 autocast for the forward and backward (weights and optimizer stay fp32), and
    # LoRA adapters (rank r, every linear layer; the run wraps the model, train/run_grpo.py) instead of every weight.
    # With old_logprobs "policy" the ratio is 1 whatever the precision; with "engine" it compares against the engine.
    precision: Literal["fp32", "bf16"]
    lora_rank: int
    eps_low: float = 0.2
    eps_high: float = 0.28
    max_grad_norm: float = 1.0
    warmup_steps: int = 0
    weight_decay: float = 0.0

    @classmethod
    def from_params(cls, params: GrpoParams, **changes: Any) -> GrpoConfig:
        """The params' values of this config's fields (all top-level fields of GrpoParams), with `changes`."""
        return cls(**{**{f.name: getattr(params, f.name) for f in fields(cls) if f.name in GrpoParams.model_fields},
                      **changes})


def group_advantages(rewards: torch.Tensor) -> torch.Tensor:
    """(groups, G) rewards -> (groups, G) advantages; zero-variance groups give zeros."""
    mean = rewards.mean(dim=1, keepdim=True)
    std = rewards.std(dim=1, keepdim=True) if rewards.shape[1] > 1 else torch.zeros_like(mean)
    return (rewards - mean) / (std + ADV_EPS)


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
                eps_low: float, eps_high: float, normalizer: float | torch.Tensor | None = None
                ) -> tuple[torch.Tensor, dict[str, float]]:
    """Clip-higher surrogate summed over masked tokens / `normalizer` (default: masked token count).

    logp/old_logp/mask: (B, T); advantages: (B,) or (B, T).
    """
    if advantages.dim() == 1:
        advantages = advantages.unsqueeze(1)
    mask = mask.to(logp.dtype)
    ratio = torch.exp(logp - old_logp)
    clipped = torch.clamp(ratio, 1 - eps_low, 1 + eps_high)
    per_token = -torch.min(ratio * advantages, clipped * advantages)
    denom = mask.sum().clamp(min=1.0) if normalizer is None else normalizer
    loss = (per_token * mask).sum() / denom
    with torch.no_grad():
        n = mask.sum().clamp(min=1.0)
        low = ((ratio < 1 - eps_low) & (advantages < 0)).to(mask.dtype)
        high = ((ratio > 1 + eps_high) & (advantages > 0)).to(mask.dtype)
        stats = {"clip_low": float((low * mask).sum() / n), "clip_high": float((high * mask).sum() / n)}
    return loss, stats


def token_logprobs(model: Any, input_ids: torch.Tensor, attention_mask: torch.Tensor, first: int = 0) -> torch.Tensor:
    """log p(token_t | tokens_<t) for t = 1..T-1, shape (B, T-1); the entries before prediction position `first` are 0.

    A rollout's prompt is most of its tokens and no loss reads its log-probs: vocabulary-wide logits (and their
    log-softmax and gradient) only from `first` on keep a real policy's micro-batch in memory (SmolLM2's 49k vocabulary
    over 8 rollouts of ~1,400 tokens is 2.2 GB per copy, and a step makes several).
    """
    keep = input_ids.shape[1] - first  # logits of positions first .. T-1
    logits = model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=keep).logits[:, :-1].float()
    logp = torch.log_softmax(logits, dim=-1).gather(-1, input_ids[:, first + 1:].unsqueeze(-1)).squeeze(-1)
    return torch.nn.functional.pad(logp, (first, 0))


def first_loss_position(loss_mask: torch.Tensor) -> int:
    """The earliest prediction position any row's loss reads (0 when none does)."""
    used = loss_mask.any(dim=0).nonzero()
    return int(used[0]) if len(used) else 0


@dataclass
class PackedBatch:
    """Right-padded sequences; every tensor indexed at positions 1..T-1 (the predicted tokens)."""

    input_ids: torch.Tensor  # (B, T)
    attention_mask: torch.Tensor  # (B, T)
    loss_mask: torch.Tensor  # (B, T-1): 1 where a model-generated response token is predicted
    engine_logp: torch.Tensor  # (B, T-1)
    advantages: torch.Tensor  # (B,)

    def to(self, device: torch.device | str) -> "PackedBatch":
        return PackedBatch(*(t.to(device) for t in (self.input_ids, self.attention_mask, self.loss_mask,
                                                     self.engine_logp, self.advantages)))


def loss_token_mask(r: Rollout, skip_forced_tokens: bool = False) -> list[int]:
    """1 on the response tokens the loss counts: the model's, less (with `skip_forced_tokens`) those it sampled
    with probability 1 (GrpoConfig.skip_forced_tokens)."""
    if not (skip_forced_tokens and r.logprobs):
        return list(r.response_mask)
    return [m if lp != 0.0 else 0 for m, lp in zip(r.response_mask, r.logprobs, strict=True)]


def pack(rollouts: Sequence[Rollout], advantages: Sequence[float], pad_id: int,
         skip_forced_tokens: bool = False) -> PackedBatch:
    seqs = [r.prompt_ids + r.response_ids for r in rollouts]
    width = max(len(s) for s in seqs)
    b = len(seqs)
    ids = torch.full((b, width), pad_id, dtype=torch.long)
    attn = torch.zeros((b, width), dtype=torch.long)
    loss_mask = torch.zeros((b, width - 1))
    engine = torch.zeros((b, width - 1))
    for i, (r, seq) in enumerate(zip(rollouts, seqs, strict=True)):
        ids[i, : len(seq)] = torch.tensor(seq)
        attn[i, : len(seq)] = 1
        start = len(r.prompt_ids) - 1  # logits at position p predict token p+1
        end = start + len(r.response_ids)
        loss_mask[i, start:end] = torch.tensor(loss_token_mask(r, skip_forced_tokens), dtype=torch.float)
        engine[i, start:end] = torch.tensor(r.logprobs or [0.0] * len(r.response_ids), dtype=torch.float)
    return PackedBatch(ids, attn, loss_mask, engine, torch.tensor(list(advantages), dtype=torch.float))


def batch_advantages(groups: Sequence[Sequence[Rollout]]) -> list[float]:
    out: list[float] = []
    for group in groups:
        rewards = torch.tensor([[r.reward.f1 for r in group]], dtype=torch.float)
        out += group_advantages(rewards)[0].tolist()
    return out


class GrpoTrainer:
    """Owns the model, optimizer and constant-with-warmup scheduler; `step(groups)` is one update."""

    @classmethod
    def from_params(cls, model: Any, tokenizer: Any, params: GrpoParams) -> GrpoTrainer:
        """The trainer `params` configure (its config built here, where it is used)."""
        return cls(model, tokenizer, GrpoConfig.from_params(params))

    def __init__(self, model: Any, tokenizer: Any, cfg: GrpoConfig) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.cfg = cfg
        self.trained = [p for p in model.parameters() if p.requires_grad]  # LoRA: the adapters only
        self.optimizer = torch.optim.AdamW(self.trained, lr=cfg.lr, weight_decay=cfg.weight_decay)
        warmup = max(cfg.warmup_steps, 0)
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, lambda s: min(1.0, (s + 1) / warmup) if warmup else 1.0
        )
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def step(self, groups: Sequence[Sequence[Rollout]]) -> dict[str, float]:
        """One optimizer step on whole groups; returns loss/clip/grad-norm/throughput metrics."""
        started = time.perf_counter()
        rollouts = [r for g in groups for r in g]
        advantages = batch_advantages(groups)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        skip = self.cfg.skip_forced_tokens
        total_tokens = float(sum(sum(loss_token_mask(r, skip)) for r in rollouts))
        if not rollouts or total_tokens == 0:
            return {"loss": 0.0, "skipped": 1.0}
        loss_sum = clip_low = clip_high = 0.0
        tokens_seen = 0
        for start in range(0, len(rollouts), self.cfg.micro_batch_size):
            part = rollouts[start : start + self.cfg.micro_batch_size]
            batch = pack(part, advantages[start : start + len(part)], self.pad_id, skip).to(self.device)
            first = first_loss_position(batch.loss_mask)
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.cfg.precision == "bf16"):
                logp = token_logprobs(self.model, batch.input_ids, batch.attention_mask, first)
            old = logp.detach() if self.cfg.old_logprobs == "policy" else batch.engine_logp
            loss, stats = policy_loss(logp, old, batch.advantages, batch.loss_mask, self.cfg.eps_low,
                                      self.cfg.eps_high, normalizer=total_tokens)
            loss.backward()
            share = float(batch.loss_mask.sum()) / total_tokens
            loss_sum += float(loss.detach())
            clip_low += stats["clip_low"] * share
            clip_high += stats["clip_high"] * share
            tokens_seen += int(batch.attention_mask.sum())
        grad_norm = torch.nn.utils.clip_grad_norm_(self.trained, self.cfg.max_grad_norm)
        self.optimizer.step()
        lr = self.scheduler.get_last_lr()[0]
        self.scheduler.step()
        elapsed = time.perf_counter() - started
        return {
            "loss": loss_sum, "clip_low": clip_low, "clip_high": clip_high, "loss_tokens": total_tokens,
            "grad_norm": float(grad_norm) if math.isfinite(float(grad_norm)) else -1.0, "lr": lr,
            "train_s": elapsed, "train_tokens": float(tokens_seen), "tokens_per_s": tokens_seen / max(elapsed, 1e-9),
        }

    def state_dict(self) -> dict[str, Any]:
        state = {"optimizer": self.optimizer.state_dict(), "scheduler": self.scheduler.state_dict()}
        if self.cfg.lora_rank:  # the checkpoint's weights are merged; resume needs the adapters themselves
            from peft import get_peft_model_state_dict

            state["adapter"] = get_peft_model_state_dict(self.model)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.cfg.lora_rank:
            from peft import set_peft_model_state_dict

            if "adapter" not in state:
                raise InputError("this GRPO checkpoint holds no LoRA adapters; resume it with the rank it was "
                                 "trained with (--lora-rank 0 for every weight)")
            set_peft_model_state_dict(self.model, state["adapter"])
        elif "adapter" in state:
            raise InputError("this GRPO checkpoint's run trained LoRA adapters; resume it with its --lora-rank")
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
