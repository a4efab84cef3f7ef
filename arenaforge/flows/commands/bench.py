"""`arenaforge bench NAME`: run a benchmark and print its numbers as JSON.

Each module in `arenaforge/tasks/benchmarks/` that defines `main` becomes a sub-command; its keyword
arguments (with type hints and defaults) become options.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import pkgutil
import typing
from typing import Any

import typer

from arenaforge.flows.context import flag_errors
from arenaforge.tasks import benchmarks

app = typer.Typer(help="Benchmarks that print numbers as JSON (never timed tests).", no_args_is_help=True)


def _register(name: str, main: Any) -> None:
    def command(**kwargs: Any) -> None:
        with flag_errors(f"bench {name}", given=kwargs):  # an option out of range: one line, not a traceback
            result = main(**kwargs)
            if inspect.iscoroutine(result):  # async benchmarks run in one event loop, like a flow
                result = asyncio.run(result)
        typer.echo(json.dumps(result, indent=2, default=str))

    # Resolve string annotations (modules use `from __future__ import annotations`) so typer
    # sees real types: `bool` parameters then become --flag/--no-flag switches.
    hints = typing.get_type_hints(main)
    params = [p.replace(annotation=hints.get(p.name, p.annotation)) for p in inspect.signature(main).parameters.values()]
    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    command.__doc__ = main.__doc__
    app.command(name=name)(command)


for _info in pkgutil.iter_modules(benchmarks.__path__):
    _module = importlib.import_module(f"arenaforge.tasks.benchmarks.{_info.name}")
    if hasattr(_module, "main"):
        _register(_info.name, _module.main)
