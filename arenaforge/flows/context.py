"""Shared CLI state: the loaded config, the warehouse, and one-line error reporting."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import typer
from pydantic import ValidationError

from arenaforge.schemas.config import Config, load_config
from arenaforge.schemas.errors import ArenaforgeError, InputError, first_error
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
        return Warehouse.from_config(self.config.warehouse)


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


def run_context(ctx: typer.Context, fields: dict[str, Any]) -> dict[str, Any]:
    """What a training or evaluation command's params take from the global options: --config and --db."""
    st = state(ctx)
    return {"config_path": st.config_path, "db": st.overrides.get("warehouse.path")}


def synthesis_context(ctx: typer.Context, fields: dict[str, Any]) -> dict[str, Any]:
    """What a synthesis command's params take from the global options: --config and every override (--db, ...)."""
    st = state(ctx)
    return {"config_path": st.config_path, "overrides": st.overrides}


@contextlib.contextmanager
def flag_errors(command: str, flags: dict[str, str] | None = None,
                given: dict[str, Any] | None = None) -> Iterator[None]:
    """A parameter model's validation error as one line named after its flag (`train grpo: --steps: ...`).

    `flags` names a field whose flag differs from it (`{"limit": "--env-limit"}`). With `given` (the options as
    passed), only an error about one of them, with the value passed, is the user's; any other keeps its traceback."""
    try:
        yield
    except ValidationError as err:
        where, rest = first_error(err).split(": ", 1)
        field_name = where.rsplit(".", 1)[-1]
        if given is not None and not (field_name in given and given[field_name] == err.errors()[0].get("input")):
            raise
        flag = where if where == "parameters" else (flags or {}).get(field_name, "--" + field_name.replace("_", "-"))
        raise InputError(f"{command}: {flag}: {rest}") from None


class _NoTracebackForUserErrors(logging.Filter):
    """Prefect logs a failed flow or task run with its traceback; for our typed errors (bad input, a misconfigured
    or unreachable service: what the CLI then prints on one line) the traceback is noise, so those records keep
    their one-line message only. Anything else is a bug and keeps its traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and isinstance(record.exc_info[1], ArenaforgeError):
            record.exc_info = record.exc_text = None
        return True


def quiet_user_error_tracebacks() -> None:
    """Install the filter on Prefect's run loggers (idempotent)."""
    for name in ("prefect.flow_runs", "prefect.task_runs"):
        logger = logging.getLogger(name)
        if not any(isinstance(f, _NoTracebackForUserErrors) for f in logger.filters):
            logger.addFilter(_NoTracebackForUserErrors())
