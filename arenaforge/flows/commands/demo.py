"""`arenaforge demo`: the whole pipeline on the bundled sample data, offline, into a local DuckDB.

Runs the real flows in order — ingest → graph → sft → envs → (with --train) warm start + GRPO of the
default policy on the train split and its evaluation on the test split — with the offline backend and the project's own sample
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
    train: bool = typer.Option(False, "--train/--no-train", help="Also train the default policy (warm start + GRPO) "
                               "on the train split and print its test-split table."),
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
        if n < TRAIN_MIN_QAS:  # a train/test split needs more than a handful of environments
            steps[-1] = ("envs", lambda: run_flow(envs(EnvsParams(sources=[_sample("sample_source")], n=TRAIN_MIN_QAS,
                                                                  **common))))
        steps += _training_steps(st, out_dir)

    summary = []
    results: list[tuple[str, Any]] = []
    for name, run in steps:
        console.print(f"[bold]demo[/bold] {name} …")
        started = time.perf_counter()
        result = run()
        results.append((name, result))
        summary.append((name, f"{time.perf_counter() - started:.1f}s", _headline(result)))
    print_rows(["step", "time", "result"], summary, title="arenaforge demo", width=110)
    wh = st.warehouse()
    counts = [(name, wh.count(name)) for name, kind in wh.relations() if kind == "table" and wh.count(name)]
    print_rows(["table", "rows"], counts, title=f"warehouse {wh.path}")
    if train:
        from arenaforge.flows.commands.train import print_eval_table

        trained = next((r for name, r in results if name == "train-grpo"), {})
        print_eval_table(trained.get("eval") or {}, title="test split: untrained / warm start / warm start + GRPO")
        if trained.get("curves_png"):
            console.print(f"Curves: {trained['curves_png']}")
    console.print("Browse: arenaforge db show environments | arenaforge envs show <id> | arenaforge db show trajectories")


TRAIN_MIN_QAS = 2000  # the recipe's data size (`bench learning`)


def _training_steps(st: Any, out_dir: Path) -> list[tuple[str, Any]]:
    """The default policy's recipe (`arenaforge bench learning` measures it): warm start, GRPO, eval on the test split."""
    from arenaforge.flows.train_flows import train_grpo
    from arenaforge.tasks.train.jobs import RECIPE, GrpoParams

    base = {"config_path": st.config_path, "db": st.overrides.get("warehouse.path")}
    params = GrpoParams(out_dir=str(out_dir / "train"), experiment="demo", **RECIPE, **base)
    return [("train-grpo", lambda: run_flow(train_grpo(params)))]


def _headline(result: Any) -> str:
    if isinstance(result, dict):
        flat = {k: v for k, v in result.items() if isinstance(v, (int, float, str)) and k not in ("run_id", "curves_png")}
        return ", ".join(f"{k}={v}" for k, v in list(flat.items())[:8])
    return str(result)[:100]
