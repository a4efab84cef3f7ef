#!/usr/bin/env bash
# Create .venv and install arenaforge with its pinned dependency set (constraints.txt).
# Safe to re-run: does nothing when everything is already installed.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
# torch first and alone: the pinned CPU wheel; any looser spec would pull GBs of CUDA packages.
.venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/pip install -q "torch==2.13.0"
.venv/bin/pip install -q -c constraints.txt -e ".[dev,ray]"
# duckdb 2.0.0 beside the environment, for one job only: reading single-file warehouses it wrote
# (storage version DuckDB 1.5 cannot open) in `arenaforge db migrate --from FILE`.
[ -d .venv/legacy-duckdb-2.0.0/duckdb ] || .venv/bin/pip install -q --no-deps --target .venv/legacy-duckdb-2.0.0 "duckdb==2.0.0"
# BFCL multi-turn's data and API classes (`arenaforge envs import bfcl`), without the package's declared dependencies:
# those pull sentence-transformers (torch with CUDA), numpy==1.26.4 and a dozen provider SDKs, none of which the
# multi-turn classes use (MathAPI's mpmath is already pinned). A 2 MB pure-Python wheel.
.venv/bin/python -c "import importlib.util as u; exit(u.find_spec('bfcl_eval') is None)" 2>/dev/null \
  || .venv/bin/pip install -q --no-deps "bfcl-eval==2026.3.23"
# The wheels environments declare (BFCL's MathAPI: mpmath), kept where the sandbox installs them from without a
# registry (docs/SANDBOX.md, declared dependencies); a failure here only means they are fetched at first use.
.venv/bin/pip download -q --only-binary=:all: --python-version 3.11 \
  -d "${ARENAFORGE_CACHE:-$HOME/.cache/arenaforge}/wheels" "mpmath==1.3.0" || true
echo "setup: .venv ready ($(.venv/bin/python --version))"
