"""`arenaforge serve`: Start the Prefect server, deployments and a worker."""

from __future__ import annotations

import typer

app = typer.Typer(help="Start the Prefect server, deployments and a worker.", no_args_is_help=True)
