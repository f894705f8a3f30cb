#!/usr/bin/env bash
# Makes sure the bench's outside tools are on PATH: wrk, the load generator of the
# refusal-ceiling comparison, and valgrind (with callgrind_control), which counts the
# instructions Redis runs for the script cost. As root it installs the Debian packages
# wrk and valgrind; otherwise it prints the command and fails. scripts/bench.sh runs it
# before `make bench`, and scripts/test.sh before the bench module's TestSmoke.
set -euo pipefail
missing=()
command -v wrk >/dev/null 2>&1 || missing+=(wrk)
{ command -v valgrind && command -v callgrind_control; } >/dev/null 2>&1 || missing+=(valgrind)
[ ${#missing[@]} -eq 0 ] && exit 0
if [ "$(id -u)" -ne 0 ]; then
  echo "bench: ${missing[*]} missing; install with: sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
echo "bench: installing ${missing[*]} from Debian packages" >&2
export DEBIAN_FRONTEND=noninteractive
# An install can fail only because the package lists are stale or absent (a fresh
# machine): refresh them once and retry.
if ! apt-get install -y -q "${missing[@]}" >/dev/null; then
  apt-get update -q >/dev/null
  apt-get install -y -q "${missing[@]}" >/dev/null
fi
