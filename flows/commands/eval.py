"""`arenaforge eval`: Evaluate a policy on held-out environments."""

from __future__ import annotations

import typer

app = typer.Typer(help="Evaluate a policy on held-out environments.", no_args_is_help=True)
