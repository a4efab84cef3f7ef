#!/usr/bin/env bash
# Create .venv-verl: arenaforge[verl] as a verl 0.9.1 user installs it, for the tests that run our
# exports through verl's own code (tests/tasks/test_verl.py). A separate venv because verl 0.9.1
# needs transformers < 5.11, which the main pin set (constraints.txt) does not hold; pinned by
# constraints-verl.txt. Safe to re-run: does nothing when everything is already installed.
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null 2>&1 || PY=python3
if [ ! -x .venv-verl/bin/python ]; then
  "$PY" -m venv .venv-verl
fi
.venv-verl/bin/python -c "import torch" 2>/dev/null || .venv-verl/bin/pip install -q "torch==2.13.0"
# verl and its stack first, then arenaforge: resolving both at once sends pip backtracking for many minutes.
.venv-verl/bin/python -c "import verl" 2>/dev/null \
  || .venv-verl/bin/pip install -q -c constraints-verl.txt "verl==0.9.1" "ray[default]" cachetools fastapi uvicorn
.venv-verl/bin/pip install -q -c constraints-verl.txt -e ".[verl]"
echo "setup-verl: .venv-verl ready (verl $(.venv-verl/bin/python -c 'import verl; print(verl.__version__)'))"
