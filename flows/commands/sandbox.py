"""`arenaforge sandbox`: Build the sandbox image and run tool code in the warm pool."""

from __future__ import annotations

import typer

app = typer.Typer(help="Build the sandbox image and run tool code in the warm pool.", no_args_is_help=True)
