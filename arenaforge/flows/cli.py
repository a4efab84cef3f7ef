"""The `arenaforge` command line: a root app with one sub-app per capability.

Errors a user can fix (`ArenaforgeError`) print as one line on stderr with exit code 2 (3 when a run
produced nothing because a service it needs failed: `arenaforge.flows.outcome.InfrastructureFailed`);
anything else is a bug and keeps its traceback.
"""

from __future__ import annotations

import importlib
import os
import sys

import typer

from arenaforge.flows.context import CliState, quiet_user_error_tracebacks
from arenaforge.schemas.errors import ArenaforgeError

# Process defaults for every command: no telemetry, offline model hubs, and enough time for
# Prefect's ephemeral server to start on a busy 2-core machine (its default is too short).
PROCESS_DEFAULTS = {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "1",
    "PREFECT_SERVER_UI_SHOW_PROMOTIONAL_CONTENT": "false",
    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "300",
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "TOKENIZERS_PARALLELISM": "false",
}

# (sub-command, module under arenaforge.flows.commands). Each module defines `app: typer.Typer`.
COMMANDS = [
    ("demo", "demo"),
    ("ingest", "ingest"),
    ("graph", "graph"),
    ("sft", "sft"),
    ("envs", "envs"),
    ("sandbox", "sandbox"),
    ("rollout", "rollout"),
    ("train", "train"),
    ("eval", "eval"),
    ("serve", "serve"),
    ("model", "model"),
    ("db", "db"),
    ("bench", "bench"),
    ("config", "config"),
]

app = typer.Typer(
    name="arenaforge",
    help="Synthesize tool-use SFT data and verifiable RL environments (ASTRA), and train on them.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def root(
    ctx: typer.Context,
    config: str = typer.Option(None, "--config", "-c", help="Path to arenaforge.toml (default: ./arenaforge.toml)."),
    db: str = typer.Option(None, "--db", help=(
        "Warehouse: a directory (DuckLake), postgres:<conninfo>, or an old single .duckdb file (overrides warehouse.path).")),
    backend: str = typer.Option(None, "--backend", help="Model backend: offline or openai (overrides model.backend)."),
    base_url: str = typer.Option(None, "--base-url", help="OpenAI-compatible endpoint (overrides model.base_url)."),
    model: str = typer.Option(None, "--model", help="Model name at the endpoint (overrides model.model)."),
) -> None:
    """Global options apply to every sub-command; flags beat env vars beat the TOML file."""
    overrides = {"warehouse.path": db, "model.backend": backend, "model.base_url": base_url, "model.model": model}
    ctx.obj = CliState(config_path=config, overrides={k: v for k, v in overrides.items() if v is not None})
    if ctx.resilient_parsing or "--help" in sys.argv:
        return
    api_url = ctx.obj.config.prefect.api_url  # flows report to a configured server, else Prefect's ephemeral one
    if api_url:
        os.environ.setdefault("PREFECT_API_URL", api_url)


for _name, _module in COMMANDS:
    _sub = importlib.import_module(f"arenaforge.flows.commands.{_module}").app
    app.add_typer(_sub, name=_name)


def main() -> None:
    """Entry point: click handles usage errors; our own errors become one line, exit 2."""
    for key, value in PROCESS_DEFAULTS.items():
        os.environ.setdefault(key, value)
    quiet_user_error_tracebacks()
    try:
        app()
    except ArenaforgeError as err:
        typer.secho(f"error: {err}", fg=typer.colors.RED, err=True)
        sys.exit(getattr(err, "exit_code", 2))


if __name__ == "__main__":
    main()
