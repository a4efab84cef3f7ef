"""`arenaforge graph`: Build and inspect tool-call graphs; sample tool chains."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from arenaforge.flows.context import run_flow, state, synthesis_context
from arenaforge.flows.options import ParamsOptions
from arenaforge.flows.sft_params import CONFIG_REF, GraphParams

app = typer.Typer(help="Build and inspect tool-call graphs; sample tool chains.", no_args_is_help=True)


BUILD_OPTIONS = ParamsOptions(GraphParams, exclude=CONFIG_REF, flags={"servers": ("--server", "-s")})


@app.command("build")
@BUILD_OPTIONS.command("graph build", synthesis_context)
def build(ctx: typer.Context, params: GraphParams) -> None:
    """Run the `graph` flow: data-flow edges (plus model-proposed chains on the openai backend) into graph_edges."""
    from arenaforge.flows.outcome import run_and_report
    from arenaforge.flows.sft_flows import graph

    st = state(ctx)
    run_and_report("graph", st.warehouse(), lambda: run_flow(graph(params)))


@app.command("show")
def show(
    ctx: typer.Context,
    server: str = typer.Argument(..., help="Server name (see `arenaforge db show v_servers`)."),
    out: str = typer.Option(None, "--out", "-o", help="PNG path (default: <out_dir>/graph_<server>.png)."),
) -> None:
    """Draw SERVER's tool-call graph to a PNG (edge width = weight, label = uses) and list its edges."""
    from arenaforge.flows.display import print_rows
    from arenaforge.tracks.sft.tool_graph import draw_graph, load_graphs, load_servers

    st = state(ctx)
    wh = st.warehouse()
    servers, _ = load_servers(wh, [server])
    g = load_graphs(wh, servers)[server]
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in server)
    path = draw_graph(g, Path(out) if out else Path(st.config.out_dir) / f"graph_{safe}.png")
    rows = [(a, b, f"{d['weight']:.2f}", d["uses"], d["origin"], d["evidence"]) for a, b, d in sorted(g.edges(data=True))]
    print_rows(["src", "dst", "weight", "uses", "origin", "evidence"], rows,
               title=f"{server}: {g.number_of_nodes()} tools, {g.number_of_edges()} edges")
    typer.echo(str(path))


@app.command("sample")
def sample(
    ctx: typer.Context,
    server: list[str] = typer.Option(None, "--server", "-s", help="Server (repeatable; default: all)."),
    seed: int = typer.Option(None, help="Walk seed (default: config seed)."),
) -> None:
    """Sample and verify chains (weighted, bounded, acyclic walks) without running the rest of `sft`."""
    from arenaforge.tracks.sft.stages import sample_chains

    st = state(ctx)
    cfg = st.config
    ids, counts = sample_chains(cfg, st.warehouse(), None, list(server or []), cfg.seed if seed is None else seed)
    typer.echo(json.dumps({**counts, "verified_chain_ids": ids[:20]}, indent=2))
