"""transformers `generate` as a policy engine (CPU or one GPU).

Log-probs are the model's own (temperature 1, before top-p) for each sampled token, from the
raw logits: the same quantity the trainer recomputes and vLLM reports by default, so the
importance ratio starts at 1 on-policy. Calls are serialised by a lock (one model, one
device); the generate call runs in a worker thread so tool calls keep running meanwhile.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tasks.policy.base import Generation, SamplingParams


class HfEngine:
    name = "hf"

    def __init__(self, model: Any, tokenizer: Any, *, policy: str = "hf", device: str = "cpu") -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.policy = policy
        self.device = device
        self.lock = threading.Lock()
        self.eos_ids = {tokenizer.convert_tokens_to_ids("<|im_end|>")}
        if tokenizer.eos_token_id is not None:
            self.eos_ids.add(tokenizer.eos_token_id)

    @classmethod
    def from_pretrained(cls, path: str | Path, device: str = "cpu") -> "HfEngine":
        from transformers import AutoModelForCausalLM, AutoTokenizer

        model = AutoModelForCausalLM.from_pretrained(str(path)).to(device)
        return cls(model, AutoTokenizer.from_pretrained(str(path)), policy=str(path), device=device)

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
        return await asyncio.to_thread(self._generate, list(prompt_ids), params)

    def _generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        import torch

        stops = sorted(self.eos_ids | set(params.stop_token_ids))
        with self.lock, torch.no_grad():
            if params.seed is not None:
                torch.manual_seed(params.seed)
            was_training = self.model.training
            self.model.eval()
            inputs = torch.tensor([prompt_ids], device=self.device)
            out = self.model.generate(
                inputs,
                attention_mask=torch.ones_like(inputs),
                max_new_tokens=params.max_tokens,
                do_sample=params.temperature > 0,
                temperature=params.temperature if params.temperature > 0 else None,
                top_p=params.top_p,
                top_k=None,
                eos_token_id=stops,
                pad_token_id=self.tokenizer.pad_token_id,
                output_logits=True,
                return_dict_in_generate=True,
            )
            if was_training:
                self.model.train()
        new = out.sequences[0, len(prompt_ids):].tolist()
        logits = torch.stack(out.logits, dim=1)[0].float()  # (new, vocab)
        logprobs = torch.log_softmax(logits, dim=-1).gather(-1, torch.tensor(new).unsqueeze(-1)).squeeze(-1)
        # generate pads nothing for batch 1, but stop at the first stop token to be safe.
        end = next((i + 1 for i, t in enumerate(new) if t in stops), None)
        finish = "stop" if end is not None else "length"
        if end is not None:
            new = new[:end]
        return Generation(token_ids=new, logprobs=logprobs[: len(new)].tolist(), finish_reason=finish)
