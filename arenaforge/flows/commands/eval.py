"""`arenaforge eval`: Evaluate a policy on held-out environments."""

from __future__ import annotations

import json
from typing import Any

import typer

from arenaforge.flows.commands.train import CONTEXT_FIELDS, ENV_FLAGS
from arenaforge.flows.context import run_context, run_flow
from arenaforge.flows.options import ParamsOptions
from arenaforge.tracks.train.params import EvalParams

app = typer.Typer(help="Evaluate a policy on held-out environments, or on an imported suite (--suite).",
                  invoke_without_command=True)


@app.callback()
def suite_shortcut(
    ctx: typer.Context,
    suite: str = typer.Option(None, "--suite", help="`arenaforge eval --suite NAME` = `arenaforge eval run --suite NAME` with its defaults; "
                               "to set anything else (--model-path, ...) use `eval run`."),
) -> None:
    """Evaluate a policy on held-out environments, or on an imported suite (--suite)."""
    if ctx.invoked_subcommand is not None:
        return
    if not suite:
        typer.echo(ctx.get_help())
        raise typer.Exit(0)
    command = typer.main.get_command(app).commands["run"]  # type: ignore[attr-defined]
    defaults = {p.name: p.get_default(ctx) for p in command.params if p.name}
    run_cmd(ctx=ctx, **{**defaults, "suite": suite})


# split: its default depends on --suite (the test split, or every split of the suite)
OPTIONS = ParamsOptions(EvalParams, flags=ENV_FLAGS, exclude=[*CONTEXT_FIELDS, "envs.split"])


@app.command("run")
def _eval_context(ctx: typer.Context, split: str | None, fields: dict[str, Any]) -> dict[str, Any]:
    if split or fields["envs"]["suite"]:
        fields["envs"]["split"] = split or "all"
    return run_context(ctx, fields)


@app.command("run")
@OPTIONS.command("eval run", _eval_context)
def run_cmd(
    ctx: typer.Context,
    params: EvalParams,
    split: str = typer.Option(None, help="test (default; all with --suite), train or all."),
) -> None:
    """Mean F1, recall, precision, calls per task and failure reasons (and an imported suite's native metric);
    stored as an eval_runs row."""
    from arenaforge.flows.train_flows import evaluate

    suite = params.envs.suite
    result = run_flow(evaluate(params))
    typer.echo(json.dumps(result, indent=2, default=str))
    from arenaforge.flows.commands.train import print_eval_table

    print_eval_table({result.get("policy", "policy"): result},
                     title=f"suite {suite} (native {result.get('native')})" if suite else f"{params.envs.split} split")
