"""Session state as the harness compares it: a canonical JSON hash of `Pool.state`.

`state_hash(state)` is what an imported suite's `state_hash` native check (`tracks/envs/graders/state_hash.py`)
stores for the gold calls and compares an episode's final state against. `namespace_state` (the worker's own
function, standard library only) turns an object held in this process into the same JSON the sandbox returns, so a
class run in-process and the same class run in the sandbox hash alike.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

from arenaforge.environments.runtime.worker.execution import namespace_state

__all__ = ["namespace_state", "state_hash"]


def state_hash(state: Any) -> str:
    """SHA-256 of the state's canonical JSON (sorted keys, no spaces, UTF-8; an integral float written as the integer,
    since Python, and so BFCL's state check, holds 100 == 100.0)."""
    text = json.dumps(_integral(state), sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _integral(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, dict):
        return {k: _integral(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_integral(v) for v in value]
    return value
