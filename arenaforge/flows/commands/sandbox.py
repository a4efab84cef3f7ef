"""`arenaforge sandbox`: Build the sandbox image and run tool code in the warm pool."""

from __future__ import annotations

import json
from typing import Any

import typer

from arenaforge.flows.context import state
from arenaforge.schemas.errors import InputError

app = typer.Typer(help="Build the sandbox image and run tool code in the warm pool.", no_args_is_help=True)


def _sandbox_cfg(ctx: typer.Context, backend: str | None, timeout: float | None) -> Any:
    cfg = state(ctx).config.sandbox
    update: dict[str, Any] = {}
    if backend:
        update["backend"] = backend
    if timeout:
        update["call_timeout_s"] = timeout
    update["pool_size"] = 1  # one call or one env: a single warm worker is enough
    return cfg.model_copy(update=update)


@app.command("build-image")
def build_image_cmd(
    ctx: typer.Context,
    force: bool = typer.Option(False, "--force", help="Rebuild even if an image with the recipe's tag exists."),
) -> None:
    """Build the sandbox image offline (debootstrap + docker import; the rootfs is cached) and print its reference."""
    import logging

    from arenaforge.environments.runtime.docker_backend import docker_client, docker_engine_answers
    from arenaforge.environments.runtime.image import build_image
    from arenaforge.schemas.errors import SandboxError

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if not docker_engine_answers():
        raise SandboxError("no Docker engine answers (run scripts/start-docker.sh)")
    client = docker_client(timeout=600)
    try:
        typer.echo(build_image(client, state(ctx).config.sandbox.image, force=force))
    finally:
        client.close()


@app.command()
def run(
    ctx: typer.Context,
    env_dir: str = typer.Argument(..., help="Environment package directory (env.json, tools.json, tools.py, ...)."),
    tool: str = typer.Argument(..., help="Tool to call."),
    args: str = typer.Option("{}", "--args", help="Arguments as a JSON object."),
    backend: str = typer.Option(None, "--backend", help="auto, docker or process (overrides sandbox.backend)."),
    timeout: float = typer.Option(None, "--timeout", help="Call timeout in seconds (overrides sandbox.call_timeout_s)."),
) -> None:
    """Call one tool in a fresh session of a packaged environment; print the observation as JSON."""
    import asyncio

    from arenaforge.environments.package import read_package
    from arenaforge.environments.runtime import create_pool, run_calls

    try:
        arguments = json.loads(args)
    except json.JSONDecodeError as err:
        raise InputError(f"--args is not JSON: {err}") from None
    if not isinstance(arguments, dict):
        raise InputError("--args must be a JSON object")
    env = read_package(env_dir)
    cfg = _sandbox_cfg(ctx, backend, timeout)

    async def go() -> Any:
        async with await create_pool(cfg) as pool:
            return (await run_calls(pool, env, [(tool, arguments)]))[0]

    obs = asyncio.run(go())
    typer.echo(obs.model_dump_json(indent=2))
    if obs.outcome not in ("ok", "no_output"):
        raise typer.Exit(1)


@app.command()
def check(
    ctx: typer.Context,
    env_dir: str = typer.Argument(..., help="Environment package directory."),
    backend: str = typer.Option(None, "--backend", help="auto, docker or process (overrides sandbox.backend)."),
) -> None:
    """Run the package's gold calls in a fresh session and report whether each returns its gold answer.

    A call passes when it ran and its output matches its gold answer; a call without a gold answer (or a blank one)
    also passes when the tool returned None (`no_output`). Errors, timeouts and limits fail."""
    import asyncio

    from arenaforge.environments.package import read_package
    from arenaforge.environments.reward import gold_call_passes
    from arenaforge.environments.runtime import create_pool, run_calls

    env = read_package(env_dir)
    if not env.calls:
        raise InputError(f"{env_dir}: the environment has no gold calls")
    cfg = _sandbox_cfg(ctx, backend, None)

    async def go() -> Any:
        async with await create_pool(cfg) as pool:
            return await run_calls(pool, env, env.calls)

    observations = asyncio.run(go())
    failed = 0
    for call, obs in zip(env.calls, observations, strict=True):
        passed = gold_call_passes(call.answer, obs.outcome, obs.output)
        failed += not passed
        typer.echo(json.dumps({"tool": call.tool, "outcome": obs.outcome, "gold": call.answer, "passed": passed,
                               "output": obs.output[:200], "error": (obs.error or "")[-400:] or None}))
    if failed:
        raise typer.Exit(1)


@app.command()
def status(
    ctx: typer.Context,
    backend: str = typer.Option(None, "--backend", help="auto, docker or process (overrides sandbox.backend)."),
) -> None:
    """Start a one-worker pool and print what its worker reports (backend, uid switching, network isolation)."""
    import asyncio

    from arenaforge.environments.runtime import create_pool, image_ref

    cfg = _sandbox_cfg(ctx, backend, None)

    async def go() -> Any:
        async with await create_pool(cfg) as pool:
            return {"pool": pool.info, "workers": await pool.ping(), "image": image_ref(cfg.image)}

    typer.echo(json.dumps(asyncio.run(go()), indent=2))
