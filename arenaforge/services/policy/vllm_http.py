"""A `vllm serve` server as a policy engine, over its OpenAI-compatible `/v1/completions`.

Wire format (vLLM's extensions to the OpenAI completions API):
  request   {"model", "prompt": [int, ...], "max_tokens", "temperature", "top_p", "seed",
             "logprobs": 1, "return_tokens_as_token_ids": true, "return_token_ids": true,
             "skip_special_tokens": false, "stop_token_ids": [...], "include_stop_str_in_output": true}
  response  {"choices": [{"text", "finish_reason", "token_ids": [int] (newer vLLM),
             "logprobs": {"tokens": ["token_id:123", ...], "token_logprobs": [float, ...], ...}}]}

A token-id prompt is passed through untokenized, and the sampled ids come back either as
`token_ids` or, for older servers, encoded as "token_id:N" strings in `logprobs.tokens`
(`return_tokens_as_token_ids`). Either way no text is ever re-tokenized.

Retries: connection errors and 429/5xx are retried with capped exponential backoff
(`max_retries`); anything else raises `ProviderError` (the only policy at this layer).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Sequence
from typing import Any

import httpx

from arenaforge.schemas.errors import ConfigError, ProviderError
from arenaforge.services.policy.base import EngineKind, Generation, SamplingParams

_TOKEN_PREFIX = "token_id:"


def parse_choice(choice: dict[str, Any]) -> Generation:
    """Token ids and log-probs from one completions choice (both vLLM encodings)."""
    logprobs = choice.get("logprobs") or {}
    values = logprobs.get("token_logprobs")
    ids = choice.get("token_ids")
    if ids is None:
        tokens = logprobs.get("tokens")
        if tokens is None:
            raise ProviderError("vLLM response has neither token_ids nor logprobs.tokens; "
                                "is return_tokens_as_token_ids supported by the server?")
        try:
            ids = [int(t[len(_TOKEN_PREFIX):]) for t in tokens]
        except (ValueError, TypeError):
            raise ProviderError(f"vLLM returned text tokens, not 'token_id:N' ({tokens[:3]!r})") from None
    if values is None:
        raise ProviderError("vLLM response carries no token_logprobs (logprobs not requested?)")
    finish = "length" if choice.get("finish_reason") == "length" else "stop"
    return Generation(token_ids=[int(i) for i in ids], logprobs=[float(v) for v in values], finish_reason=finish)


class VllmHttpEngine:
    name = "vllm"

    def __init__(self, base_url: str, *, model: str, api_key: str | None = None, timeout_s: float = 300.0,
                 max_retries: int = 3, backoff_s: float = 0.2) -> None:
        self.base_url = base_url.rstrip("/")
        self.policy = model
        self.model = model
        self.max_retries = max_retries
        self.backoff_s = backoff_s
        headers = {"Authorization": f"Bearer {api_key or 'EMPTY'}"}
        self._client = httpx.AsyncClient(timeout=timeout_s, headers=headers)

    def request_body(self, prompt_ids: Sequence[int], params: SamplingParams) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "prompt": [int(t) for t in prompt_ids],
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "logprobs": 1,
            "return_tokens_as_token_ids": True,
            "return_token_ids": True,
            "skip_special_tokens": False,
            "include_stop_str_in_output": True,
        }
        if params.stop_token_ids:
            body["stop_token_ids"] = list(params.stop_token_ids)
        if params.seed is not None:
            body["seed"] = params.seed
        return body

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
        body = self.request_body(prompt_ids, params)
        url = f"{self.base_url}/completions"
        for attempt in range(self.max_retries + 1):
            try:
                response = await self._client.post(url, json=body)
            except httpx.TransportError as err:
                failure = f"{type(err).__name__}: {err}"
            else:
                if response.status_code == 200:
                    choices = response.json().get("choices") or []
                    if not choices:
                        raise ProviderError("vLLM response has no choices")
                    return parse_choice(choices[0])
                if response.status_code != 429 and response.status_code < 500:
                    raise ProviderError(f"vLLM {url} answered {response.status_code}: {response.text[:200]}")
                failure = f"HTTP {response.status_code}"
            if attempt < self.max_retries:
                await asyncio.sleep(self.backoff_s * (2**attempt) * (0.5 + random.random()))
        raise ProviderError(f"vLLM {url} failed after {self.max_retries + 1} attempts: {failure}")

    async def aclose(self) -> None:
        await self._client.aclose()


def _from_settings(**kw: Any) -> VllmHttpEngine:
    if not kw.get("base_url"):
        raise ConfigError("engine vllm needs a base_url (the `vllm serve` endpoint, e.g. http://127.0.0.1:8000/v1)")
    return VllmHttpEngine(kw["base_url"], model=kw.get("served_model") or kw.get("model_path") or "policy",
                          api_key=kw.get("api_key"))


# a server's weights: nothing here to warm-start
ENGINE = EngineKind("vllm", build=_from_settings, url_for="the `vllm serve` endpoint", warm_start=False)
