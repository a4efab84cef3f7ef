"""Keys and values of recently generated sequences, reused by the prompts that continue them.

A rollout never re-tokenizes its history: turn t+1's prompt is turn t's prompt, the tokens the engine generated and
the tool's reply (rollout/episodes.py). So once a turn is generated, the engine keeps the keys and values it computed
for that whole sequence, and the next turn encodes only the reply. On this CPU a BFCL multi-turn prompt is ~5k
tokens of tool documents: encoding it again every turn was most of an episode's cost. vLLM calls this automatic
prefix caching.

An entry is valid only for the weights it was computed with: the store is emptied whenever a parameter of the model
has been written since (`torch.Tensor._version`, which every in-place update bumps: an optimizer step, a LoRA
adapter's, a loaded state).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Any

MIN_REUSED = 16  # fewer tokens than this are cheaper to encode again than to copy in


class PrefixStore:
    """Up to `max_bytes` of (token ids -> keys and values), the least recently used dropped first."""

    def __init__(self, model: Any, max_bytes: int) -> None:
        self.model = model
        self.max_bytes = max_bytes
        # ids -> (the ids as a tensor, keys and values (layers, 2, heads, len, dim))
        self.entries: OrderedDict[tuple[int, ...], tuple[Any, Any]] = OrderedDict()
        self.bytes = 0
        self.version = self._weights_version()
        self.reused_tokens = 0  # observability: tokens not encoded again thanks to the store

    def _weights_version(self) -> int:
        return sum(p._version for p in self.model.parameters())

    def check_weights(self) -> None:
        """Forget everything computed with weights that have changed since."""
        version = self._weights_version()
        if version != self.version:
            self.entries.clear()
            self.bytes, self.version = 0, version

    def longest(self, prompt: Sequence[int]) -> tuple[int, Any]:
        """(how many leading tokens of `prompt` have stored keys and values, those (layers, 2, heads, n, dim)); at
        least the prompt's last token is left to encode, so its pass yields the next token's logits."""
        import torch

        if not self.entries:
            return 0, None
        wanted = torch.tensor(list(prompt), dtype=torch.long)
        best, best_key = 0, None
        for key, (ids, _) in self.entries.items():
            n = _common_length(ids, wanted, len(prompt) - 1)
            if n > best:
                best, best_key = n, key
        if best < MIN_REUSED or best_key is None:
            return 0, None
        self.entries.move_to_end(best_key)
        self.reused_tokens += best
        return best, self.entries[best_key][1][:, :, :, :best]

    def put(self, ids: Sequence[int], kv: Any) -> None:
        """Keep `kv` (layers, 2, heads, len(ids), dim) for `ids`; an entry it extends is dropped (it is a prefix)."""
        import torch

        key = tuple(ids)
        size = _size(kv)
        if len(key) < MIN_REUSED or size > self.max_bytes:
            return
        for old in [k for k in self.entries if len(k) <= len(key) and key[: len(k)] == k]:
            self.bytes -= _size(self.entries.pop(old)[1])
        self.entries[key] = (torch.tensor(key, dtype=torch.long), kv)
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, (_, dropped) = self.entries.popitem(last=False)
            self.bytes -= _size(dropped)


def _size(kv: Any) -> int:
    return kv.element_size() * kv.nelement()


def _common_length(a: Any, b: Any, limit: int) -> int:
    """Leading tokens two id tensors share, at most `limit`."""
    m = min(len(a), len(b), limit)
    if m <= 0:
        return 0
    differ = (a[:m] != b[:m]).nonzero()
    return int(differ[0]) if len(differ) else m
