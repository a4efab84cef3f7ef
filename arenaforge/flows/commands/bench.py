"""`arenaforge bench NAME`: run a benchmark and print its numbers as JSON.

Each module in `arenaforge/benchmarks/` that defines `main` becomes a sub-command; its keyword
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

from arenaforge import benchmarks
from arenaforge.flows.context import flag_errors

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
    about, helps = _docstring(main.__doc__ or "")
    params = [p.replace(annotation=hints.get(p.name, p.annotation),
                        default=typer.Option(p.default, help=helps.get(p.name, "")))
              for p in inspect.signature(main).parameters.values()]
    command.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    app.command(name=name, help=about)(command)


def _docstring(doc: str) -> tuple[str, dict[str, str]]:
    """(the text before `Args:`, {parameter: its help}) from a docstring whose `Args:` section has one `name: text`
    line per parameter, continued on lines indented deeper: each option's help comes from there."""
    about, _, args = inspect.cleandoc(doc).partition("\nArgs:\n")
    helps: dict[str, str] = {}
    name = ""
    for line in args.splitlines():
        head, sep, text = line.strip().partition(": ")
        if sep and line.startswith("    ") and not line.startswith("     ") and head.isidentifier():
            name, helps[head] = head, text.strip()
        elif name and line.strip():
            helps[name] += " " + line.strip()
    return about.strip(), helps


for _info in pkgutil.iter_modules(benchmarks.__path__):
    _module = importlib.import_module(f"arenaforge.benchmarks.{_info.name}")
    if hasattr(_module, "main"):
        _register(_info.name, _module.main)
