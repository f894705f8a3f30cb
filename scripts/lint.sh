#!/usr/bin/env bash
# `make lint`: go vet, a gofmt check, and go.mod/go.sum kept tidy, for the product module,
# tools/image (the image builder), bench (the benchmark driver and its peers),
# tools/openapi (the client generated from api/openapi.yaml), and tools/etcd,
# tools/kube-apiserver, tools/kube-scheduler and tools/kwok (the servers and the fleet
# the tests build), each a module of its own.
set -euo pipefail
cd "$(dirname "$0")/.."
# The product module is vetted under -race, the configuration its tests build in
# (scripts/test.sh): vet compiles every dependency for its export data, and so the
# suite's compilation finds them built. A plain go vet compiled the whole module graph
# once more, without the race detector, for nothing but this check. No file of the
# module depends on the race build tag (checked here), so both see the same code.
if raced=$(git grep -l -E '^//go:build.*\brace\b' -- '*.go' 2>/dev/null) && [ -n "$raced" ]; then
  echo "these files depend on the race build tag, which go vet -race below would hide from a plain build's vet:" >&2
  echo "$raced" >&2
  exit 1
fi
go vet -race ./...
(cd tools/image && go vet ./...)
(cd bench && go vet ./...)
(cd tools/openapi && go vet ./...)
# shellcheck disable=SC2046 # the file list is split into arguments on purpose
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go' -not -path './.services/*'))
if [ -n "$unformatted" ]; then
  echo "gofmt would change:" >&2
  echo "$unformatted" >&2
  exit 1
fi
# `go mod tidy -diff` prints what tidy would change and fails without touching the files.
# tools/etcd, tools/kube-apiserver, tools/kube-scheduler and tools/kwok hold no Go code
# of their own (their tool directives name what the tests build), so only their
# tidiness is checked.
for mod in . tools/image bench tools/openapi tools/etcd tools/kube-apiserver tools/kube-scheduler tools/kwok; do
  if ! diff=$(cd "$mod" && go mod tidy -diff); then
    echo "go.mod/go.sum of $mod are not tidy; run (cd $mod && go mod tidy) and commit:" >&2
    echo "$diff" >&2
    exit 1
  fi
done
