"""`arenaforge ingest`: Ingest tool documents and live MCP servers into normalised tool schemas."""

from __future__ import annotations

import typer

from arenaforge.flows.context import run_flow, state
from arenaforge.schemas.errors import InputError

# A group (the CLI mounts sub-apps) whose callback does the work; interspersed args let
# `arenaforge ingest PATH --mcp CMD PATH2` parse options between paths.
app = typer.Typer(help="Ingest tool documents and live MCP servers into normalised tool schemas.",
                  invoke_without_command=True, context_settings={"allow_interspersed_args": True})


@app.callback(invoke_without_command=True)
def ingest(
    ctx: typer.Context,
    paths: list[str] = typer.Argument(None, help="Files or folders of tool documents (OpenAI, ASTRA, BFCL, ACEBench, "
                                      "StableToolBench; detected per file)."),
    mcp: list[str] = typer.Option(None, "--mcp", help="Live MCP server command over stdio, e.g. \"mcp-server-git "
                                  "--repository .\" (repeatable)."),
) -> None:
    """Run the `ingest` flow; every dropped tool is a row in `rejections` with its reason."""
    if ctx.invoked_subcommand is not None:
        return
    if not paths and not mcp:
        raise InputError("give at least one PATH or --mcp COMMAND (see arenaforge ingest --help)")
    from arenaforge.flows.outcome import run_and_report
    from arenaforge.flows.sft_flows import IngestParams
    from arenaforge.flows.sft_flows import ingest as ingest_flow

    st = state(ctx)
    run_and_report("ingest", st.warehouse(), lambda: run_flow(ingest_flow(IngestParams(
        paths=list(paths or []), mcp=list(mcp or []), config_path=st.config_path, overrides=st.overrides))))
