"""A deterministic engine for tests and benchmarks: text from a function of the prompt.

`respond(prompt_text, call_index) -> str` writes the turn; the engine tokenizes it and
appends the end-of-turn token, so rollouts see the same token stream a real engine would
emit. `seconds_per_token` simulates generation cost (benchmarks) and `busy` tracks how long
at least one request was in flight.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from typing import Any

from arenaforge.services.policy.base import Generation, SamplingParams


class BusyClock:
    """Wall time during which at least one generation was in flight."""

    def __init__(self) -> None:
        self.in_flight = 0
        self.busy_s = 0.0
        self._since = 0.0

    def enter(self) -> None:
        if self.in_flight == 0:
            self._since = time.perf_counter()
        self.in_flight += 1

    def exit(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self.busy_s += time.perf_counter() - self._since


class ScriptedEngine:
    name = "scripted"

    def __init__(self, tokenizer: Any, respond: Callable[[str, int], str], *, policy: str = "scripted",
                 seconds_per_token: float = 0.0, logprob: float = -1.0) -> None:
        self.tokenizer = tokenizer
        self.respond = respond
        self.policy = policy
        self.seconds_per_token = seconds_per_token
        self.logprob = logprob
        self.clock = BusyClock()
        self.calls = 0
        self.params = SamplingParams()
        self.eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")

    async def generate(self, prompt_ids: Sequence[int], params: SamplingParams) -> Generation:
        index = self.calls
        self.calls += 1
        self.params = params  # readable by `respond` (e.g. the per-sample seed); set before it runs
        text = self.respond(self.tokenizer.decode(list(prompt_ids)), index)
        ids = self.tokenizer.encode(text, add_special_tokens=False) + [self.eos_id]
        finish = "stop"
        if len(ids) > params.max_tokens:
            ids, finish = ids[: params.max_tokens], "length"
        self.clock.enter()
        try:
            if self.seconds_per_token:
                await asyncio.sleep(self.seconds_per_token * len(ids))
        finally:
            self.clock.exit()
        return Generation(token_ids=ids, logprobs=[self.logprob] * len(ids), finish_reason=finish)
