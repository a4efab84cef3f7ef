"""`arenaforge train`: Train policies: GRPO and SFT, on one node or via verl."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from arenaforge.flows.context import flag_errors, run_flow, state
from arenaforge.schemas.errors import InputError

app = typer.Typer(help="Train policies: GRPO and SFT, on one node or via verl.", no_args_is_help=True)


# EnvSelection's fields and the flags that set them
ENV_FLAGS = {"limit": "--env-limit"}


def _echo(result: dict[str, Any]) -> None:
    typer.echo(json.dumps(result, indent=2, default=str))


def _common(ctx: typer.Context) -> dict[str, Any]:
    st = state(ctx)
    return {"config_path": st.config_path, "db": st.overrides.get("warehouse.path")}


@app.command("build-tiny-model")
def build_tiny_model_cmd(
    out: str = typer.Option(..., "--out", help="Directory to write the model and tokenizer to."),
    layers: int = typer.Option(2, help="Decoder layers."),
    hidden: int = typer.Option(64, help="Hidden size."),
    seed: int = typer.Option(0, help="Weight-initialisation seed."),
) -> None:
    """A random-weight Qwen3-style model with a tokenizer trained on this project's text (offline)."""
    from arenaforge.tasks.train.tiny_model import build_tiny_model

    path = build_tiny_model(out, layers=layers, hidden=hidden, seed=seed)
    _echo({"path": str(path)})


def print_eval_table(evals: dict[str, dict[str, Any]], title: str = "test split") -> None:
    """The untrained / warm start / warm start + GRPO table, on the terminal."""
    from arenaforge.flows.display import print_rows
    from arenaforge.flows.train_flows import eval_rows

    rows = eval_rows(evals)
    if rows:
        print_rows(list(rows[0]), [list(r.values()) for r in rows], title=title, width=40)


@app.command("grpo")
def grpo_cmd(
    ctx: typer.Context,
    engine: str = typer.Option("hf", help="Policy engine: hf, vllm or vllm-local."),
    model_path: str = typer.Option(None, help="Model dir or checkpoint, or arena-small (default), tiny, smollm2-135m."),
    policy_url: str = typer.Option(None, help="vllm: the `vllm serve` endpoint, e.g. http://127.0.0.1:8000/v1."),
    served_model: str = typer.Option(None, help="vllm: served model name."),
    experiment: str = typer.Option("grpo", help="Experiment name (checkpoint directory; resumes when it exists)."),
    out_dir: str = typer.Option(None, help="Parent directory of experiments (default: the config's out_dir + /train)."),
    steps: int = typer.Option(3, help="Total optimisation steps (a resumed run continues up to this)."),
    batch_groups: int = typer.Option(4, help="Groups per batch."),
    group_size: int = typer.Option(8, help="Rollouts per group (G)."),
    delta: float = typer.Option(0.0, help="Keep groups whose reward std exceeds this."),
    roc: bool = typer.Option(False, help="Resample-on-Correct (oversample 2G, keep G)."),
    max_groups_per_step: int = typer.Option(32, help="Stop filling a batch after this many groups (then skip)."),
    curriculum: bool = typer.Option(True, help="Pick environments by measured pass rate; --no-curriculum cycles."),
    lr: float = typer.Option(5e-5, help="Learning rate (constant)."),
    temperature: float = typer.Option(1.0, help="Rollout sampling temperature."),
    warmstart_steps: int = typer.Option(0, help="First SFT this many steps on gold-call replays + kept trajectories."),
    warmstart_lr: float = typer.Option(1e-3, help="Warm-start SFT learning rate."),
    warmstart_batch_size: int = typer.Option(8, help="Warm-start SFT examples per step."),
    warmstart_trajectories: int = typer.Option(200, help="Kept SFT-track trajectories in the warm-start data (at most)."),
    warmstart_copy_variants: int = typer.Option(0, help="Copy-forced variants (fresh values, shuffled tools) per "
                                                "gold-call replay in the warm-start data."),
    max_turns: int = typer.Option(4, help="Assistant turns per episode."),
    max_length: int = typer.Option(384, help="Response tokens per episode."),
    max_tokens_per_turn: int = typer.Option(96, help="Tokens per assistant turn."),
    env_limit: int = typer.Option(None, help="Use at most this many environments."),
    split: str = typer.Option("train", help="Environment split: train (default), test or all."),
    test_share: float = typer.Option(0.2, help="Held-out share of each stratum, for environments not yet split."),
    evaluate: bool = typer.Option(True, help="Evaluate on the test split before, after the warm start, after GRPO."),
    eval_limit: int = typer.Option(None, help="Evaluate on at most this many test environments."),
    checkpoint_every: int = typer.Option(5, help="Save weights every k steps."),
    old_logprobs: str = typer.Option("policy", help="policy (on-policy ratio) or engine (vLLM log-probs)."),
    ray_address: str = typer.Option(None, help="Submit to verl on this Ray cluster instead of training here."),
    verl_spec_only: bool = typer.Option(False, help="Write the verl job files and stop."),
    seed: int = typer.Option(0, help="Seed of sampling, curriculum and data order."),
    ground_arguments: bool = typer.Option(True, help="hf engine: a tool call's argument values are copied from "
                                          "the conversation (spans, numbers); --no-ground-arguments: any JSON."),
    skip_forced_tokens: bool = typer.Option(True, help="hf engine: tokens sampled with probability 1 (forced by "
                                            "constrained decoding) leave the loss; --no-skip-forced-tokens: counted."),
    precision: str = typer.Option("fp32", help="fp32, or bf16: mixed precision (bf16 autocast, fp32 weights and "
                                  "optimizer)."),
    lora_rank: int = typer.Option(0, help="0: train every weight; r > 0: LoRA adapters of rank r on every linear "
                                  "layer (needs peft: the lora extra); checkpoints hold the merged model."),
) -> None:
    """GRPO (no KL, no entropy, clip-higher, adaptive batch filling) on the train split, evaluated on the test split."""
    from arenaforge.flows.train_flows import train_grpo
    from arenaforge.tasks.train.params import EnvSelection, EpisodeParams, GrpoParams, VerlParams

    with flag_errors("train grpo", ENV_FLAGS):
        params = GrpoParams(
            **_common(ctx), engine=engine, model_path=model_path, policy_url=policy_url, served_model=served_model,
            experiment=experiment, out_dir=out_dir, steps=steps, batch_groups=batch_groups, group_size=group_size,
            delta=delta, roc=roc, max_groups_per_step=max_groups_per_step, curriculum=curriculum, lr=lr,
            checkpoint_every=checkpoint_every, old_logprobs=old_logprobs, seed=seed, skip_forced_tokens=skip_forced_tokens,
            precision=precision, lora_rank=lora_rank,
            warmstart_steps=warmstart_steps, warmstart_lr=warmstart_lr, warmstart_batch_size=warmstart_batch_size,
            warmstart_trajectories=warmstart_trajectories,
            warmstart_copy_variants=warmstart_copy_variants,
            evaluate=evaluate, eval_limit=eval_limit,
            envs=EnvSelection(limit=env_limit, split=split, test_share=test_share),
            episode=EpisodeParams(max_turns=max_turns, max_length=max_length, max_tokens_per_turn=max_tokens_per_turn,
                                  temperature=temperature, ground_arguments=ground_arguments),
            verl=VerlParams(ray_address=ray_address, spec_only=verl_spec_only),
        )
    result = run_flow(train_grpo(params))
    _echo(result)
    print_eval_table(result.get("eval") or {})


@app.command("warmstart")
def warmstart_cmd(
    ctx: typer.Context,
    out: str = typer.Option(..., "--out", help="Directory to write warmstart.jsonl to."),
    env_limit: int = typer.Option(None, help="Use at most this many environments."),
    split: str = typer.Option("train", help="Environment split: all, train or eval."),
    copy_variants: int = typer.Option(0, help="Copy-forced variants (fresh values, shuffled tools) per replay."),
    seed: int = typer.Option(0, help="Seed of the copy-forced variants."),
) -> None:
    """Warm-start SFT data: gold calls replayed in the sandbox, as OpenAI messages+tools JSONL."""
    from arenaforge.flows.train_flows import warmstart
    from arenaforge.tasks.train.params import EnvSelection, WarmstartParams

    with flag_errors("train warmstart", ENV_FLAGS):
        params = WarmstartParams(**_common(ctx), out=out, envs=EnvSelection(limit=env_limit, split=split),
                                 copy_variants=copy_variants, seed=seed)
    _echo(run_flow(warmstart(params)))


@app.command("sft")
def sft_cmd(
    ctx: typer.Context,
    data: str = typer.Option(..., help="SFT export (OpenAI messages+tools JSONL)."),
    model_path: str = typer.Option(None, help="Model dir or checkpoint, or arena-small (default), tiny, smollm2-135m."),
    experiment: str = typer.Option("sft", help="Experiment name (checkpoint directory; resumes when it exists)."),
    out_dir: str = typer.Option(None, help="Parent directory of experiments (default: the config's out_dir + /train)."),
    epochs: int = typer.Option(1, help="Passes over the data."),
    max_steps: int = typer.Option(None, help="Stop after this many steps (default: all epochs)."),
    batch_size: int = typer.Option(4, help="Examples per step."),
    lr: float = typer.Option(1e-5, help="Learning rate (constant after warm-up)."),
    max_length: int = typer.Option(4096, help="Tokens per example (longer ones are cut)."),
    checkpoint_every: int = typer.Option(50, help="Save weights every k steps."),
    precision: str = typer.Option("fp32", help="fp32, or bf16: mixed precision (bf16 autocast, fp32 weights and "
                                  "optimizer), 1.2-2.2x faster for SmolLM2-135M on a CPU with AMX."),
    lora_rank: int = typer.Option(0, help="0: train every weight; r > 0: LoRA adapters of rank r on every linear "
                                  "layer (needs peft: the lora extra); checkpoints hold the merged model."),
) -> None:
    """Supervised fine-tuning with loss on assistant tokens only."""
    from arenaforge.flows.train_flows import train_sft
    from arenaforge.tasks.train.params import SftParams

    if not Path(data).is_file():  # before a Prefect server starts for nothing
        raise InputError(f"train sft: --data {data}: no such file")
    with flag_errors("train sft"):
        params = SftParams(**_common(ctx), data=data, model_path=model_path, experiment=experiment, out_dir=out_dir,
                           epochs=epochs, max_steps=max_steps, batch_size=batch_size, lr=lr, max_length=max_length,
                           checkpoint_every=checkpoint_every, precision=precision, lora_rank=lora_rank)
    _echo(train_sft(params))
