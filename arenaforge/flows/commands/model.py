"""`arenaforge model`: a local OpenAI-compatible endpoint that enforces structure (llama.cpp's llama-server)."""

from __future__ import annotations

import json
import signal
import threading

import typer

from arenaforge.services.models.local_engine import BUNDLED, DEFAULT_MODEL, EngineSettings, LocalEngine, health

app = typer.Typer(help="Serve a local model (llama-server over a GGUF) and check endpoints.", no_args_is_help=True)


@app.command()
def serve(
    model: str = typer.Option(DEFAULT_MODEL, "--model", show_default=True,
                              help=f"A bundled model ({', '.join(BUNDLED)}) or the path of a GGUF file."),
    port: int = typer.Option(8080, "--port", show_default=True, help="Loopback port to listen on."),
    threads: int = typer.Option(2, "--threads", show_default=True, help="CPU threads for decoding."),
    parallel: int = typer.Option(4, "--parallel", show_default=True,
                                 help="Requests served at once (llama-server slots; each gets ctx/parallel tokens)."),
    ctx_tokens: int = typer.Option(8192, "--ctx", show_default=True, help="Context tokens, shared by the slots."),
    log: str = typer.Option(None, "--log", help="Write the engine's log to this file (default: a temporary file)."),
) -> None:
    """Start llama-server on loopback, print the --base-url to use, serve until Ctrl-C or SIGTERM, then stop it."""
    from pathlib import Path

    settings = EngineSettings(model=model, port=port, threads=threads, parallel=parallel, ctx=ctx_tokens)
    engine = LocalEngine(settings, Path(log) if log else None)
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    url = engine.start()
    try:
        typer.echo(f"serving {engine.name} at {url} (log: {engine.log_path})")
        typer.echo(f"use: arenaforge --backend openai --base-url {url} --model {engine.name} envs synth")
        typer.echo("or in arenaforge.toml: [model] backend = \"openai\", base_url = "
                   f"\"{url}\", model = \"{engine.name}\"; Ctrl-C stops it")
        while not stop.wait(1.0):
            if engine.proc is None or engine.proc.poll() is not None:
                code = engine.proc.returncode if engine.proc else "?"
                typer.echo(f"error: llama-server exited with {code}: {engine._last_words(code)}", err=True)
                raise typer.Exit(3)
    finally:
        engine.stop()
    typer.echo("stopped")


@app.command("health")
def health_cmd(
    base_url: str = typer.Option("http://127.0.0.1:8080/v1", "--base-url", show_default=True,
                                 help="The endpoint to check (what `model serve` printed)."),
) -> None:
    """Print the endpoint's health as JSON; exit 3 when it does not answer ok."""
    try:
        answer = health(base_url)
    except (OSError, ValueError) as err:
        typer.echo(json.dumps({"base_url": base_url, "ok": False, "error": str(err)}))
        raise typer.Exit(3) from None
    ok = answer.get("status") == "ok"
    typer.echo(json.dumps({"base_url": base_url, "ok": ok, **answer}))
    if not ok:
        raise typer.Exit(3)
