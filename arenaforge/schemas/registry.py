"""The record kinds known to the project, by kind name and by table.

Later capabilities add their kinds with `register` at import time of their schema module;
`arenaforge.schemas.generate` writes a JSON Schema file for every registered kind.
"""

from __future__ import annotations

from arenaforge.schemas.base import Record
from arenaforge.schemas.models import RECORD_TYPES

_KINDS: dict[str, type[Record]] = {}


def register(model: type[Record]) -> type[Record]:
    """Register a record kind (usable as a class decorator)."""
    existing = _KINDS.get(model.KIND)
    if existing is not None and existing is not model:
        raise ValueError(f"record kind {model.KIND!r} registered twice")
    _KINDS[model.KIND] = model
    return model


for _model in RECORD_TYPES:
    register(_model)


def _load_extensions() -> None:
    # Kinds defined by later capabilities live in their own schema modules.
    import importlib
    import pkgutil

    from arenaforge import schemas

    for info in pkgutil.iter_modules(schemas.__path__):
        if info.name.startswith("kinds_"):
            importlib.import_module(f"arenaforge.schemas.{info.name}")


def kinds() -> dict[str, type[Record]]:
    _load_extensions()
    return dict(sorted(_KINDS.items()))


def by_table(table: str) -> type[Record] | None:
    return next((m for m in kinds().values() if m.TABLE == table), None)
