"""Offline answers of the stepwise decomposition (`tracks/envs/stepwise_qa.py`): templates over the planned row.

`envs.write_subqa` asks about the row's first askable field the seeded draw picks and copies its value;
`envs.write_main_question` (asked for chains only) names the chain's first value and asks for its last field.
"""

from __future__ import annotations

import random
from typing import Any

from arenaforge.services.models import ChatRequest
from arenaforge.services.models.providers.offline import OfflineModel
from arenaforge.tracks.envs.answers import entity, fmt_value, human
from arenaforge.tracks.envs.stepwise_qa import SubQAInputs


def write_subqa(request: ChatRequest, model: OfflineModel) -> dict[str, Any]:
    fact = request.inputs.fact if isinstance(request.inputs, SubQAInputs) else request.inputs
    column = random.Random(f"{request.seed}:{fact.table}:{fact.value}").choice(fact.columns)
    return {"column": column,
            "question": f"What is the {human(column)} of the {entity(fact.table)} with {human(fact.key)} {fact.value}?",
            "answer": str(fmt_value(fact.row.get(column)))}


def write_main_question(request: ChatRequest, model: OfflineModel) -> dict[str, Any]:
    _, subs = request.inputs
    first, last = subs[0].evidence, subs[-1].evidence
    return {"main_question": f"What is the {human(last.column or '')} of the {entity(last.table or '')} that the "
                             f"{entity(first.table or '')} with {human(first.key or '')} {first.value} refers to?"}
