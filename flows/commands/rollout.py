"""`arenaforge rollout`: Run policy rollouts in environments with the F1 reward."""

from __future__ import annotations

import typer

app = typer.Typer(help="Run policy rollouts in environments with the F1 reward.", no_args_is_help=True)
