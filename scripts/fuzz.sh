#!/usr/bin/env bash
# `make fuzz`: every fuzz target of the tree, found rather than listed, so none is
# forgotten. `make test` runs the cheap ones through this script too, with
# FUZZ_COSTLY=0.
#
#   FUZZTIME=N     how much each target runs: an execution count such as 20000x (the
#                  default) or a duration such as 30s. A count is the default because
#                  Go 1.26's fuzz coordinator can fail a duration-bounded run with a bare
#                  "context deadline exceeded" at the deadline on a loaded machine
#                  (go.dev/issue/75804, fixed in 1.27).
#   FUZZ_COSTLY=0  leaves out the costly targets: those whose doc comment says how many
#                  executions they get by default, in a "// fuzztime: Nx" line (a whole
#                  server behind each execution). FuzzWholeStack is one: its
#                  instrumented build alone (every package of the stack, Kubernetes'
#                  clients included, compiled again with coverage) took 4m46s of a
#                  fresh machine's first `make test`, for 8 s of fuzzing. Its seed corpus
#                  still runs in every `go test`.
set -euo pipefail
cd "$(dirname "$0")/.."

fuzztime="${FUZZTIME:-20000x}"
costly="${FUZZ_COSTLY:-1}"
echo "== fuzz ($fuzztime each$([ "$costly" = 0 ] && echo ', the costly targets left to make fuzz'))"
grep -rlE '^func Fuzz[A-Za-z0-9_]+\(' --include='*_test.go' . | sort | while read -r file; do
  pkg="./$(dirname "${file#./}")"
  grep -oE '^func (Fuzz[A-Za-z0-9_]+)\(' "$file" | sed -E 's/^func (Fuzz[A-Za-z0-9_]+)\(/\1/' | while read -r target; do
    t="$fuzztime"
    own=$(grep -B12 "^func ${target}(" "$file" | grep -oE '^// fuzztime: [0-9]+x$' | tail -n 1 | cut -d' ' -f3 || true)
    if [ -n "$own" ]; then
      if [ "$costly" = 0 ]; then
        echo "-- $pkg $target: costly (its seed corpus ran with the tests; make fuzz runs it)"
        continue
      fi
      # A costly target gets its own count unless FUZZTIME was set.
      if [ -z "${FUZZTIME:-}" ]; then t="$own"; fi
    fi
    echo "-- $pkg $target ($t)"
    go test -run '^$' -fuzz "^${target}\$" -fuzztime "$t" "$pkg"
  done
done
