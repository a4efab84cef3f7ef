"""`arenaforge sft`: Synthesize tasks and scored multi-turn trajectories (SFT track)."""

from __future__ import annotations

import typer

app = typer.Typer(help="Synthesize tasks and scored multi-turn trajectories (SFT track).", no_args_is_help=True)
