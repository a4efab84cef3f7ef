"""`arenaforge demo`: Run the whole pipeline offline on the bundled sample data."""

from __future__ import annotations

import typer

app = typer.Typer(help="Run the whole pipeline offline on the bundled sample data.", no_args_is_help=True)
