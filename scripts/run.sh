#!/usr/bin/env bash
# `make run`: space-api on this machine. Starts Postgres and Redis on loopback when
# SPACE_DATABASE_URL / SPACE_REDIS_ADDRS are unset, migrates, and serves with the demo
# flags file (per-client quotas and warm pool targets) and templates in deploy/demo/.
# Every SPACE_* variable already set in the environment wins over the demo values.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -z "${SPACE_DATABASE_URL:-}" ] || [ -z "${SPACE_REDIS_ADDRS:-}" ]; then
  scripts/services.sh up
  while IFS= read -r line; do
    name=${line#export }; name=${name%%=*}
    # only the variables the caller has not set
    [ -z "${!name:-}" ] && eval "$line"
  done < <(scripts/services.sh env)
fi

export SPACE_HTTP_ADDR="${SPACE_HTTP_ADDR:-127.0.0.1:8080}"
export SPACE_INTERNAL_HTTP_ADDR="${SPACE_INTERNAL_HTTP_ADDR:-127.0.0.1:8081}"
export SPACE_FLAGS_FILE="${SPACE_FLAGS_FILE:-$PWD/deploy/demo/flags.json}"
export SPACE_TEMPLATES_FILE="${SPACE_TEMPLATES_FILE:-$PWD/deploy/demo/templates.json}"
export SPACE_AUTH_MODE="${SPACE_AUTH_MODE:-trusted_header}"
export SPACE_TRUSTED_PROXY_CIDRS="${SPACE_TRUSTED_PROXY_CIDRS:-127.0.0.1/32}"
export SPACE_CLUSTER_ACTIVATION_ADMISSION_REFILL_RPS="${SPACE_CLUSTER_ACTIVATION_ADMISSION_REFILL_RPS:-20}"
export SPACE_CLUSTER_ACTIVATION_ADMISSION_BURST="${SPACE_CLUSTER_ACTIVATION_ADMISSION_BURST:-40}"
export SPACE_CLUSTER_ACTIVATION_ADMISSION_CLIENT_REFILL_RPS="${SPACE_CLUSTER_ACTIVATION_ADMISSION_CLIENT_REFILL_RPS:-1}"
export SPACE_CLUSTER_ACTIVATION_ADMISSION_CLIENT_BURST="${SPACE_CLUSTER_ACTIVATION_ADMISSION_CLIENT_BURST:-5}"

go build -o bin/space-api ./cmd/space-api
bin/space-api migrate

base="http://$SPACE_HTTP_ADDR"
base=${base/http:\/\/:/http:\/\/127.0.0.1:}
cat <<EOT

space-api on $base (internal listener: http://$SPACE_INTERNAL_HTTP_ADDR)
  flags:     $SPACE_FLAGS_FILE   (edit it: changes apply within 2s, no restart)
  templates: $SPACE_TEMPLATES_FILE
  substrate: ${SPACE_SUBSTRATE:-simulated} (in-process; no real sandboxes are started)

Try:
  curl -s $base/readyz
  curl -s $base/v1/limits -H 'X-Client-ID: acme'
  curl -s -XPOST $base/v1/sandboxes -H 'X-Client-ID: acme' -H 'Content-Type: application/json' \\
       -d '{"template":"python-3.12","cpu_millis":1000,"memory_mib":2048,"disk_gib":10}'
  curl -s http://$SPACE_INTERNAL_HTTP_ADDR/metrics | grep ^space_

EOT
exec bin/space-api serve
