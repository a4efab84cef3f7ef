#!/usr/bin/env bash
# Install BFCL's own evaluator (PyPI bfcl-eval) once per machine, so that BFCL single-turn answers are scored by its
# AST checker and decoded by its Hermes (<tool_call>) handler, not by a matcher of ours: $ARENAFORGE_CACHE/bfcl-eval/venv
# (default ~/.cache/arenaforge). A venv of its own: bfcl-eval pins numpy 1.26.4 and an openai, mistralai and cohere of its
# own. Its declared dependencies also pull sentence-transformers, faiss and torch for the agentic categories (1.9 GB,
# 17 minutes here); scripts/bfcl-requirements.txt lists what the checker's import chain needs (about 430 MB), with
# bfcl-eval's own pins, installed by uv. Safe to re-run: does nothing when it is in place. Prints BFCL_PYTHON=... last.
set -euo pipefail
cd "$(dirname "$0")/.."

BFCL_EVAL_VERSION=2026.3.23
UV_VERSION=0.13.9
CACHE="${ARENAFORGE_CACHE:-$HOME/.cache/arenaforge}/bfcl-eval"
VENV="$CACHE/venv"
CHECK='from bfcl_eval.eval_checker.eval_runner import get_handler; import importlib.metadata as m; print(m.version("bfcl-eval"))'

mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9

if [ "$("$VENV/bin/python" -c "$CHECK" 2>/dev/null)" != "$BFCL_EVAL_VERSION" ]; then
  PY=${PYTHON:-python3.11}
  command -v "$PY" >/dev/null 2>&1 || PY=python3
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q "uv==$UV_VERSION"
  "$VENV/bin/uv" pip install -q -p "$VENV/bin/python" --no-deps "bfcl-eval==$BFCL_EVAL_VERSION"
  "$VENV/bin/uv" pip install -q -p "$VENV/bin/python" -r scripts/bfcl-requirements.txt
  "$VENV/bin/python" -c "$CHECK" >/dev/null
fi
echo "setup-bfcl: bfcl-eval $BFCL_EVAL_VERSION" >&2
echo "BFCL_PYTHON=$VENV/bin/python"
