#!/usr/bin/env bash
# `make test`: the whole suite against real Postgres, Redis and a 3-node Redis Cluster.
# Servers come from SPACE_TEST_DATABASE_URL, SPACE_TEST_REDIS_ADDR and
# SPACE_TEST_REDIS_CLUSTER_ADDRS; when those are unset this starts the local services
# (scripts/services.sh up) and uses them.
#
#   FUZZTIME=N     how much each cheap fuzz target runs after the tests: an execution
#                  count such as 20000x (the default, a few seconds each) or a duration
#                  such as 30s; 0 skips the fuzzing (the seed corpora still run as
#                  tests). The costly targets run in `make fuzz` (scripts/fuzz.sh).
#   TESTFLAGS=...  extra flags for go test, e.g. TESTFLAGS='-run TestAdmit -v' (the
#                  image test, the bench module's test and the fuzzing are then left
#                  out, as they ignore them)
set -euo pipefail
cd "$(dirname "$0")/.."

# The etcd and kube-apiserver of the Kubernetes tests (internal/testenv/kubeenv) are
# built from their Go modules once per machine, cached under
# ${XDG_CACHE_HOME:-$HOME/.cache}/space/kube: about 15 minutes of a 2-core machine's
# CPU the first time, nothing after; then the fleet tests' kube-scheduler and kwok,
# about 4 CPU-minutes more (most of kube-scheduler's packages are kube-apiserver's). The build starts first, in the background, so
# that it overlaps the services' start, the lint and the compilation of the suite; a
# test that needs the servers waits for it (a file lock), and builds them itself
# should it have failed. It runs at the lowest CPU priority (nice 19): the tests whose
# background loops run against a clock get the cores when they want them, and the
# build takes what is left, which on a first run is most of it (the suite waits on
# Postgres, Redis and its own timers far more than it computes). With TESTFLAGS the
# tests build them on demand instead, when one of those selected needs them.
kube_pid=""
if [ -z "${TESTFLAGS:-}" ]; then
  kube_log=$(mktemp)
  nice -n 19 go run ./internal/testenv/kubebin/cmd/kube-binaries >"$kube_log" 2>&1 &
  kube_pid=$!
fi

if [ -z "${SPACE_TEST_DATABASE_URL:-}" ] || [ -z "${SPACE_TEST_REDIS_ADDR:-}" ] || [ -z "${SPACE_TEST_REDIS_CLUSTER_ADDRS:-}" ]; then
  scripts/services.sh up
  eval "$(scripts/services.sh env)"
fi
export SPACE_TEST_DATABASE_URL SPACE_TEST_REDIS_ADDR SPACE_TEST_REDIS_CLUSTER_ADDRS

echo "== lint"
scripts/lint.sh

echo "== go test -race"
# 30m a package: the packages that need the kube binaries wait for their first build
# (15 minutes of a loaded 2-core machine) before their tests start.
# shellcheck disable=SC2086
go test -race -count=1 -timeout 30m ${TESTFLAGS:-} ./...
if [ -n "$kube_pid" ]; then
  # The suite passed, so the servers were there; this says what the build printed.
  wait "$kube_pid" || echo "the background build of the kube binaries failed (the tests built them):" >&2
  echo "-- kube binaries"
  cat "$kube_log"
  rm -f "$kube_log"
fi

if [ -z "${TESTFLAGS:-}" ]; then
  echo "== image (tools/image: builds the image into a temporary directory and checks it)"
  # A module of its own, so ./... above does not reach it. No -race: the test's cost is
  # compiling space-api for linux, which the race detector would not make any safer.
  (cd tools/image && go test -count=1 -timeout 20m ./...)
  echo "== bench (bench/: every scenario of \`make bench\` once, tiny sizes, so the driver cannot rot)"
  # A module of its own too. No -race: TestSmoke's cost is building space-api and
  # driving it, and the code it checks is a driver that runs each path once. wrk is the
  # load generator of its refusal comparison, valgrind counts Redis's instructions for
  # its script cost (bench/tools.sh installs both as root, or says how).
  bench/tools.sh
  (cd bench && go test -count=1 -timeout 20m ./...)
  echo "== openapi client (tools/openapi: generates a Go client from api/openapi.yaml and compiles it)"
  # A module of its own too, so that oapi-codegen stays out of space-api's go.mod (lint.sh
  # vets it and checks it tidy).
  (cd tools/openapi && go test -count=1 ./...)
fi

if [ "${FUZZTIME:-}" != "0" ] && [ -z "${TESTFLAGS:-}" ]; then
  # The cheap fuzz targets (scripts/fuzz.sh; make fuzz runs the costly ones too).
  FUZZ_COSTLY=0 scripts/fuzz.sh
fi
echo "== ok"
