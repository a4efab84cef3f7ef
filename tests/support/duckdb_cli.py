"""DuckDB CLIs from PyPI in venvs of their own, made once per machine (under ~/.cache/arenaforge, or
$ARENAFORGE_CACHE): what a user gets by following docs/WAREHOUSE.md, without the project's venv.

A venv is keyed by the commands that made it, so a changed pin in the docs makes a new one; `.done` marks a
finished one (a half-made venv from a killed run is made again)."""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

from tests.support.requirements import REPO

CACHE = Path(os.environ.get("ARENAFORGE_CACHE", Path.home() / ".cache" / "arenaforge"))
DOCS = REPO / "docs" / "WAREHOUSE.md"


def docs_blocks() -> tuple[str, str]:
    """The two bash blocks of WAREHOUSE.md's "A DuckDB CLI of your own": (make the venv, open the lake)."""
    section = DOCS.read_text().split("### A DuckDB CLI of your own", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", section, re.S)
    assert len(blocks) == 2, f"expected two bash blocks in {DOCS}'s section, found {len(blocks)}"
    return blocks[0].strip(), blocks[1].strip()


def venv_made_by(script: str, where: str = "~/duckdb-cli") -> Path:
    """Run `script` (bash) once per machine with `where` in it made a directory of the cache; that directory."""
    key = hashlib.sha256(script.encode()).hexdigest()[:12]
    venv = CACHE / f"duckdb-cli-{key}"
    CACHE.mkdir(parents=True, exist_ok=True)
    with open(CACHE / f"duckdb-cli-{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # two test processes on one machine make it once
        if not (venv / ".done").exists():
            shutil.rmtree(venv, ignore_errors=True)
            made = subprocess.run(["bash", "-e", "-c", script.replace(where, str(venv))],
                                  capture_output=True, text=True, timeout=1800)
            assert made.returncode == 0, f"{script}\n{made.stdout[-2000:]}\n{made.stderr[-3000:]}"
            (venv / ".done").write_text(script)
    return venv
