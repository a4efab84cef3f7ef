"""`arenaforge ingest`: Ingest tool documents and live MCP servers into normalised tool schemas."""

from __future__ import annotations

import typer

app = typer.Typer(help="Ingest tool documents and live MCP servers into normalised tool schemas.", no_args_is_help=True)
