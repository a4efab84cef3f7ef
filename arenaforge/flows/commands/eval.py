"""`arenaforge eval`: Evaluate a policy on held-out environments."""

from __future__ import annotations

import json

import typer

from arenaforge.flows.commands.train import ENV_FLAGS
from arenaforge.flows.context import flag_errors, run_flow, state

app = typer.Typer(help="Evaluate a policy on held-out environments, or on an imported suite (--suite).",
                  invoke_without_command=True)


@app.callback()
def suite_shortcut(
    ctx: typer.Context,
    suite: str = typer.Option(None, "--suite", help="`arenaforge eval --suite NAME` = `arenaforge eval run --suite NAME` with its defaults; "
                               "to set anything else (--model-path, ...) use `eval run`."),
) -> None:
    """Evaluate a policy on held-out environments, or on an imported suite (--suite)."""
    if ctx.invoked_subcommand is not None:
        return
    if not suite:
        typer.echo(ctx.get_help())
        raise typer.Exit(0)
    command = typer.main.get_command(app).commands["run"]  # type: ignore[attr-defined]
    defaults = {p.name: p.get_default(ctx) for p in command.params if p.name}
    run_cmd(ctx, **{**defaults, "suite": suite})


@app.command("run")
def run_cmd(
    ctx: typer.Context,
    engine: str = typer.Option("hf", help="Policy engine: hf, vllm or vllm-local."),
    model_path: str = typer.Option(None, help="Model dir or checkpoint, or arena-small (default), tiny, smollm2-135m."),
    policy_url: str = typer.Option(None, help="vllm: the `vllm serve` endpoint."),
    served_model: str = typer.Option(None, help="vllm: the model name the server serves (default: --model-path, "
                                     "else `policy`)."),
    samples: int = typer.Option(1, help="Episodes per environment."),
    env_limit: int = typer.Option(None, help="At most this many environments."),
    split: str = typer.Option(None, help="test (default; all with --suite), train or all."),
    max_turns: int = typer.Option(4, help="Assistant turns per episode (training's limit by default)."),
    max_length: int = typer.Option(384, help="Response tokens per episode."),
    max_tokens_per_turn: int = typer.Option(96, help="Tokens per assistant turn."),
    temperature: float = typer.Option(0.0, help="Sampling temperature; 0 = greedy."),
    concurrency: int = typer.Option(32, help="Episodes in flight at once."),
    seed: int = typer.Option(0, help="Sampling seed."),
    suite: str = typer.Option(None, "--suite", help="An imported suite (`arenaforge envs import`): its environments, "
                                                    "every split unless --split is given, scored with its native "
                                                    "metric beside our F1."),
    constrain_tool_calls: bool = typer.Option(True, help="hf engine: tool calls decoded to the environment's "
                                              "tool names and argument keys."),
    ground_arguments: bool = typer.Option(True, help="hf engine: a tool call's argument values are copied from "
                                          "the conversation (spans, numbers); --no-ground-arguments: any JSON."),
) -> None:
    """Mean F1, recall, precision, calls per task and failure reasons (and an imported suite's native metric);
    stored as an eval_runs row."""
    from arenaforge.flows.train_flows import evaluate
    from arenaforge.tasks.train.params import EnvSelection, EpisodeParams, EvalParams

    st = state(ctx)
    with flag_errors("eval run", ENV_FLAGS):
        params = EvalParams(
            config_path=st.config_path, db=st.overrides.get("warehouse.path"), engine=engine, model_path=model_path,
            policy_url=policy_url, served_model=served_model, samples=samples, concurrency=concurrency, seed=seed,
            envs=EnvSelection(limit=env_limit, split=split or ("all" if suite else "test"), suite=suite),
            episode=EpisodeParams(max_turns=max_turns, constrain_tool_calls=constrain_tool_calls,
                                  ground_arguments=ground_arguments,
                                  max_length=max_length, max_tokens_per_turn=max_tokens_per_turn,
                                  temperature=temperature),
        )
    result = run_flow(evaluate(params))
    typer.echo(json.dumps(result, indent=2, default=str))
    from arenaforge.flows.commands.train import print_eval_table

    print_eval_table({result.get("policy", "policy"): result},
                     title=f"suite {suite} (native {result.get('native')})" if suite else f"{params.envs.split} split")
