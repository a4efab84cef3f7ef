#!/usr/bin/env bash
# The whole test suite, as CI runs it: install, start the Docker engine, build the sandbox
# image, then pytest. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
export PREFECT_SERVER_ANALYTICS_ENABLED=false DO_NOT_TRACK=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1

bash scripts/setup.sh
bash scripts/setup-verl.sh  # verl 0.9.1's own code checks our exports (tests/tasks/test_verl.py)
bash scripts/setup-llm.sh   # the local model engine (llama-server, built once per machine) and SmolLM2's weights
bash scripts/setup-harbor.sh >/dev/null  # the real Harbor CLI runs our Harbor exports (tests/tasks/envs/test_harbor_cli.py)
bash scripts/setup-openenv.sh >/dev/null  # OpenEnv's own client drives our OpenEnv servers (tests/tasks/envs/test_openenv.py)
bash scripts/setup-verifiers.sh >/dev/null  # verifiers' own vf-eval scores our verifiers export (tests/tasks/envs/test_verifiers.py)
if [ "$(id -u)" = 0 ]; then
  bash scripts/system-deps.sh
fi
if [ -f scripts/start-docker.sh ]; then
  bash scripts/start-docker.sh || echo "test.sh: no Docker engine; docker tests will skip (fail in CI)"
fi
if .venv/bin/python -c "import docker; docker.from_env(timeout=5).ping()" 2>/dev/null; then
  .venv/bin/arenaforge sandbox build-image
fi
mkdir -p out
.venv/bin/python -m pytest -q -rs --durations=25 --junitxml=out/junit.xml "$@"
