#!/usr/bin/env bash
# `make test-stress`: hunt flaky tests before CI finds them. Runs the packages where
# timing meets concurrency (the end-to-end tests, admission, the sandbox flow, the
# dispatcher) several times under the race detector while the whole suite runs beside
# them as load, the way a busy CI machine runs them. A failure here is a bug to fix by
# its cause, never by a retry or a looser assertion.
#
#   COUNT=5          runs of each stressed package (go test -count)
#   PKGS='./internal/app/ ...'   the stressed packages
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -z "${SPACE_TEST_DATABASE_URL:-}" ] || [ -z "${SPACE_TEST_REDIS_ADDR:-}" ] || [ -z "${SPACE_TEST_REDIS_CLUSTER_ADDRS:-}" ]; then
  scripts/services.sh up
  eval "$(scripts/services.sh env)"
fi
export SPACE_TEST_DATABASE_URL SPACE_TEST_REDIS_ADDR SPACE_TEST_REDIS_CLUSTER_ADDRS

count="${COUNT:-5}"
# The differential tests of admission against its reference model play ten times the
# configurations of make test (internal/admission, reference_test.go).
export SPACE_REFERENCE_SCALE="${SPACE_REFERENCE_SCALE:-10}"
pkgs="${PKGS:-./internal/app/ ./internal/admission/ ./internal/sandbox/ ./internal/dispatcher/}"

# The load: the whole suite, again and again, until the stressed runs are done.
# It runs in a process group of its own (setsid), which the exit trap kills whole: the
# loop's go test and every test binary under it go with it, not only the loop.
load_log=$(mktemp)
setsid bash -c 'while :; do go test -race -count=1 ./... >>"$1" 2>&1 || true; done' load "$load_log" &
load=$!
trap 'kill -- -"$load" 2>/dev/null || true; rm -f "$load_log"' EXIT

echo "== stress: go test -race -count=$count $pkgs (with the whole suite running beside it)"
# shellcheck disable=SC2086
go test -race -count="$count" -timeout 60m $pkgs
echo "== stress: ok"
