"""`arenaforge graph`: Build and inspect tool-call graphs; sample tool chains."""

from __future__ import annotations

import typer

app = typer.Typer(help="Build and inspect tool-call graphs; sample tool chains.", no_args_is_help=True)
