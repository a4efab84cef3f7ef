"""`arenaforge sft`: Synthesize tasks and scored multi-turn trajectories (SFT track)."""

from __future__ import annotations

import json

import typer

from arenaforge.flows.context import run_flow, state, synthesis_context
from arenaforge.flows.options import ParamsOptions
from arenaforge.flows.sft_params import CONFIG_REF, SftParams

app = typer.Typer(help="Synthesize tasks and scored multi-turn trajectories (SFT track).", no_args_is_help=True)


SYNTH_OPTIONS = ParamsOptions(SftParams, exclude=CONFIG_REF, flags={
    "servers": ("--server", "-s"), "server_only": "--server-only/--chains-only", "export_dir": "--export"})


@app.command("synth")
@SYNTH_OPTIONS.command("sft synth", synthesis_context)
def synth(ctx: typer.Context, params: SftParams) -> None:
    """Run the `sft` flow: chains -> tasks (scored) -> trajectories -> seven-dimension judge scores."""
    from arenaforge.flows.outcome import run_and_report
    from arenaforge.flows.sft_flows import sft

    st = state(ctx)
    run_and_report("sft", st.warehouse(), lambda: run_flow(sft(params)))


@app.command("export")
def export(
    ctx: typer.Context,
    out: str = typer.Option(None, "--out", "-o", help="Folder (default: config out_dir)."),
    run_id: str = typer.Option(None, "--run", help="Only trajectories judged in this run."),
    min_score: float = typer.Option(None, help="Stricter keep threshold on the judge mean."),
) -> None:
    """Write kept trajectories as OpenAI messages + tools (sft.jsonl, sft.parquet) and sft_stats.json."""
    from arenaforge.tracks.sft.export import export_sft

    st = state(ctx)
    report = export_sft(st.warehouse(), out or st.config.out_dir, run_id=run_id, min_score=min_score)
    typer.echo(json.dumps(report, indent=2))
