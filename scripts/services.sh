#!/usr/bin/env bash
# Local services for `make run`, `make test` and CI: PostgreSQL 15, a standalone Redis
# and a 3-node Redis Cluster, all on loopback, with their data under .services/ in the
# project (git-ignored). Idempotent: `up` twice is fine; `down` stops only the processes
# this script started, found through their PID files.
#
#   scripts/services.sh up      install what is missing (when root), start, wait until ready
#   scripts/services.sh down    stop what `up` started
#   scripts/services.sh env     print the SPACE_* / SPACE_TEST_* variables for the services
#   scripts/services.sh status  say what is running
#
# Ports can be moved with SPACE_SERVICES_PG_PORT, SPACE_SERVICES_REDIS_PORT and
# SPACE_SERVICES_CLUSTER_PORTS (three ports, space separated).
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
dir="${SPACE_SERVICES_DIR:-$root/.services}"
pg_port="${SPACE_SERVICES_PG_PORT:-55432}"
redis_port="${SPACE_SERVICES_REDIS_PORT:-56379}"
read -r -a cluster_ports <<<"${SPACE_SERVICES_CLUSTER_PORTS:-37001 37002 37003}"
pg_bin="${SPACE_SERVICES_PG_BIN:-/usr/lib/postgresql/15/bin}"
pg_data="$dir/postgres"

log() { printf 'services: %s\n' "$*" >&2; }
die() { printf 'services: %s\n' "$*" >&2; exit 1; }

is_root() { [ "$(id -u)" -eq 0 ]; }

# as_pg runs a command as the user that owns the Postgres data: Postgres refuses to run
# as root, so as root that is the `postgres` user, otherwise the caller.
as_pg() {
  if is_root; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

apt_install() {
  local pkgs=("$@")
  if ! is_root; then
    die "missing ${pkgs[*]}; install them with: sudo apt-get install -y ${pkgs[*]}"
  fi
  log "installing ${pkgs[*]} from Debian packages"
  export DEBIAN_FRONTEND=noninteractive
  if ! apt-get install -y -q "${pkgs[@]}" >/dev/null; then
    apt-get update -q >/dev/null
    apt-get install -y -q "${pkgs[@]}" >/dev/null
  fi
}

ensure_installed() {
  local missing=()
  command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
  command -v redis-cli >/dev/null 2>&1 || missing+=(redis-tools)
  [ -x "$pg_bin/initdb" ] || missing+=(postgresql-15)
  if [ ${#missing[@]} -gt 0 ]; then
    apt_install "${missing[@]}"
  fi
  # The Debian package may start its own server on the default port; ours use other
  # ports, so the two do not meet.
  [ -x "$pg_bin/initdb" ] || die "PostgreSQL 15 binaries not found under $pg_bin (set SPACE_SERVICES_PG_BIN)"
}

pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1" 2>/dev/null)" 2>/dev/null; }

# ---------------------------------------------------------------- Postgres

pg_up() {
  mkdir -p "$dir"
  if [ ! -f "$pg_data/PG_VERSION" ]; then
    log "initialising Postgres in $pg_data"
    rm -rf "$pg_data"
    mkdir -p "$pg_data"
    if is_root; then chown postgres: "$pg_data"; fi
    chmod 700 "$pg_data"
    as_pg "$pg_bin/initdb" -D "$pg_data" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >/dev/null
    cat >>"$pg_data/postgresql.conf" <<EOF
# space: test and development settings (never production): loopback only, no fsync.
listen_addresses = '127.0.0.1'
port = $pg_port
unix_socket_directories = '$pg_data'
max_connections = 400
fsync = off
synchronous_commit = off
full_page_writes = off
shared_buffers = 256MB
log_min_messages = warning
EOF
  fi
  if as_pg "$pg_bin/pg_ctl" -D "$pg_data" status >/dev/null 2>&1; then
    log "postgres already running on 127.0.0.1:$pg_port"
  else
    log "starting postgres on 127.0.0.1:$pg_port"
    as_pg "$pg_bin/pg_ctl" -D "$pg_data" -l "$pg_data/server.log" -w -t 60 start >/dev/null
  fi
  for db in space space_test; do
    if ! as_pg "$pg_bin/psql" -h 127.0.0.1 -p "$pg_port" -U postgres -tAc "SELECT 1 FROM pg_database WHERE datname = '$db'" postgres | grep -q 1; then
      as_pg "$pg_bin/createdb" -h 127.0.0.1 -p "$pg_port" -U postgres "$db"
    fi
  done
}

pg_down() {
  if [ -f "$pg_data/postmaster.pid" ]; then
    log "stopping postgres"
    as_pg "$pg_bin/pg_ctl" -D "$pg_data" -m fast -w stop >/dev/null 2>&1 || true
  fi
}

# ---------------------------------------------------------------- Redis

redis_start() { # name port [extra args...]
  local name=$1 port=$2; shift 2
  local d="$dir/$name"
  mkdir -p "$d"
  if pid_alive "$d/redis.pid"; then
    return 0
  fi
  redis-server --bind 127.0.0.1 --port "$port" --protected-mode yes \
    --daemonize yes --pidfile "$d/redis.pid" --dir "$d" --logfile "$d/redis.log" \
    --save '' --appendonly no "$@"
  local i
  for i in $(seq 1 100); do
    redis-cli -h 127.0.0.1 -p "$port" ping >/dev/null 2>&1 && return 0
    sleep 0.05
  done
  die "redis $name did not answer on 127.0.0.1:$port (see $d/redis.log)"
}

redis_stop() { # name
  local d="$dir/$1"
  if pid_alive "$d/redis.pid"; then
    local pid
    pid=$(cat "$d/redis.pid")
    kill "$pid" 2>/dev/null || true
    local i
    for i in $(seq 1 100); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.05
    done
  fi
  rm -f "$d/redis.pid"
}

cluster_ok() {
  redis-cli -h 127.0.0.1 -p "${cluster_ports[0]}" cluster info 2>/dev/null | grep -q 'cluster_state:ok'
}

redis_up() {
  log "starting redis on 127.0.0.1:$redis_port"
  # Many logical databases so that tests can each take one.
  redis_start redis "$redis_port" --databases 256
  local p
  for p in "${cluster_ports[@]}"; do
    redis_start "cluster-$p" "$p" --cluster-enabled yes --cluster-config-file nodes.conf \
      --cluster-node-timeout 2000
  done
  if ! cluster_ok; then
    local slots
    slots=$(redis-cli -h 127.0.0.1 -p "${cluster_ports[0]}" cluster info | awk -F: '/cluster_slots_assigned/ {print $2+0}')
    if [ "${slots:-0}" -eq 0 ]; then
      log "creating the 3-node redis cluster on ports ${cluster_ports[*]}"
      local addrs=()
      for p in "${cluster_ports[@]}"; do addrs+=("127.0.0.1:$p"); done
      redis-cli --cluster create "${addrs[@]}" --cluster-replicas 0 --cluster-yes >/dev/null
    fi
  fi
  local i
  for i in $(seq 1 200); do
    if cluster_ok; then
      # every node must agree before a client's first MOVED-free call
      local all=1
      for p in "${cluster_ports[@]}"; do
        redis-cli -h 127.0.0.1 -p "$p" cluster info | grep -q 'cluster_state:ok' || all=0
      done
      [ $all -eq 1 ] && { log "redis cluster ok"; return 0; }
    fi
    sleep 0.1
  done
  die "redis cluster did not reach cluster_state:ok (see $dir/cluster-*/redis.log)"
}

redis_down() {
  log "stopping redis"
  redis_stop redis
  local p
  for p in "${cluster_ports[@]}"; do
    redis_stop "cluster-$p"
    # Cluster state is disposable: the next `up` creates a fresh cluster.
    rm -rf "$dir/cluster-$p"
  done
}

# ---------------------------------------------------------------- commands

print_env() {
  local cluster
  cluster=$(printf '127.0.0.1:%s,' "${cluster_ports[@]}")
  cluster=${cluster%,}
  cat <<EOF
export SPACE_DATABASE_URL='postgres://postgres@127.0.0.1:$pg_port/space?sslmode=disable'
export SPACE_REDIS_ADDRS='127.0.0.1:$redis_port'
export SPACE_TEST_DATABASE_URL='postgres://postgres@127.0.0.1:$pg_port/space_test?sslmode=disable'
export SPACE_TEST_REDIS_ADDR='127.0.0.1:$redis_port'
export SPACE_TEST_REDIS_CLUSTER_ADDRS='$cluster'
EOF
}

status() {
  if as_pg "$pg_bin/pg_ctl" -D "$pg_data" status >/dev/null 2>&1; then
    echo "postgres: running on 127.0.0.1:$pg_port"
  else
    echo "postgres: stopped"
  fi
  if pid_alive "$dir/redis/redis.pid"; then echo "redis: running on 127.0.0.1:$redis_port"; else echo "redis: stopped"; fi
  if cluster_ok; then echo "redis cluster: ok on ${cluster_ports[*]}"; else echo "redis cluster: down"; fi
}

case "${1:-}" in
  up)
    ensure_installed
    pg_up
    redis_up
    ;;
  down)
    redis_down
    pg_down
    ;;
  env) print_env ;;
  status) status ;;
  *)
    echo "usage: $0 up|down|env|status" >&2
    exit 2
    ;;
esac
