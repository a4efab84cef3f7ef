"""Model providers: one module per way of answering a `ChatRequest`, found by name.

A provider module defines `NAME` (the value of `model.backend` that selects it) and
`open(cfg, warehouse, run_id)`, an async context manager yielding a `ChatModel` that is closed
(caches flushed, connections closed) when the run ends. Adding a provider is adding one module
here; nothing else changes, because every step receives the run's `ChatModel` and never asks
which one it is.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import pkgutil
from collections.abc import AsyncIterator
from types import ModuleType

from arenaforge.schemas.config import ModelConfig
from arenaforge.schemas.errors import ConfigError
from arenaforge.services.models.base import ChatModel
from arenaforge.warehouse.db import Warehouse


@functools.cache
def providers() -> dict[str, ModuleType]:
    """Provider modules by NAME."""
    found = {}
    for info in pkgutil.iter_modules(__path__):
        module = importlib.import_module(f"{__name__}.{info.name}")
        name = getattr(module, "NAME", None)
        if name:
            found[name] = module
    return found


@contextlib.asynccontextmanager
async def open_chat_model(cfg: ModelConfig, wh: Warehouse | None = None, run_id: str | None = None
                          ) -> AsyncIterator[ChatModel]:
    """The run's ChatModel for `cfg.backend`, built once and closed when the block exits."""
    module = providers().get(cfg.backend)
    if module is None:
        raise ConfigError(f"unknown model backend {cfg.backend!r}; known: {', '.join(sorted(providers()))}")
    async with module.open(cfg, wh, run_id) as model:
        yield model
