#!/usr/bin/env bash
# System packages the full test suite needs: Docker engine + debootstrap (sandbox image),
# Chromium (UI browser test), PostgreSQL (Prefect server on Postgres). Installs only what is missing. Needs root (CI runs as root).
set -euo pipefail
need=()
command -v dockerd >/dev/null 2>&1 || need+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || need+=(debootstrap)
[ -x /usr/bin/chromium ] || need+=(chromium)
ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || need+=(postgresql)  # serve's Postgres-by-URL test
if [ ${#need[@]} -gt 0 ]; then
  echo "system-deps: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
fi
echo "system-deps: ok"
