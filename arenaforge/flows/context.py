"""Shared CLI state: the loaded config, the warehouse, and one-line error reporting."""

from __future__ import annotations

import asyncio
import inspect
from dataclasses import dataclass, field
from typing import Any

import typer

from arenaforge.schemas.config import Config, load_config
from arenaforge.warehouse import Warehouse


@dataclass
class CliState:
    config_path: str | None = None
    overrides: dict[str, Any] = field(default_factory=dict)
    _config: Config | None = None

    @property
    def config(self) -> Config:
        if self._config is None:
            self._config = load_config(self.config_path, overrides=self.overrides)
        return self._config

    def warehouse(self) -> Warehouse:
        cfg = self.config.warehouse
        return Warehouse(cfg.path, lock_timeout_s=cfg.lock_timeout_s, data_path=cfg.data_path)


def state(ctx: typer.Context) -> CliState:
    """The CliState of the root command (set up by arenaforge.flows.cli's callback)."""
    root = ctx.find_root()
    if not isinstance(root.obj, CliState):
        root.obj = CliState()
    return root.obj


def run_flow(call: Any) -> Any:
    """The result of a flow call made from sync code: async flows return a coroutine, run here in a
    fresh event loop (one loop per flow run; the CLI is a thin sync shell)."""
    return asyncio.run(call) if inspect.iscoroutine(call) else call
