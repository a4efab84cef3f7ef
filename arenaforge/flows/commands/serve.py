"""`arenaforge serve`: Start the Prefect server, deployments and a worker; start deployment runs.

    arenaforge serve                      # server + work pool + every deployment + worker; Ctrl-C stops all
    arenaforge serve run train-sft --param max_steps=20 --wait
    arenaforge serve ls                   # deployments known to the server
"""

from __future__ import annotations

import signal

import typer

from arenaforge.flows.context import state
from arenaforge.flows.display import FORMAT_HELP, check_format, console, print_records, print_rows

app = typer.Typer(
    help="Start the Prefect server, deployments and a worker (Ctrl-C stops everything); start deployment runs.",
    invoke_without_command=True,
)


@app.callback()
def serve(
    ctx: typer.Context,
    port: int = typer.Option(None, "--port", "-p", help="Server port (overrides prefect.port)."),
    no_worker: bool = typer.Option(False, "--no-worker", help="Register deployments but start no worker."),
) -> None:
    """Bring up the Prefect stack (unless a sub-command is given) and wait for Ctrl-C."""
    if ctx.invoked_subcommand is not None:
        return
    from arenaforge.flows.serve import Stack, quiet_env

    quiet_env()
    cfg = state(ctx).config
    stack = Stack(cfg, port=port, worker=not no_worker)
    console.print("starting Prefect (server start takes ~20 s) ...")
    with stack:
        print_rows(
            ["deployment", "prefect name", "schedule"],
            [(n, full, _schedule_text(cfg, n)) for n, full in stack.deployments.items()],
            title=f"{len(stack.deployments)} deployments on work pool {cfg.prefect.work_pool!r}",
        )
        console.print(f"UI: [bold]{stack.ui_url()}[/bold]   API: {stack.api_url}")
        console.print(f"project: {stack.project_dir()} (flow runs resolve relative paths here)")
        console.print(f"warehouse: {stack.child_env()['ARENAFORGE_WAREHOUSE__PATH']}   logs: {stack._logs()}")
        console.print("Ctrl-C stops the worker, its flow runs and the server.")
        stack.wait()
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not abort the clean stop
        console.print("stopping worker and server ...")
    console.print("stopped")


def _schedule_text(cfg, name: str) -> str:  # type: ignore[no-untyped-def]
    spec = cfg.prefect.schedules.get(name)
    if not spec:
        return ""
    text = f"cron {spec['cron']}" if "cron" in spec else f"every {spec['interval_s']} s"
    return text if spec.get("active", True) else f"{text} (paused)"


@app.command("run")
def run(
    ctx: typer.Context,
    deployment: str = typer.Argument(..., help="Deployment name (e.g. train-sft) or flow-name/deployment."),
    param: list[str] = typer.Option([], "--param", "-P", help="key=value (JSON values; dotted keys nest). Repeat."),
    wait: bool = typer.Option(False, "--wait", help="Block until the run finishes; exit 1 unless it completed."),
) -> None:
    """Start a run of a served deployment (parameters validated before anything is sent)."""
    from arenaforge.flows.deployments import parse_params, start_run
    from arenaforge.flows.serve import api_url_for, quiet_env

    quiet_env()
    cfg = state(ctx).config
    api_url = api_url_for(cfg)
    flow_run = start_run(api_url, deployment, parse_params(param), wait_s=None if wait else 0)
    ui = api_url[: -len("/api")] if api_url.endswith("/api") else api_url
    status = flow_run.state.name if flow_run.state else "Scheduled"
    console.print(f"flow run {flow_run.name} ({flow_run.id}): {status}  {ui}/runs/flow-run/{flow_run.id}")
    if wait and not (flow_run.state and flow_run.state.is_completed()):
        raise typer.Exit(1)


@app.command("ls")
def ls(ctx: typer.Context, fmt: str = typer.Option("table", "--format", "-f", help=FORMAT_HELP)) -> None:
    """List the deployments on the server, with their schedules."""
    from arenaforge.flows.serve import api_url_for, quiet_env, require_api

    check_format(fmt)
    quiet_env()
    api_url = api_url_for(state(ctx).config)
    require_api(api_url)
    from prefect.client.orchestration import get_client
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: api_url}), get_client(sync_client=True) as client:
        deployments = client.read_deployments()
        flows = {f.id: f.name for f in client.read_flows()}
    rows = [
        (
            d.name,
            flows.get(d.flow_id, "?"),
            d.work_pool_name,
            "; ".join(
                f"{'on' if s.active else 'paused'} {getattr(s.schedule, 'cron', None) or getattr(s.schedule, 'interval', '')}"
                for s in d.schedules
            ),
        )
        for d in deployments
    ]
    print_records(["deployment", "flow", "work pool", "schedules"], rows, fmt, title=api_url)
