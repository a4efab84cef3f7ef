"""Offline answers of `envs.tool_doc`, `envs.augment_tool` and `envs.implement_tool`: template tools.

The sub-QA's evidence names the operation (lookup / count / sum) and the step hands over the data the
tool will hold (from the source, `tracks/envs/tool_data.py`); the tool's document and code come from its
evidence kind's template for that layout (`template_doc`, `code`: `tracks/envs/evidence/`). The template
document already carries its optional parameters, so the augmentation answer is the same document.
"""

from __future__ import annotations

import textwrap
from typing import Any

from arenaforge.services.models import ChatRequest
from arenaforge.services.models.providers.offline import OfflineModel
from arenaforge.tracks.envs.build_tools import ToolInputs
from arenaforge.tracks.envs.evidence import kind_of
from arenaforge.tracks.envs.tool_data import typed


def _doc(inputs: ToolInputs) -> dict[str, Any]:
    return kind_of(inputs.data.evidence).template_doc(inputs.data)


def tool_doc(request: ChatRequest, model: OfflineModel) -> dict[str, Any]:
    return _doc(request.inputs)


def augment_tool(request: ChatRequest, model: OfflineModel) -> dict[str, Any]:
    return _doc(request.inputs)  # the template's optional parameters are its added complexity


def implement_tool(request: ChatRequest, model: OfflineModel) -> dict[str, Any]:
    inputs: ToolInputs = request.inputs
    doc = _doc(inputs)
    ev = inputs.data.evidence
    return {"code": textwrap.dedent(kind_of(ev).code(inputs.data, doc["name"])),
            "call": {"arguments": {ev.key: typed(ev.value, inputs.data.key_type)}}}
