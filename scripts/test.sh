#!/usr/bin/env bash
# The whole test suite, as CI runs it: install, start the Docker engine, build the sandbox
# image, then pytest. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
export PREFECT_SERVER_ANALYTICS_ENABLED=false DO_NOT_TRACK=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
mkdir -p out/setup

# The one long compile (llama.cpp, ~5 min) needs no .venv: it starts first and runs beside everything below.
bash scripts/setup-llm.sh --build-only >out/setup/llm-build.log 2>&1 &
bash scripts/setup.sh  # .venv first: the steps below install into it or run its CLI

# The rest are independent, and on a bare machine mostly wait on downloads or on one compile: run them side by
# side, each logging to out/setup/NAME.log, and stop on the first that fails with its log on screen.
declare -A steps=(
  [verl]="bash scripts/setup-verl.sh"            # verl 0.9.1's own code checks our exports (tests/tasks/test_verl.py)
  [llm]="bash scripts/setup-llm.sh"              # the local model engine (llama-server, built once per machine) and SmolLM2
  [harbor]="bash scripts/setup-harbor.sh"        # the real Harbor CLI runs our Harbor exports (test_harbor_cli.py)
  [openenv]="bash scripts/setup-openenv.sh"      # OpenEnv's own client drives our OpenEnv servers (test_openenv.py)
  [verifiers]="bash scripts/setup-verifiers.sh"  # verifiers' own vf-eval scores our verifiers export (test_verifiers.py)
  [bfcl]="bash scripts/setup-bfcl.sh"            # bfcl-eval's own AST checker scores BFCL answers (test_bfcl.py)
  [sandbox]="bash scripts/sandbox-engine.sh"     # system packages, the Docker engine and the sandbox image
)
declare -A pids=()
for name in "${!steps[@]}"; do
  bash -c "${steps[$name]}" >"out/setup/$name.log" 2>&1 &
  pids[$name]=$!
done
failed=""
for name in "${!pids[@]}"; do
  if ! wait "${pids[$name]}"; then
    echo "test.sh: setup step '$name' failed; its log (out/setup/$name.log) ends:" >&2
    tail -n 40 "out/setup/$name.log" >&2
    failed="$failed $name"
  fi
done
[ -z "$failed" ] || exit 1
cat out/setup/sandbox.log

# Two workers, a test file at a time each (its module fixtures stay in one process): most tests wait on
# subprocesses, servers and sandboxes, so two keep both cores busy; tests/conftest.py gives each its own autogroup.
.venv/bin/python -m pytest -q -rs -n 2 --dist loadfile --durations=25 --junitxml=out/junit.xml "$@"
