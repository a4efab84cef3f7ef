"""`arenaforge demo`: the whole pipeline on the bundled sample data, offline, into a local DuckDB.

Runs the real flows in order — ingest → graph → sft (exported) → envs → export (verl, Harbor,
JSONL) → (with --train) warm start + GRPO of the default policy on the train split and its evaluation
on the test split — with the offline backend and the project's own sample tool documents
(`arenaforge/data/sample_tools/`) and knowledge source (`arenaforge/data/sample_source/`).
Needs no model endpoint, no network and no ../shared data. Re-running it adds no duplicates. It ends by
saying where it wrote every export.
"""

from __future__ import annotations

import time
from importlib import resources
from pathlib import Path
from typing import Any

import typer

from arenaforge.flows.context import run_flow, state
from arenaforge.flows.display import console, print_rows
from arenaforge.tracks.envs.pipeline import EnvsSpec

app = typer.Typer(help="Run the whole pipeline offline on the bundled sample data.", invoke_without_command=True)


def _sample(name: str) -> str:
    return str(resources.files("arenaforge.data").joinpath(name))


@app.callback()
def demo(
    ctx: typer.Context,
    n: int = typer.Option(EnvsSpec.model_fields["n"].default, "--n", "-n",
                          help="QA instances to synthesize from the sample source."),
    train: bool = typer.Option(False, "--train/--no-train", help="Also train the default policy (warm start + GRPO) "
                               "on the train split and print its test-split table."),
    out: str = typer.Option(None, "--out", "-o", help="Folder for exports (default: config out_dir/demo)."),
) -> None:
    """Ingest → graph → SFT trajectories → RL environments (→ rollouts, GRPO, eval) on sample data, offline."""
    if ctx.invoked_subcommand is not None:
        return
    from arenaforge.flows.envs_flows import EnvsParams, envs
    from arenaforge.flows.sft_flows import GraphParams, IngestParams, SftParams, graph, ingest, sft
    from arenaforge.tracks.envs.export import export_environments, verified_environments
    from arenaforge.tracks.train.splits import held_out_ids
    from arenaforge.tracks.train.verl.dataset import write_verl

    st = state(ctx)
    st.overrides.setdefault("model.backend", "offline")
    cfg = st.config
    out_dir = Path(out or Path(cfg.out_dir) / "demo").expanduser().resolve()
    common: dict[str, Any] = {"config_path": st.config_path, "overrides": dict(st.overrides)}
    steps: list[tuple[str, Any]] = [
        ("ingest", lambda: run_flow(ingest(IngestParams(paths=[_sample("sample_tools")], **common)))),
        ("graph", lambda: run_flow(graph(GraphParams(**common)))),
        ("sft", lambda: run_flow(sft(SftParams(export_dir=str(out_dir / "sft"), **common)))),
        ("envs", lambda: run_flow(envs(EnvsParams(sources=[_sample("sample_source")], n=n, **common)))),
        ("export", lambda: export_environments(verified_environments(st.warehouse()), out_dir / "envs",
                                               held_out=held_out_ids(st.warehouse()), write_verl=write_verl)),
    ]

    if train:
        if n < TRAIN_MIN_QAS:  # a train/test split needs more than a handful of environments
            steps[3] = ("envs", lambda: run_flow(envs(EnvsParams(sources=[_sample("sample_source")], n=TRAIN_MIN_QAS,
                                                                 **common))))
        steps += _training_steps(st, out_dir)

    summary, results = [], {}
    for name, run in steps:
        console.print(f"[bold]demo[/bold] {name} …")
        started = time.perf_counter()
        results[name] = run()
        summary.append((name, f"{time.perf_counter() - started:.1f}s", _headline(results[name])))
    print_rows(["step", "time", "result"], summary, title="arenaforge demo", full=True)
    wh = st.warehouse()
    counts = [(name, wh.count(name)) for name, kind in wh.relations() if kind == "table" and wh.count(name)]
    console.print(f"[bold]warehouse:[/bold] {wh.path.resolve()}", soft_wrap=True)
    print_rows(["table", "rows"], counts)
    if train:
        from arenaforge.flows.commands.train import print_eval_table

        trained = results.get("train-grpo") or {}
        print_eval_table(trained.get("eval") or {}, title="test split: untrained / warm start / warm start + GRPO")
        if trained.get("curves_png"):
            console.print(f"Curves: {trained['curves_png']}")
    _print_exports(results, out_dir)
    console.print("[bold]browse:[/bold] arenaforge db show environments\n        arenaforge envs show <id>\n"
                  "        arenaforge db show trajectories")


def _print_exports(results: dict[str, Any], out_dir: Path) -> None:
    """Where every export went (absolute paths), one line each."""
    exported, verl = results["export"], results["export"]["verl"]
    lines = [("SFT data (messages + tools)", results["sft"].get("export", str(out_dir / "sft" / "sft.jsonl"))),
             (f"verl (train {verl['train_rows']}, val {verl['val_rows']})", verl["dir"]),
             (f"Harbor tasks ({exported['harbor_tasks']})", exported["harbor"]),
             ("environments JSONL", exported["jsonl"])]
    if "train-grpo" in results:
        lines.append(("GRPO checkpoints", str(out_dir / "train")))
    console.print("[bold]exports written:[/bold]")
    for what, where in lines:
        console.print(f"  {what}: {where}", markup=False, highlight=False, soft_wrap=True)


TRAIN_MIN_QAS = 2000  # the recipe's data size (`bench learning`)


def _training_steps(st: Any, out_dir: Path) -> list[tuple[str, Any]]:
    """The default policy's recipe (`arenaforge bench learning` measures it): warm start, GRPO, eval on the test split."""
    from arenaforge.flows.train_flows import train_grpo
    from arenaforge.tracks.train.params import RECIPE, GrpoParams

    base = {"config_path": st.config_path, "db": st.overrides.get("warehouse.path")}
    params = GrpoParams(out_dir=str(out_dir / "train"), experiment="demo", **RECIPE, **base)
    return [("train-grpo", lambda: run_flow(train_grpo(params)))]


def _headline(result: Any) -> str:
    """Every count of a step's result (paths and ids are listed under exports)."""
    if isinstance(result, dict):
        flat = {k: v for k, v in result.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
        return ", ".join(f"{k}={v}" for k, v in flat.items())
    return str(result)
