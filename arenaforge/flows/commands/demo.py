"""`arenaforge demo`: the whole pipeline on the bundled sample data, offline, into a local DuckDB.

Runs the real flows in order — ingest → graph → sft → envs → (optionally) rollout + GRPO +
eval on the tiny locally built model — with the offline backend and the project's own sample
tool documents (`arenaforge/tasks/data/sample_tools/`) and knowledge source (`arenaforge/tasks/data/sample_source/`).
Needs no model endpoint, no network and no ../shared data. Re-running it adds no duplicates.
"""

from __future__ import annotations

import time
from importlib import resources
from pathlib import Path
from typing import Any

import typer

from arenaforge.flows.context import run_flow, state
from arenaforge.flows.display import console, print_rows

app = typer.Typer(help="Run the whole pipeline offline on the bundled sample data.", invoke_without_command=True)


def _sample(name: str) -> str:
    return str(resources.files("arenaforge.tasks.data").joinpath(name))


@app.callback()
def demo(
    ctx: typer.Context,
    n: int = typer.Option(24, "--n", "-n", help="QA instances to synthesize from the sample source."),
    train: bool = typer.Option(False, "--train/--no-train", help="Also roll out, train GRPO and evaluate the tiny model."),
    out: str = typer.Option(None, "--out", "-o", help="Folder for exports (default: config out_dir/demo)."),
) -> None:
    """Ingest → graph → SFT trajectories → RL environments (→ rollouts, GRPO, eval) on sample data, offline."""
    if ctx.invoked_subcommand is not None:
        return
    from arenaforge.flows.envs_flows import EnvsParams, envs
    from arenaforge.flows.sft_flows import GraphParams, IngestParams, SftParams, graph, ingest, sft

    st = state(ctx)
    st.overrides.setdefault("model.backend", "offline")
    cfg = st.config
    out_dir = Path(out or Path(cfg.out_dir) / "demo")
    common: dict[str, Any] = {"config_path": st.config_path, "overrides": dict(st.overrides)}
    steps: list[tuple[str, Any]] = [
        ("ingest", lambda: run_flow(ingest(IngestParams(paths=[_sample("sample_tools")], **common)))),
        ("graph", lambda: run_flow(graph(GraphParams(**common)))),
        ("sft", lambda: run_flow(sft(SftParams(export_dir=str(out_dir / "sft"), **common)))),
        ("envs", lambda: run_flow(envs(EnvsParams(sources=[_sample("sample_source")], n=n, **common)))),
    ]

    if train:
        steps += _training_steps(st, out_dir)

    summary = []
    for name, run in steps:
        console.print(f"[bold]demo[/bold] {name} …")
        started = time.perf_counter()
        result = run()
        summary.append((name, f"{time.perf_counter() - started:.1f}s", _headline(result)))
    print_rows(["step", "time", "result"], summary, title="arenaforge demo", width=110)
    wh = st.warehouse()
    counts = [(name, wh.count(name)) for name, kind in wh.relations() if kind == "table" and wh.count(name)]
    print_rows(["table", "rows"], counts, title=f"warehouse {wh.path}")
    console.print("Browse: arenaforge db show environments | arenaforge envs show <id> | arenaforge db show trajectories")


def _training_steps(st: Any, out_dir: Path) -> list[tuple[str, Any]]:
    from arenaforge.flows.train_flows import evaluate, train_grpo
    from arenaforge.tasks.train.jobs import EvalParams, GrpoParams

    base = {"config_path": st.config_path, "db": st.overrides.get("warehouse.path")}
    return [
        ("train-grpo", lambda: train_grpo(GrpoParams(steps=2, warmstart_steps=60, out_dir=str(out_dir / "train"), **base))),
        ("eval", lambda: evaluate(EvalParams(**base))),
    ]


def _headline(result: Any) -> str:
    if isinstance(result, dict):
        flat = {k: v for k, v in result.items() if isinstance(v, (int, float, str)) and k != "run_id"}
        return ", ".join(f"{k}={v}" for k, v in list(flat.items())[:8])
    return str(result)[:100]
