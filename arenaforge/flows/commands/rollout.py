"""`arenaforge rollout`: Run policy rollouts in environments with the F1 reward."""

from __future__ import annotations

import json

import typer

from arenaforge.flows.commands.train import CONTEXT_FIELDS, ENV_FLAGS
from arenaforge.flows.context import run_context, run_flow
from arenaforge.flows.options import ParamsOptions
from arenaforge.tracks.train.params import RolloutParams

app = typer.Typer(help="Run policy rollouts in environments with the F1 reward.", no_args_is_help=True)


OPTIONS = ParamsOptions(RolloutParams, flags=ENV_FLAGS, exclude=CONTEXT_FIELDS)


@app.command("run")
@OPTIONS.command("rollout run", run_context)
def run_cmd(ctx: typer.Context, params: RolloutParams) -> None:
    """Roll out a policy on warehouse environments and store the rollouts."""
    from arenaforge.flows.train_flows import rollout

    typer.echo(json.dumps(run_flow(rollout(params)), indent=2, default=str))
