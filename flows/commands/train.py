"""`arenaforge train`: Train policies: GRPO and SFT, on one node or via verl."""

from __future__ import annotations

import typer

app = typer.Typer(help="Train policies: GRPO and SFT, on one node or via verl.", no_args_is_help=True)
