"""`arenaforge config`: show the effective configuration and where each layer comes from."""

from __future__ import annotations

import json

import typer

from arenaforge.flows.context import state
from arenaforge.flows.display import console

app = typer.Typer(help="Show the effective configuration.", no_args_is_help=True)


@app.command()
def show(ctx: typer.Context, secrets: bool = typer.Option(False, help="Print the API key instead of masking it.")) -> None:
    """Print the merged configuration (defaults < arenaforge.toml < ARENAFORGE_* env < flags)."""
    data = state(ctx).config.model_dump(mode="json")
    if data["model"].get("api_key") and not secrets:
        data["model"]["api_key"] = "***"
    console.print_json(json.dumps(data))
