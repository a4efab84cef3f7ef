"""Content addressing: canonical JSON and the ids derived from it.

An id is `<prefix>-<32 hex>` where the hex is the SHA-256 of the record's canonical JSON
(sorted keys, no whitespace, UTF-8) with the bookkeeping fields left out. Two runs that
produce the same content therefore produce the same id, which is what makes warehouse
writes idempotent and caches hit.
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

# Fields that describe *when/who* rather than *what*: excluded from the content hash.
NON_CONTENT_FIELDS = frozenset({"id", "run_id", "created_at", "provenance"})


def canonical_json(value: Any) -> str:
    """Deterministic JSON text: sorted keys, compact separators, non-ASCII kept."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def sha256_hex(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def content_id(prefix: str, content: dict[str, Any]) -> str:
    """Id of a record body: prefix plus the first 128 bits of the hash of its content fields."""
    body = {k: v for k, v in content.items() if k not in NON_CONTENT_FIELDS}
    return f"{prefix}-{sha256_hex(canonical_json(body))[:32]}"
