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
from typing import Any

from arenaforge.tasks.models.base import ChatResponse
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
                _, rows = self.wh.query("SELECT key, response FROM llm_cache WHERE model = ?", [self.model])
                self._entries = {k: v for k, v in rows}
            return self._entries

    def get(self, key: str) -> ChatResponse | None:
        raw = self._load().get(key)
        return None if raw is None else ChatResponse.model_validate_json(raw).model_copy(update={"cached": True})

    def put(self, key: str, request: dict[str, Any], response: ChatResponse) -> None:
        raw = response.model_dump_json()
        self._load()[key] = raw
        self._writer.add({"key": key, "model": self.model, "request": json.dumps(request), "response": raw})

    def _next_id(self) -> str:
        return f"{self._prefix}-{next(self._counter)}"

    def close(self) -> None:
        self._writer.close()


class UsageLedger:
    """One `llm_calls` row per completed request (cache hits included, flagged)."""

    COLUMNS = [("call_id", "VARCHAR"), ("key", "VARCHAR"), ("run_id", "VARCHAR"), ("step", "VARCHAR"),
               ("model", "VARCHAR"), ("cached", "BOOLEAN"), ("attempts", "INTEGER"), ("reasks", "INTEGER"),
               ("prompt_tokens", "INTEGER"), ("completion_tokens", "INTEGER"), ("latency_s", "DOUBLE")]

    def __init__(self, wh: Warehouse, run_id: str | None) -> None:
        self.run_id = run_id
        # Unique across processes and restarts without a uuid4 (os.urandom) per call.
        self._prefix = f"{os.getpid():x}-{time.time_ns():x}"
        self._counter = itertools.count()
        self._writer = BufferedTableWriter(wh, "llm_calls", self.COLUMNS)

    def record(self, key: str, step: str, model: str, response: ChatResponse, latency_s: float) -> None:
        self._writer.add(
            {
                "call_id": self._next_id(),  # a ledger entry per event, not a content record
                "key": key,
                "run_id": self.run_id,
                "step": step,
                "model": model,
                "cached": response.cached,
                "attempts": response.attempts,
                "reasks": response.reasks,
                "prompt_tokens": response.usage.prompt_tokens,
                "completion_tokens": response.usage.completion_tokens,
                "latency_s": latency_s,
            }
        )

    def _next_id(self) -> str:
        return f"{self._prefix}-{next(self._counter)}"

    def close(self) -> None:
        self._writer.close()
