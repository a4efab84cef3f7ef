"""Offline answer of `envs.merge_cluster`: tools with equal signatures (operation + types) form a group."""

from __future__ import annotations

from typing import Any

from arenaforge.services.models import ChatRequest
from arenaforge.services.models.providers.offline import OfflineModel
from arenaforge.tracks.envs.tool_impl import ToolImpl


def merge_cluster(request: ChatRequest, model: OfflineModel) -> dict[str, Any]:
    labelled: dict[str, tuple[int, ToolImpl]] = request.inputs
    by_signature: dict[str, list[tuple[str, int]]] = {}
    for key, (draft, tool) in labelled.items():
        by_signature.setdefault(tool.signature, []).append((key, draft))
    groups = [[key for key, _ in members] for members in by_signature.values() if len({d for _, d in members}) >= 2]
    return {"groups": [{"tools": keys} for keys in groups]}
