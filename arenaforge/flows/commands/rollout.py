"""`arenaforge rollout`: Run policy rollouts in environments with the F1 reward."""

from __future__ import annotations

import json
from typing import Any

import typer

from arenaforge.flows.commands.train import CONTEXT_FIELDS, ENV_FLAGS
from arenaforge.flows.context import run_flow, state
from arenaforge.flows.options import ParamsOptions
from arenaforge.tracks.train.params import RolloutParams

app = typer.Typer(help="Run policy rollouts in environments with the F1 reward.", no_args_is_help=True)


OPTIONS = ParamsOptions(RolloutParams, flags=ENV_FLAGS, exclude=CONTEXT_FIELDS)


@app.command("run")
@OPTIONS.command
def run_cmd(ctx: typer.Context, fields: dict[str, Any]) -> None:
    """Roll out a policy on warehouse environments and store the rollouts."""
    from arenaforge.flows.train_flows import rollout

    st = state(ctx)
    params = OPTIONS.build("rollout run", fields, config_path=st.config_path, db=st.overrides.get("warehouse.path"))
    typer.echo(json.dumps(run_flow(rollout(params)), indent=2, default=str))
