"""Offline answer of `sft.simulate_tool`: a value generated from the tool's output schema.

Values follow the schema (enum, format, bounds) and the field names' hints, drawn from the session's
random stream; a field named like an argument or like a value seen earlier in the session takes that
value (e.g. `get_product(product_id=X)` returns product_id X), so a session stays consistent.
"""

from __future__ import annotations

import re
from typing import Any

from arenaforge.services.models import ChatRequest
from arenaforge.services.models.providers.offline import OfflineModel
from arenaforge.tracks.sft.tool_simulator import SimulateInputs, output_problem_for, sample_value


def _norm(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def simulate_tool(request: ChatRequest, model: OfflineModel) -> Any:
    inputs: SimulateInputs = request.inputs
    tool = inputs.tool
    value = sample_value(inputs.schema, tool.function.name, inputs.rng, hint=tool.function.description)
    return _consistent(value, inputs.schema, inputs.arguments, inputs.memory)


def _consistent(value: Any, schema: Any, arguments: dict[str, Any], memory: dict[str, Any], depth: int = 0) -> Any:
    if isinstance(value, dict) and isinstance(schema, dict):
        props = schema.get("properties") or {}
        out = {}
        for k, v in value.items():
            n = _norm(k)
            known = next((a for ak, a in arguments.items() if _norm(ak) == n), memory.get(n))
            sub = props.get(k, {})
            if known is not None and not isinstance(v, (dict, list)) and output_problem_for(sub, known) is None:
                out[k] = known  # e.g. get_product(product_id=X) returns product_id X
            else:
                out[k] = _consistent(v, sub, arguments, memory, depth + 1)
        return out
    if isinstance(value, list) and isinstance(schema, dict) and depth < 4:
        return [_consistent(v, schema.get("items") or {}, {}, memory, depth + 1) for v in value]
    return value
