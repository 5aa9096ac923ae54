#!/usr/bin/env bash
# Start a Docker daemon for `make image` / `make e2e` when none answers (a machine without systemd, such as
# a CI runner or a VM with Debian's docker.io). No network is needed or granted: no iptables rules and no
# default bridge, so containers run with `--network none` (the image builds from the local base and wheels/).
# Usage: tools/docker-daemon.sh [LOG_FILE]   (root, or sudo; an already running daemon is left alone)
set -euo pipefail
log=${1:-/tmp/mtlflow-dockerd.log}
if docker info >/dev/null 2>&1; then
  exit 0
fi
command -v dockerd >/dev/null || {
  echo "dockerd not found: install Debian's docker.io (apt-get install -y docker.io debootstrap)" >&2; exit 1; }
sudo=$([ "$(id -u)" = 0 ] || echo sudo)
# setsid: the daemon outlives the make/pytest process that started it.
$sudo setsid dockerd --iptables=false --ip-masq=false --bridge=none >"$log" 2>&1 < /dev/null &
for _ in $(seq 60); do
  docker info >/dev/null 2>&1 && { echo "dockerd started (log: $log)"; exit 0; }
  sleep 1
done
echo "dockerd did not answer within 60 s; its log is $log" >&2
exit 1
