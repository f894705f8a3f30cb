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
export SPACE_AUTH_MODE="${SPACE_AUTH_MODE:-api_key}"
export SPACE_FALLBACK_TIER="${SPACE_FALLBACK_TIER:-free}"
export SPACE_SIMULATED_COLD_START="${SPACE_SIMULATED_COLD_START:-300ms}"
export SPACE_CLUSTER_ACTIVATION_ADMISSION_REFILL_RPS="${SPACE_CLUSTER_ACTIVATION_ADMISSION_REFILL_RPS:-20}"
export SPACE_CLUSTER_ACTIVATION_ADMISSION_BURST="${SPACE_CLUSTER_ACTIVATION_ADMISSION_BURST:-40}"
export SPACE_CLUSTER_ACTIVATION_ADMISSION_CLIENT_REFILL_RPS="${SPACE_CLUSTER_ACTIVATION_ADMISSION_CLIENT_REFILL_RPS:-1}"
export SPACE_CLUSTER_ACTIVATION_ADMISSION_CLIENT_BURST="${SPACE_CLUSTER_ACTIVATION_ADMISSION_CLIENT_BURST:-5}"

go build -o bin/space-api ./cmd/space-api
bin/space-api migrate

auth=(-H "X-Client-ID: acme")
if [ "$SPACE_AUTH_MODE" = api_key ]; then
  # A demo key for acme, made once and kept under .services/ (git-ignored).
  keyfile=.services/demo-api-key
  if [ ! -s "$keyfile" ]; then
    mkdir -p .services
    bin/space-api keys create --client acme --name make-run | awk '/^key:/ {print $2}' >"$keyfile"
  fi
  auth=(-H "Authorization: Bearer $(cat "$keyfile")")
fi

base="http://$SPACE_HTTP_ADDR"
base=${base/http:\/\/:/http:\/\/127.0.0.1:}
cat <<EOT

space-api on $base (internal listener: http://$SPACE_INTERNAL_HTTP_ADDR)
  flags:     $SPACE_FLAGS_FILE   (edit it: changes apply within 2s, no restart)
  templates: $SPACE_TEMPLATES_FILE
  substrate: ${SPACE_SUBSTRATE:-simulated} (in-process; no real sandboxes are started)

Try (auth mode $SPACE_AUTH_MODE; the demo key of client acme is in .services/demo-api-key):
  curl -s $base/readyz
  curl -s $base/v1/limits ${auth[*]@Q}
  curl -s -XPOST $base/v1/sandboxes ${auth[*]@Q} -H 'Content-Type: application/json' \\
       -d '{"template":"python-3.12","cpu_millis":1000,"memory_mib":2048,"disk_gib":10}'
  curl -s http://$SPACE_INTERNAL_HTTP_ADDR/metrics | grep ^space_
  curl -s $base/v1/tiers ${auth[*]@Q}
  eval "\$(scripts/services.sh env)" && bin/space-api keys create --client globex --name me   # a key for another client

EOT
exec bin/space-api serve
