"""`arenaforge envs`: Synthesize verified, executable RL environments (RL track)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer

from arenaforge.flows.context import run_flow, state, synthesis_context
from arenaforge.flows.display import console, print_rows
from arenaforge.flows.envs_params import EnvsParams
from arenaforge.flows.options import Grouped, ParamsOptions
from arenaforge.schemas.errors import InputError
from arenaforge.tracks.envs.distractors import BANDS
from arenaforge.tracks.envs.pipeline import EnvsSpec

app = typer.Typer(help="Synthesize verified, executable RL environments (RL track).", no_args_is_help=True)


SYNTH_OPTIONS = ParamsOptions(
    EnvsSpec, grouped={"distractors": Grouped("distractors_", BANDS, "Distractors per band: high,medium,low (or "
                                                                      "high=1,medium=2,low=0).")},
    flags={"sources": ("--source", "-s"), "n": ("--n", "-n"), "structures": "--structure",
           "seed_questions": "--seed-question", "qs_threshold": "--threshold", "qs_percentile": "--percentile",
           "merge_across": "--merge-across/--merge-within"})
@app.command("synth")
@SYNTH_OPTIONS.command("envs synth", synthesis_context, into=EnvsParams)
def synth(ctx: typer.Context, params: EnvsParams) -> None:
    """Run the `envs` flow: QA synthesis + verification, tools verified in the sandbox, merging, distractors."""
    from arenaforge.flows.envs_flows import envs

    st = state(ctx)
    from arenaforge.flows.outcome import run_and_report

    run_and_report("envs", st.warehouse(), lambda: run_flow(envs(params)))


def _load_env(wh: Any, env_id: str) -> Any:
    from arenaforge.schemas.models import Environment

    env = wh.get(Environment, env_id)
    if env is None:
        matches = wh.load(Environment, where="id LIKE ? OR (record->>'name') = ?", params=[f"{env_id}%", env_id], limit=2)
        if len(matches) != 1:
            raise InputError(f"no environment {env_id!r} (see `arenaforge db show environments`)")
        env = matches[0]
    return env


@app.command("show")
def show(ctx: typer.Context, env_id: str = typer.Argument(..., help="Environment id (or a unique prefix, or its name)."),
         code: bool = typer.Option(True, "--code/--no-code", help="Print the tool code.")) -> None:
    """Print one environment: tools, code, QA graph, gold calls and verification."""
    from arenaforge.schemas.models import QAInstance
    from arenaforge.tracks.envs.evidence import kind_of

    wh = state(ctx).warehouse()
    env = _load_env(wh, env_id)
    console.rule(f"[bold]{env.name}[/bold]  {env.id}")
    console.print(f"[bold]question:[/bold] {env.question}")
    print_rows(["tool", "distractor", "description", "parameters"],
               [(t.name, t.name in env.distractors, t.description, ", ".join(t.parameters.get("properties", {})))
                for t in env.tools], title="tools", width=70)
    qa = wh.get(QAInstance, env.qa_id) if env.qa_id else None
    if qa is not None:
        console.print(f"[bold]QA graph[/bold] ({qa.structure}, {qa.hop_level} hops): {qa.main_question} -> {qa.main_answer}")
        print_rows(["#", "depends on", "question", "answer", "tool", "evidence"],
                   [(s.index, ",".join(map(str, s.depends_on)) or "-", s.question, s.answer, s.needs_tool,
                     kind_of(s.evidence).summary(s.evidence) if s.evidence else "")
                    for s in qa.sub_qas], width=60)
    print_rows(["sub-QA", "call", "gold answer"],
               [(c.sub_qa, f"{c.tool}({json.dumps(c.arguments)})", c.answer) for c in env.calls], title="gold calls", width=70)
    if env.verification is not None:
        v = env.verification
        print_rows(["check", "passed"], sorted(v.checks.items()), title=f"verification: {'passed' if v.passed else 'FAILED'}")
        for line in v.details:
            console.print(f"  {line}")
    if code:
        console.rule("code")
        console.print(env.code, markup=False, highlight=False)


@app.command("export")
def export(
    ctx: typer.Context,
    out: str = typer.Option(None, "--out", "-o", help="Output directory (default: <out_dir>/envs)."),
    fmt: list[str] = typer.Option(["verl", "harbor", "jsonl"], "--format", "-f", help="verl, harbor, jsonl, openenv, verifiers (repeatable)."),
    where: str = typer.Option("", "--where", "-w", help="SQL filter over the environments table."),
    limit: int = typer.Option(None, help="At most this many environments."),
    image: str = typer.Option(None, help="Base image of the Harbor task containers (default python:3.11-slim; "
                                         "any image with python3)."),
) -> None:
    """Export verified environments: verl 0.9.1 files (train/val Parquet + configs), Harbor task dirs, JSON-lines."""
    from arenaforge.tracks.envs.export import BASE_IMAGE, export_environments, verified_environments
    from arenaforge.tracks.train.splits import held_out_ids
    from arenaforge.tracks.train.verl.dataset import write_verl

    st = state(ctx)
    envs = verified_environments(st.warehouse(), where, limit)
    root = Path(out or Path(st.config.out_dir) / "envs")
    held_out = held_out_ids(st.warehouse())  # verl's val is the test split that `eval` scores
    typer.echo(json.dumps(export_environments(envs, root, fmt, image or BASE_IMAGE, held_out, write_verl), indent=2))


@app.command("serve")
def serve(
    ctx: typer.Context,
    env_id: str = typer.Argument(..., help="Environment id (or a unique prefix, or its name)."),
    transport: str = typer.Option("stdio", "--transport", "-t", help="stdio, or http (streamable HTTP at /mcp)."),
    host: str = typer.Option("127.0.0.1", help="http: address to listen on."),
    port: int = typer.Option(8765, help="http: port to listen on."),
    jsonl: str = typer.Option(None, "--jsonl", help="Read the environment from an exported environments.jsonl "
                                                    "instead of the warehouse."),
) -> None:
    """Serve one environment's tools over MCP: one sandbox session per MCP session; the episode's F1 as a resource."""
    import asyncio

    from arenaforge.tracks.envs.mcp_server import serve_http, serve_stdio

    if transport not in ("stdio", "http"):
        raise InputError(f"unknown transport {transport!r}; use stdio or http")
    st = state(ctx)
    env = _env_from_jsonl(jsonl, env_id) if jsonl else _load_env(st.warehouse(), env_id)
    if transport == "stdio":
        asyncio.run(serve_stdio(env, st.config.sandbox))
    else:
        asyncio.run(serve_http(env, st.config.sandbox, host, port))


def _env_from_jsonl(path: str, env_id: str) -> Any:
    from arenaforge.schemas.models import Environment

    if not Path(path).is_file():
        raise InputError(f"{path}: no such file (an `arenaforge envs export` writes environments.jsonl)")
    found = [e for e in (Environment.model_validate_json(line) for line in Path(path).read_text().splitlines() if line)
             if e.id == env_id or e.name == env_id or e.id.startswith(env_id)]
    if len(found) != 1:
        raise InputError(f"{path}: {len(found)} environments match {env_id!r}; give an id, a unique prefix or a name")
    return found[0]


import_app = typer.Typer(help="Import others' environments into the warehouse, each with its own native check.",
                         no_args_is_help=True)
# The import commands run their flow's body (`.fn`: the same run record and rows) without a Prefect server: an import
# takes seconds, and a bad input stays one line on stderr. `arenaforge serve` deploys the flows themselves.
app.add_typer(import_app, name="import")


def _json_option(text: str | None, option: str) -> Any:
    if text is None:
        return None
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise InputError(f"{option} is not JSON: {err}") from None


@import_app.command("python")
def import_python_cmd(
    ctx: typer.Context,
    sources: list[str] = typer.Argument(..., help="PATH or PATH:Class of your tool code (several: each its own namespace)."),
    tools: str = typer.Option(None, "--tools", help="OpenAI tool documents (JSON); default: derived from the typed "
                                                   "signatures and docstrings."),
    initial_state: str = typer.Option(None, "--state", help="Initial state (JSON file; keyed by Class/stem when several)."),
    calls: str = typer.Option(None, "--calls", help="Gold calls (JSON list of {tool, arguments}): replayed, and the "
                                                    "final state's hash kept as the native check."),
    init_args: str = typer.Option(None, "--init-args", help="Constructor keyword arguments (JSON object)."),
    load_args: str = typer.Option(None, "--load-args", help="Extra loader keyword arguments (JSON object)."),
    name: str = typer.Option(None, "--name", help="Environment name (default python-<names>)."),
    suite: str = typer.Option("python", "--suite", help="Suite name, for `arenaforge eval --suite`."),
    question: str = typer.Option(None, "--question", help="The task prompt the agent is given."),
    requirement: list[str] = typer.Option([], "--requirement", help="A package the code imports, pinned "
                                          "(mpmath==1.3.0; repeatable): installed from local wheels (docs/ENVS.md)."),
    backend: str = typer.Option(None, "--backend", help="auto, docker or process (overrides sandbox.backend)."),
) -> None:
    """Import your own Python module or class as a warehouse environment (lineage: the files and their SHA-256)."""
    from arenaforge.flows.envs_import_flows import PythonImportParams, import_python

    st = state(ctx)
    state_value = _json_option(Path(initial_state).read_text(encoding="utf-8"), "--state") if initial_state else None
    if initial_state and not isinstance(state_value, dict):
        raise InputError(f"{initial_state}: the initial state must be a JSON object")
    params = PythonImportParams(
        sources=sources, tools=tools, initial_state=state_value, calls=calls,
        init_args=_json_option(init_args, "--init-args"), load_args=_json_option(load_args, "--load-args"), name=name,
        suite=suite, question=question, requirements=requirement, backend=backend, config_path=st.config_path,
        overrides=st.overrides)
    typer.echo(json.dumps(run_flow(import_python.fn(params)), indent=2))


@import_app.command("bfcl")
def import_bfcl_cmd(
    ctx: typer.Context,
    category: list[str] = typer.Option(["base", "miss_param", "miss_func", "long_context"], "--category",
                                       help="BFCL multi-turn category (repeatable)."),
    data: str = typer.Option(None, "--data", help="An unpacked bfcl_eval package (default: the installed bfcl-eval)."),
    limit: int = typer.Option(None, "--limit", help="At most this many tasks per category."),
    backend: str = typer.Option(None, "--backend", help="auto, docker or process (overrides sandbox.backend)."),
) -> None:
    """Import BFCL multi-turn tasks as environments (suite bfcl_multi_turn_<category>), each replayed in the sandbox
    to keep BFCL's own checks (per-turn state and responses) beside our F1; tasks that cannot run are rejection rows."""
    from arenaforge.flows.envs_import_flows import BfclImportParams, import_bfcl

    st = state(ctx)
    result = run_flow(import_bfcl.fn(BfclImportParams(categories=category, data=data, limit=limit, backend=backend,
                                                   config_path=st.config_path, overrides=st.overrides)))
    typer.echo(json.dumps({k: v for k, v in result.items() if k != "run_id"}, indent=2))
    if not result["imported"]:
        raise typer.Exit(2)


@import_app.command("harbor")
def import_harbor_cmd(
    ctx: typer.Context,
    root: str = typer.Argument(..., help="A Harbor task directory, or a folder of them."),
    suite: str = typer.Option("harbor", "--suite", help="Suite name of others' tasks, for `arenaforge eval --suite`."),
    build_arg: list[str] = typer.Option(None, "--build-arg", help="KEY=VALUE for the tasks' docker builds, e.g. "
                                                                  "BASE_IMAGE=<a local image> (repeatable)."),
) -> None:
    """Import Harbor tasks: ours (from `envs export`) come back as the same environment; others' become container
    tasks scored by their own tests/test.sh beside our F1, with solution/solve.sh as gold. Tasks that cannot be
    built or solved offline are rejection rows (one line each on stderr)."""
    from arenaforge.flows.envs_import_flows import HarborImportParams, import_harbor

    st = state(ctx)
    args = dict(item.partition("=")[::2] for item in build_arg or [])
    if any(not key for key in args) or any("=" not in item for item in build_arg or []):
        raise InputError(f"--build-arg takes KEY=VALUE, not {build_arg}")
    result = run_flow(import_harbor.fn(HarborImportParams(root=root, suite=suite, build_args=args,
                                                       config_path=st.config_path, overrides=st.overrides)))
    for line in result.pop("rejections"):
        typer.echo(f"rejected {line}", err=True)
    typer.echo(json.dumps(result, indent=2))
    if not result["imported"]:
        raise typer.Exit(2)
