"""transformers `generate` as a policy engine (CPU or one GPU), with request micro-batching.

Log-probs are the model's own (temperature 1, before top-p) for each sampled token, from the
raw logits: the same quantity the trainer recomputes and vLLM reports by default, so the
importance ratio starts at 1 on-policy.

Concurrent requests (many rollouts in flight) are gathered into one left-padded `generate`
call of up to `max_batch` prompts with the same temperature/top-p, run in a worker thread so
tool calls keep running meanwhile. `lock` serialises model use: the GRPO trainer holds it
during an update so generation never reads half-updated weights. A batch generates up to the
largest `max_tokens` asked; each answer is cut at its own stop token or token limit.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from arenaforge.tasks.policy.base import Generation, SamplingParams


@dataclass
class _Request:
    prompt_ids: list[int]
    params: SamplingParams
    future: asyncio.Future = field(repr=False)


class HfEngine:
    name = "hf"

    def __init__(self, model: Any, tokenizer: Any, *, policy: str = "hf", device: str = "cpu",
                 max_batch: int = 8) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.policy = policy
        self.device = device
        self.max_batch = max_batch
        self.lock = threading.Lock()
        self.eos_ids = {tokenizer.convert_tokens_to_ids("<|im_end|>")}
        if tokenizer.eos_token_id is not None:
            self.eos_ids.add(tokenizer.eos_token_id)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
        self._queue: list[_Request] = []
        self._worker: asyncio.Task | None = None
        self.batches: list[int] = []  # sizes of the generate calls made (observability, tests)

    @classmethod
    def from_pretrained(cls, path: str | Path, device: str = "cpu") -> "HfEngine":
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(str(path)).to(device)
        return cls(model, AutoTokenizer.from_pretrained(str(path)), policy=str(path), device=device)

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
        future: asyncio.Future = asyncio.get_running_loop().create_future()
        self._queue.append(_Request(list(prompt_ids), params, future))
        if self._worker is None or self._worker.done():
            self._worker = asyncio.create_task(self._drain())
        return await future

    async def _drain(self) -> None:
        await asyncio.sleep(0)  # let the other rollouts of this tick enqueue first
        while self._queue:
            head = self._queue[0]
            key = (head.params.temperature, head.params.top_p)
            batch = [r for r in self._queue if (r.params.temperature, r.params.top_p) == key][: self.max_batch]
            for r in batch:
                self._queue.remove(r)
            live = [r for r in batch if not r.future.done()]  # a cancelled rollout no longer waits
            if not live:
                continue
            try:
                results = await asyncio.to_thread(self._generate_batch, [r.prompt_ids for r in live],
                                                  [r.params for r in live])
            except Exception as err:  # noqa: BLE001 - handed to every waiting caller, who re-raises it
                for r in live:
                    if not r.future.done():
                        r.future.set_exception(err)
                continue
            for r, result in zip(live, results, strict=True):
                if not r.future.done():
                    r.future.set_result(result)

    def _generate_batch(self, prompts: list[list[int]], params: list[SamplingParams]) -> list[Generation]:
        import torch

        first = params[0]
        stops = sorted(self.eos_ids | {t for p in params for t in p.stop_token_ids})
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad_id, dtype=torch.long)
        attn = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):  # left padding: every prompt ends where generation starts
            ids[i, width - len(p):] = torch.tensor(p)
            attn[i, width - len(p):] = 1
        with self.lock, torch.no_grad():
            if first.seed is not None:
                torch.manual_seed(first.seed)
            was_training = self.model.training
            self.model.eval()
            try:
                out = self.model.generate(
                    ids.to(self.device),
                    attention_mask=attn.to(self.device),
                    max_new_tokens=max(p.max_tokens for p in params),
                    do_sample=first.temperature > 0,
                    temperature=first.temperature if first.temperature > 0 else None,
                    top_p=first.top_p,
                    top_k=None,
                    eos_token_id=stops,
                    pad_token_id=self.pad_id,
                    output_logits=True,
                    return_dict_in_generate=True,
                )
            finally:
                if was_training:
                    self.model.train()
        self.batches.append(len(prompts))
        new = out.sequences[:, width:].cpu()
        logprobs = torch.log_softmax(torch.stack(out.logits, dim=1).float().cpu(), dim=-1)
        logprobs = logprobs.gather(-1, new.unsqueeze(-1)).squeeze(-1)
        results = []
        for i, p in enumerate(params):
            row = new[i].tolist()
            end = next((j + 1 for j, t in enumerate(row) if t in stops), None)
            if end is not None and end <= p.max_tokens:
                cut, finish = end, "stop"
            else:
                cut, finish = min(len(row), p.max_tokens), "length"
            results.append(Generation(token_ids=row[:cut], logprobs=logprobs[i, :cut].tolist(), finish_reason=finish))
        return results
