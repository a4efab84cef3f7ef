"""`arenaforge rollout`: Run policy rollouts in environments with the F1 reward."""

from __future__ import annotations

import json

import typer

from arenaforge.flows.commands.train import ENV_FLAGS
from arenaforge.flows.context import flag_errors, run_flow, state

app = typer.Typer(help="Run policy rollouts in environments with the F1 reward.", no_args_is_help=True)


@app.command("run")
def run_cmd(
    ctx: typer.Context,
    engine: str = typer.Option("hf", help="Policy engine: hf, vllm or vllm-local."),
    model_path: str = typer.Option(None, help="Model dir or checkpoint, or arena-small (default), tiny, smollm2-135m."),
    policy_url: str = typer.Option(None, help="vllm: the `vllm serve` endpoint."),
    served_model: str = typer.Option(None, help="vllm: the model name the server serves (default: --model-path, "
                                     "else `policy`)."),
    samples: int = typer.Option(1, help="Episodes per environment."),
    env_limit: int = typer.Option(None, help="At most this many environments (default: all)."),
    split: str = typer.Option("all", help="Environment split: all, train or test."),
    max_turns: int = typer.Option(8, help="Assistant turns per episode."),
    max_length: int = typer.Option(2048, help="Response tokens per episode (model + tool)."),
    max_tokens_per_turn: int = typer.Option(256, help="Tokens per assistant turn."),
    temperature: float = typer.Option(1.0, help="Sampling temperature; 0 = greedy."),
    concurrency: int = typer.Option(32, help="Episodes in flight at once."),
    seed: int = typer.Option(0, help="Sampling seed."),
) -> None:
    """Roll out a policy on warehouse environments and store the rollouts."""
    from arenaforge.flows.train_flows import rollout
    from arenaforge.tasks.train.params import EnvSelection, EpisodeParams, RolloutParams

    st = state(ctx)
    with flag_errors("rollout run", ENV_FLAGS):
        params = RolloutParams(
            config_path=st.config_path, db=st.overrides.get("warehouse.path"), engine=engine, model_path=model_path,
            policy_url=policy_url, served_model=served_model, samples=samples, concurrency=concurrency, seed=seed,
            envs=EnvSelection(limit=env_limit, split=split),
            episode=EpisodeParams(max_turns=max_turns, max_length=max_length, max_tokens_per_turn=max_tokens_per_turn,
                                  temperature=temperature),
        )
    typer.echo(json.dumps(run_flow(rollout(params)), indent=2, default=str))
