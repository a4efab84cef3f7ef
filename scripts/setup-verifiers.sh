#!/usr/bin/env bash
# Install PyPI verifiers once per machine, for the tests that load our verifiers exports with verifiers' own code and
# score episodes with its own rollout and rubric (tests/tasks/envs/test_verifiers.py): $ARENAFORGE_CACHE/verifiers/venv
# (default ~/.cache/arenaforge), a venv of its own (verifiers pins an mcp, openai and pydantic of its own), with uv
# beside it: verifiers' built-in chat harness runs as a PEP 723 script that `uv sync --script` installs (from PyPI, on
# first use, into uv's cache). Put the venv's bin/ on PATH when running vf-eval so that uv is the one found.
# Safe to re-run: does nothing when it is in place. Prints VERIFIERS_PYTHON=... on its last line.
set -euo pipefail

VERIFIERS_VERSION=0.4.0
UV_VERSION=0.13.9
CACHE="${ARENAFORGE_CACHE:-$HOME/.cache/arenaforge}/verifiers"
VENV="$CACHE/venv"

mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9

if [ "$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("verifiers"), m.version("uv"))' 2>/dev/null)" != "$VERIFIERS_VERSION $UV_VERSION" ]; then
  PY=${PYTHON:-python3.11}
  command -v "$PY" >/dev/null 2>&1 || PY=python3
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q "verifiers==$VERIFIERS_VERSION" "uv==$UV_VERSION"
fi
echo "setup-verifiers: verifiers $VERIFIERS_VERSION" >&2
echo "VERIFIERS_PYTHON=$VENV/bin/python"
