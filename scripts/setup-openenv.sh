#!/usr/bin/env bash
# Install PyPI openenv once per machine, for the tests that run our environments as OpenEnv servers and drive them
# with OpenEnv's own client (tests/tasks/envs/test_openenv.py): $ARENAFORGE_CACHE/openenv/venv (default
# ~/.cache/arenaforge), a venv of its own (openenv pulls gradio, fastmcp and a FastAPI newer than our pin).
# Safe to re-run: does nothing when it is in place. Prints OPENENV_PYTHON=... on its last line.
set -euo pipefail

OPENENV_VERSION=0.10.0
CACHE="${ARENAFORGE_CACHE:-$HOME/.cache/arenaforge}/openenv"
VENV="$CACHE/venv"

mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9

if [ "$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("openenv"))' 2>/dev/null)" != "$OPENENV_VERSION" ]; then
  PY=${PYTHON:-python3.11}
  command -v "$PY" >/dev/null 2>&1 || PY=python3
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q "openenv==$OPENENV_VERSION"
fi
echo "setup-openenv: openenv $OPENENV_VERSION" >&2
echo "OPENENV_PYTHON=$VENV/bin/python"
