#!/usr/bin/env bash
# Makes sure wrk is on PATH: the load generator of the bench's refusal-ceiling
# comparison (the Debian package wrk). As root it installs the package; otherwise it
# prints the command and fails. scripts/bench.sh runs it before `make bench`, and
# scripts/test.sh before the bench module's TestSmoke.
set -euo pipefail
command -v wrk >/dev/null 2>&1 && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "bench: wrk is missing; install it with: sudo apt-get install -y wrk" >&2
  exit 1
fi
echo "bench: installing wrk from Debian packages" >&2
export DEBIAN_FRONTEND=noninteractive
# An install can fail only because the package lists are stale or absent (a fresh
# machine): refresh them once and retry.
if ! apt-get install -y -q wrk >/dev/null; then
  apt-get update -q >/dev/null
  apt-get install -y -q wrk >/dev/null
fi
