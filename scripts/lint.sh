#!/usr/bin/env bash
# `make lint`: go vet and a gofmt check.
set -euo pipefail
cd "$(dirname "$0")/.."
go vet ./...
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './.services/*'))
if [ -n "$unformatted" ]; then
  echo "gofmt would change:" >&2
  echo "$unformatted" >&2
  exit 1
fi
