"""In-process `vllm.LLM` as a policy engine (GPU machines with vllm installed).

vllm is imported lazily: the class exists everywhere, constructing it needs vllm. Requests
are sent one by one from a worker thread; for throughput use `vllm serve` + `VllmHttpEngine`,
whose server batches concurrent rollouts continuously.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from arenaforge.schemas.errors import ConfigError
from arenaforge.services.policy.base import EngineKind, Generation, SamplingParams


class VllmLocalEngine:
    name = "vllm-local"

    def __init__(self, model_path: str | Path, **llm_kwargs: object) -> None:
        try:
            from vllm import LLM
        except ImportError:
            raise ConfigError("engine vllm-local needs vllm (pip install 'arenaforge[vllm]')") from None
        self.policy = str(model_path)
        self._llm = LLM(model=str(model_path), **llm_kwargs)
        self._lock = threading.Lock()

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
        return await asyncio.to_thread(self._generate, list(prompt_ids), params)

    def _generate(self, prompt_ids: list[int], params: SamplingParams) -> Generation:
        from vllm import SamplingParams as VllmSampling
        from vllm.inputs import TokensPrompt

        sampling = VllmSampling(
            max_tokens=params.max_tokens, temperature=params.temperature, top_p=params.top_p, logprobs=0,
            stop_token_ids=list(params.stop_token_ids) or None, seed=params.seed, skip_special_tokens=False,
        )
        with self._lock:
            out = self._llm.generate([TokensPrompt(prompt_token_ids=prompt_ids)], sampling, use_tqdm=False)[0].outputs[0]
        ids = list(out.token_ids)
        logprobs = [float(step[tok].logprob) for tok, step in zip(ids, out.logprobs or [], strict=True)]
        return Generation(token_ids=ids, logprobs=logprobs, finish_reason="length" if out.finish_reason == "length" else "stop")


def _from_settings(**kw: Any) -> VllmLocalEngine:
    return VllmLocalEngine(kw["model_path"])


ENGINE = EngineKind("vllm-local", build=_from_settings)
