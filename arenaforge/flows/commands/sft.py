"""`arenaforge sft`: Synthesize tasks and scored multi-turn trajectories (SFT track)."""

from __future__ import annotations

import json

import typer

from arenaforge.flows.context import flag_errors, run_flow, state

app = typer.Typer(help="Synthesize tasks and scored multi-turn trajectories (SFT track).", no_args_is_help=True)


@app.command("synth")
def synth(
    ctx: typer.Context,
    server: list[str] = typer.Option(None, "--server", "-s", help="Server (repeatable; default: all)."),
    seed: int = typer.Option(None, help="Seed of walks, queries and simulators (default: config seed)."),
    server_only: bool = typer.Option(True, "--server-only/--chains-only", help="Also write server-only tasks."),
    export: str = typer.Option(None, "--export", help="Export this run's kept trajectories to this folder."),
    batch_size: int = typer.Option(64, help="runner.kind = ray: tasks per batch a worker runs and judges."),
) -> None:
    """Run the `sft` flow: chains -> tasks (scored) -> trajectories -> seven-dimension judge scores."""
    from arenaforge.flows.outcome import run_and_report
    from arenaforge.flows.sft_flows import SftParams, sft

    st = state(ctx)
    with flag_errors("sft synth"):
        params = SftParams(servers=list(server or []), seed=seed, server_only=server_only, export_dir=export,
                           batch_size=batch_size, config_path=st.config_path, overrides=st.overrides)
    run_and_report("sft", st.warehouse(), lambda: run_flow(sft(params)))


@app.command("export")
def export(
    ctx: typer.Context,
    out: str = typer.Option(None, "--out", "-o", help="Folder (default: config out_dir)."),
    run_id: str = typer.Option(None, "--run", help="Only trajectories judged in this run."),
    min_score: float = typer.Option(None, help="Stricter keep threshold on the judge mean."),
) -> None:
    """Write kept trajectories as OpenAI messages + tools (sft.jsonl, sft.parquet) and sft_stats.json."""
    from arenaforge.tasks.sft.export import export_sft

    st = state(ctx)
    report = export_sft(st.warehouse(), out or st.config.out_dir, run_id=run_id, min_score=min_score)
    typer.echo(json.dumps(report, indent=2))
