#!/usr/bin/env bash
# Make sure a Docker engine answers, for the sandbox backend and its tests.
#   - installs docker.io and debootstrap from apt when missing (we run as root on CI machines)
#   - starts dockerd the way these machines allow (no bridge, no iptables: containers get network "none")
#     when no engine answers, and waits for `docker info` with a deadline
# Idempotent: with an engine already up it only checks. Env: DOCKER_WAIT_S (default 60), DOCKERD_LOG.
set -euo pipefail

DEADLINE_S="${DOCKER_WAIT_S:-60}"
LOG="${DOCKERD_LOG:-/tmp/arenaforge-dockerd.log}"
SUDO=""
if [ "$(id -u)" != "0" ]; then SUDO="sudo"; fi

engine_answers() { timeout 10 docker info >/dev/null 2>&1; }

missing=()
command -v docker >/dev/null 2>&1 || missing+=(docker.io)
command -v dockerd >/dev/null 2>&1 || missing+=(docker.io)
command -v debootstrap >/dev/null 2>&1 || missing+=(debootstrap)
if [ "${#missing[@]}" -gt 0 ]; then
  echo "start-docker: installing ${missing[*]}" >&2
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends $(printf '%s\n' "${missing[@]}" | sort -u)
fi

if engine_answers; then
  echo "start-docker: engine already answers" >&2
  exit 0
fi

echo "start-docker: starting dockerd (log: $LOG)" >&2
$SUDO sh -c "nohup dockerd --bridge=none --iptables=false >'$LOG' 2>&1 &"

end=$(( $(date +%s) + DEADLINE_S ))
until engine_answers; do
  if [ "$(date +%s)" -ge "$end" ]; then
    echo "start-docker: no engine answered within ${DEADLINE_S}s; last log lines:" >&2
    tail -n 20 "$LOG" >&2 || true
    exit 1
  fi
  sleep 0.5
done
echo "start-docker: engine is up" >&2
