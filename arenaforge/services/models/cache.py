"""Response cache and usage ledger in the warehouse (`llm_cache`, `llm_calls`).

The cache key is `ChatRequest.cache_key(model)`. Entries for a model are loaded once per
process on first use (one query), so a fully cached re-run makes no calls and opens the
database once; new entries go through a group-commit writer, so a crashed run keeps every
answer received up to the last ~1 s and resumes from there.
"""

from __future__ import annotations

import itertools
import json
import os
import threading
import time
from typing import Any, ClassVar

from arenaforge.services.models.base import ChatResponse
from arenaforge.warehouse import lookups
from arenaforge.warehouse.buffer import BufferedTableWriter
from arenaforge.warehouse.db import Warehouse


class ResponseCache:
    def __init__(self, wh: Warehouse, model: str) -> None:
        self.wh = wh
        self.model = model
        self._entries: dict[str, str] | None = None
        self._lock = threading.Lock()
        self._writer = BufferedTableWriter(
            wh, "llm_cache", [("key", "VARCHAR"), ("model", "VARCHAR"), ("request", "JSON"), ("response", "JSON")])

    def _load(self) -> dict[str, str]:
        with self._lock:
            if self._entries is None:
                self._entries = lookups.cached_responses(self.wh, self.model)
            return self._entries

    def get(self, key: str) -> ChatResponse | None:
        raw = self._load().get(key)
        return None if raw is None else ChatResponse.model_validate_json(raw).model_copy(update={"cached": True})

    def put(self, key: str, request: dict[str, Any], response: ChatResponse) -> None:
        raw = response.model_dump_json()
        self._load()[key] = raw
        self._writer.add({"key": key, "model": self.model, "request": json.dumps(request), "response": raw})

    def close(self) -> None:
        self._writer.close()


class UsageLedger:
    """One `llm_calls` row per request, whatever became of it: its cost class says what it cost.

    sent    answered by the endpoint: its tokens were spent
    cached  answered from the warehouse cache: no tokens spent (its tokens are not counted again)
    failed  no usable answer (`error_kind` says why); tokens spent on answers thrown away are wasted
    """

    COLUMNS: ClassVar[list[tuple[str, str]]] = [("call_id", "VARCHAR"), ("key", "VARCHAR"), ("run_id", "VARCHAR"), ("step", "VARCHAR"),
               ("model", "VARCHAR"), ("cached", "BOOLEAN"), ("attempts", "INTEGER"), ("reasks", "INTEGER"),
               ("prompt_tokens", "INTEGER"), ("completion_tokens", "INTEGER"), ("latency_s", "DOUBLE"),
               ("cost_class", "VARCHAR"), ("error_kind", "VARCHAR"), ("wasted_tokens", "INTEGER")]

    def __init__(self, wh: Warehouse, run_id: str | None) -> None:
        self.run_id = run_id
        # Unique across processes and restarts without a uuid4 (os.urandom) per call.
        self._prefix = f"{os.getpid():x}-{time.time_ns():x}"
        self._counter = itertools.count()
        self._writer = BufferedTableWriter(wh, "llm_calls", self.COLUMNS)

    def record(self, key: str, step: str, model: str, response: ChatResponse | None, latency_s: float,
               cost_class: str = "sent", error: Exception | None = None) -> None:
        usage = response.usage if response is not None else getattr(error, "usage", None)
        spent = cost_class != "cached" and usage is not None
        wasted = response.wasted_tokens if response is not None else (usage.total_tokens if usage is not None else 0)
        self._writer.add(
            {
                "call_id": self._next_id(),  # a ledger entry per event, not a content record
                "key": key,
                "run_id": self.run_id,
                "step": step,
                "model": model,
                "cached": cost_class == "cached",
                "attempts": response.attempts if response is not None else getattr(error, "attempts", 1),
                "reasks": response.reasks if response is not None else 0,
                "prompt_tokens": usage.prompt_tokens if spent else 0,
                "completion_tokens": usage.completion_tokens if spent else 0,
                "latency_s": latency_s,
                "cost_class": cost_class,
                "error_kind": str(error.kind) if error is not None and hasattr(error, "kind") else None,
                "wasted_tokens": wasted if cost_class != "cached" else 0,
            }
        )

    def _next_id(self) -> str:
        return f"{self._prefix}-{next(self._counter)}"

    def close(self) -> None:
        self._writer.close()
