"""Policy engines: token ids in, token ids + log-probs out.

One small protocol (`PolicyEngine.generate`) with interchangeable implementations, picked
once by `ENGINES[name]` (`registry.py`); each declares its traits (`EngineKind`) in its own file:

    vllm        HTTP to a `vllm serve` server (`/v1/completions`, token-id prompts)   vllm_http.py
    vllm-local  in-process `vllm.LLM`, when vllm imports                             vllm_local.py
    hf          transformers `generate` on CPU/GPU                                    hf.py
    scripted    deterministic text from a function of the prompt, for tests          scripted.py

Engines never see chat messages: the rollout owns the template and the token stream, so what
the trainer scores is exactly what the engine sampled (token-in/token-out, METHOD.md §4).
"""

from arenaforge.services.policy.base import EngineKind, Generation, PolicyEngine, SamplingParams
from arenaforge.services.policy.registry import ENGINES, build_engine, engine_kind

__all__ = ["ENGINES", "EngineKind", "Generation", "PolicyEngine", "SamplingParams", "build_engine", "engine_kind"]
