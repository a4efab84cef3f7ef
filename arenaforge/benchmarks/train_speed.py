"""Training and generation tokens/s of a policy on this machine: fp32 against bf16 mixed precision, full weights
against LoRA, side by side in one run, beside what the hardware could give.

Training runs the SFT trainer's own step (`train.sft.sft_loss`, AdamW, gradient clipping) on `seq`-token rows of
token ids drawn at random (throughput does not depend on the text). Generation runs the hf engine (`policy.hf`:
requests micro-batched, decoded over the KV cache) on `batch` concurrent chat prompts. The FLOP figure is the usual
6 x parameters per trained token (2 forward, 4 backward), so `gflop_per_s` says how close a variant comes to the
machine. LoRA variants (rank 16, every linear layer) need `peft` (`arenaforge[lora]`); without it they are
reported as skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from typing import Any

import torch

from arenaforge.schemas.errors import ConfigError, InputError
from arenaforge.tracks.train.base_models import policy_path
from arenaforge.tracks.train.sft import sft_loss, with_lora

VARIANTS = ("full-fp32", "full-bf16", "lora-fp32", "lora-bf16")
LORA_RANK = 16


def _cpu_flags() -> list[str]:
    try:
        with open("/proc/cpuinfo") as fh:
            flags = next((line.split(":", 1)[1].split() for line in fh if line.startswith("flags")), [])
    except OSError:
        return []
    return sorted(f for f in flags if f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"))


def _train(path: str, variant: str, seq: int, steps: int) -> dict[str, Any]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    params = sum(p.numel() for p in model.parameters())
    if variant.startswith("lora"):
        try:
            model = with_lora(model, LORA_RANK)  # the trainer's own (`train sft --lora-rank`)
        except ConfigError as err:
            return {"variant": variant, "skipped": str(err)}
    model.train()
    trained = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=1e-5)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(100, min(model.config.vocab_size, 30000), (1, seq), generator=gen)
    attn, target = torch.ones_like(ids), torch.ones(ids.shape)
    bf16 = variant.endswith("bf16")
    times = []
    for _ in range(steps + 1):  # the first step warms allocators and kernels; it is not counted
        started = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
            loss, _ = sft_loss(model, ids, attn, target)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, 1.0)
        optimizer.step()
        times.append(time.perf_counter() - started)
    tokens_per_s = seq * steps / sum(times[1:])
    return {"variant": variant, "tokens_per_s": round(tokens_per_s, 1), "step_s": [round(t, 2) for t in times[1:]],
            "trained_parameters": sum(p.numel() for p in trained), "parameters": params,
            "gflop_per_s": round(6 * params * tokens_per_s / 1e9, 1)}


async def _generate(path: str, batch: int, new_tokens: int) -> dict[str, Any]:
    from arenaforge.services.policy.base import SamplingParams
    from arenaforge.services.policy.hf import HfEngine

    engine = HfEngine.from_pretrained(path, constrain=False)
    tok = engine.tokenizer
    prompts = [tok.apply_chat_template([{"role": "user", "content": f"Describe order {i} in a few sentences."}],
                                       add_generation_prompt=True, tokenize=True) for i in range(batch)]
    prompts = [list(p["input_ids"]) if isinstance(p, dict) or hasattr(p, "keys") else list(p) for p in prompts]
    params = [SamplingParams(max_tokens=new_tokens, temperature=1.0, seed=i) for i in range(batch)]
    await engine.generate(prompts[0], SamplingParams(max_tokens=4, seed=0))  # warm up
    started = time.perf_counter()
    out = await asyncio.gather(*(engine.generate(p, s) for p, s in zip(prompts, params)))
    seconds = time.perf_counter() - started
    produced = sum(len(g.token_ids) for g in out)
    return {"engine": "hf (micro-batched, KV cache, fp32)", "requests": batch, "tokens": produced,
            "tokens_per_s": round(produced / seconds, 1), "batches": engine.batches[1:]}


async def _generate_group(path: str, group: int, prompt_tokens: int, new_tokens: int) -> dict[str, Any]:
    """A GRPO group's first turn: `group` samples of one long prompt (a system prompt of tool documents), the
    prompt encoded once and shared against each row encoded whole, alternated twice, tokens/s of each."""
    from arenaforge.services.policy.base import SamplingParams
    from arenaforge.services.policy.hf import HfEngine

    engine = HfEngine.from_pretrained(path, constrain=False)
    tok = engine.tokenizer
    tools = []
    while len(tok.encode("\n".join(tools))) < prompt_tokens:
        i = len(tools)
        tools.append(f'{{"name": "get_order_{i}", "description": "Look up order {i} by its id and return its '
                     f'status, items and total.", "parameters": {{"order_id": {{"type": "string"}}}}}}')
    messages = [{"role": "system", "content": "You can call these tools:\n" + "\n".join(tools)},
                {"role": "user", "content": "What is the status of order 4411?"}]
    prompt = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    prompt = list(prompt["input_ids"]) if hasattr(prompt, "keys") else list(prompt)
    params = [SamplingParams(max_tokens=new_tokens, temperature=1.0, seed=i) for i in range(group)]
    await engine.generate(prompt, SamplingParams(max_tokens=4, seed=0))  # warm up
    seconds: dict[str, float] = {"whole": 0.0, "shared": 0.0}
    tokens: dict[str, int] = {"whole": 0, "shared": 0}
    for mode in ("whole", "shared", "shared", "whole"):  # alternated: the machine's drift falls on both
        engine.share_prefixes = mode == "shared"
        started = time.perf_counter()
        out = await asyncio.gather(*(engine.generate(prompt, p) for p in params))
        seconds[mode] += time.perf_counter() - started
        tokens[mode] += sum(len(g.token_ids) for g in out)
    rate = {mode: round(tokens[mode] / seconds[mode], 1) for mode in seconds}
    return {"requests": group, "prompt_tokens": len(prompt), "new_tokens": new_tokens,
            "tokens_per_s_each_prompt_whole": rate["whole"], "tokens_per_s_prompt_shared": rate["shared"],
            "shared_vs_whole": round(rate["shared"] / rate["whole"], 2)}


async def main(policy: str = "smollm2-135m", seq: int = 1024, steps: int = 3, variants: str = ",".join(VARIANTS),
         gen_batch: int = 8, gen_tokens: int = 64, group_prompt_tokens: int = 900) -> dict[str, Any]:
    """Training tokens/s for fp32 and bf16 mixed precision, full and LoRA (side by side), and generation tokens/s.

    Args:
        policy: A named policy (smollm2-135m, arena-small, tiny) or a model directory.
        seq: Tokens per training row (one row per step).
        steps: Timed steps per variant (after one warm-up step).
        variants: Comma-separated, of full-fp32, full-bf16, lora-fp32, lora-bf16.
        gen_batch: Concurrent generation requests (0: skip generation).
        gen_tokens: New tokens per generation request.
        group_prompt_tokens: Prompt tokens of the GRPO-group generation (`gen_batch` samples of one prompt, the
            prompt encoded once against once per row; 0: skip it).
    """
    path = policy_path(policy)
    chosen = [v.strip() for v in variants.split(",") if v.strip()]
    unknown = sorted(set(chosen) - set(VARIANTS))
    if unknown:
        raise InputError(f"bench train_speed: --variants: unknown variants {unknown}; choose from {', '.join(VARIANTS)}")
    train = [_train(path, v, seq, steps) for v in chosen]
    base = next((t["tokens_per_s"] for t in train if t["variant"] == "full-fp32" and "tokens_per_s" in t), None)
    for t in train:
        if base and "tokens_per_s" in t:
            t["vs_full_fp32"] = round(t["tokens_per_s"] / base, 2)
    return {
        "policy": policy, "path": path, "threads": torch.get_num_threads(), "cpu_flags": _cpu_flags(),
        "bf16_kernels": bool(torch.backends.mkldnn.is_available()), "seq": seq, "train": train,
        "generate": await _generate(path, gen_batch, gen_tokens) if gen_batch else None,
        "generate_group": (await _generate_group(path, gen_batch, group_prompt_tokens, gen_tokens)
                           if gen_batch and group_prompt_tokens else None),
        "loadavg_1m_at_end": os.getloadavg()[0],
    }
