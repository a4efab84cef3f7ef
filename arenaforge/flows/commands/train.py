"""`arenaforge train`: Train policies: GRPO and SFT, on one node or via verl."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from arenaforge.flows.context import run_context, run_flow
from arenaforge.flows.options import ParamsOptions
from arenaforge.schemas.errors import InputError
from arenaforge.tracks.train.params import GrpoParams, SftParams, WarmstartParams

app = typer.Typer(help="Train policies: GRPO and SFT, on one node or via verl.", no_args_is_help=True)


# EnvSelection's fields whose flags have other names
ENV_FLAGS = {"envs.limit": "--env-limit", "envs.env_ids": "--env-id"}
# Fields of the params models that come from the command's context (the global --config and --db), not a flag of its own
CONTEXT_FIELDS = ("config_path", "db")


def _echo(result: dict[str, Any]) -> None:
    typer.echo(json.dumps(result, indent=2, default=str))


@app.command("build-tiny-model")
def build_tiny_model_cmd(
    out: str = typer.Option(..., "--out", help="Directory to write the model and tokenizer to."),
    layers: int = typer.Option(2, help="Decoder layers."),
    hidden: int = typer.Option(64, help="Hidden size."),
    seed: int = typer.Option(0, help="Weight-initialisation seed."),
) -> None:
    """A random-weight Qwen3-style model with a tokenizer trained on this project's text (offline)."""
    from arenaforge.tracks.train.tiny_model import build_tiny_model

    path = build_tiny_model(out, layers=layers, hidden=hidden, seed=seed)
    _echo({"path": str(path)})


def print_eval_table(evals: dict[str, dict[str, Any]], title: str = "test split") -> None:
    """The untrained / warm start / warm start + GRPO table, on the terminal."""
    from arenaforge.flows.display import print_rows
    from arenaforge.flows.train_flows import eval_rows

    rows = eval_rows(evals)
    if rows:
        print_rows(list(rows[0]), [list(r.values()) for r in rows], title=title, width=40)


GRPO_OPTIONS = ParamsOptions(GrpoParams, flags={**ENV_FLAGS, "verl.ray_address": "--ray-address"},
                             prefixes={"verl": "verl-"}, exclude=CONTEXT_FIELDS)


@app.command("grpo")
@GRPO_OPTIONS.command("train grpo", run_context)
def grpo_cmd(ctx: typer.Context, params: GrpoParams) -> None:
    """GRPO (no KL, no entropy, clip-higher, adaptive batch filling) on the train split, evaluated on the test split."""
    from arenaforge.flows.train_flows import train_grpo

    result = run_flow(train_grpo(params))
    _echo(result)
    print_eval_table(result.get("eval") or {})


WARMSTART_OPTIONS = ParamsOptions(WarmstartParams, flags=ENV_FLAGS, exclude=CONTEXT_FIELDS, required=["out"])


@app.command("warmstart")
@WARMSTART_OPTIONS.command("train warmstart", run_context)
def warmstart_cmd(ctx: typer.Context, params: WarmstartParams) -> None:
    """Warm-start SFT data: gold calls replayed in the sandbox, as OpenAI messages+tools JSONL."""
    from arenaforge.flows.train_flows import warmstart

    _echo(run_flow(warmstart(params)))


SFT_OPTIONS = ParamsOptions(SftParams, exclude=CONTEXT_FIELDS, required=["data"])


@app.command("sft")
def _sft_context(ctx: typer.Context, fields: dict[str, Any]) -> dict[str, Any]:
    if not Path(fields["data"]).is_file():  # before a Prefect server starts for nothing
        raise InputError(f"train sft: --data {fields['data']}: no such file")
    return run_context(ctx, fields)


@app.command("sft")
@SFT_OPTIONS.command("train sft", _sft_context)
def sft_cmd(ctx: typer.Context, params: SftParams) -> None:
    """Supervised fine-tuning with loss on assistant tokens only."""
    from arenaforge.flows.train_flows import train_sft

    _echo(run_flow(train_sft(params)))
