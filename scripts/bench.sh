#!/usr/bin/env bash
# `make bench`: the benchmarks of docs/benchmarks.md, against the local services.
# Starts them (scripts/services.sh up, idempotent), makes sure wrk is installed
# (bench/tools.sh: wrk and valgrind), builds bin/space-api and the driver (bench/cmd/space-bench, in the
# bench module: a module of its own, so that the product's go.mod carries no load
# generator and no peer limiter), and runs the driver, which prints a plain-text
# summary and rewrites its section of docs/benchmarks.md. How long: docs/benchmarks.md, "Running it".
#
#   RUNS=5 make bench              runs per figure (default 3)
#   BENCH_ARGS='-only http' ...    more flags for space-bench (see: cd bench && go run ./cmd/space-bench -h)
set -euo pipefail
cd "$(dirname "$0")/.."

scripts/services.sh up
eval "$(scripts/services.sh env)"
export SPACE_DATABASE_URL SPACE_REDIS_ADDRS SPACE_TEST_DATABASE_URL SPACE_TEST_REDIS_ADDR SPACE_TEST_REDIS_CLUSTER_ADDRS
bench/tools.sh

go build -o bin/space-api ./cmd/space-api
(cd bench && go build -o ../bin/space-bench ./cmd/space-bench)
# shellcheck disable=SC2086
exec bin/space-bench -runs "${RUNS:-3}" -space-api bin/space-api ${BENCH_ARGS:-}
