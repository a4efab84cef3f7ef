"""`arenaforge envs`: Synthesize verified, executable RL environments (RL track)."""

from __future__ import annotations

import typer

app = typer.Typer(help="Synthesize verified, executable RL environments (RL track).", no_args_is_help=True)
