#!/usr/bin/env bash
# Local services for `make run`, `make test` and CI: PostgreSQL 15, a standalone Redis
# and a 3-node Redis Cluster, all on loopback. Their state lives under .services/ in the
# project (git-ignored), except Postgres's data when run as root (see pg_locate). They
# start whatever the modes of the checkout's parent directories. Idempotent: `up` twice
# is fine; `down` stops only the processes this script started, found through their PID
# files.
#
#   scripts/services.sh up      install what is missing (when root), start, wait until ready
#   scripts/services.sh down    stop what `up` started; the data stays
#   scripts/services.sh clean   stop, then delete the data (Postgres's, wherever it is)
#   scripts/services.sh env     print the SPACE_* / SPACE_TEST_* variables for the services
#   scripts/services.sh status  say what is running and where Postgres keeps its data
#
# The ports are 55432 (Postgres), 56379 (Redis) and 37001-37003 (the cluster), or
# SPACE_SERVICES_PG_PORT, SPACE_SERVICES_REDIS_PORT and SPACE_SERVICES_CLUSTER_PORTS
# (three ports, space separated). When another process holds one of the defaults (the
# services of another checkout: a clean clone in CI beside a working copy), `up` takes
# free ports instead and says so; a port set explicitly is never moved. `up` records
# the ports in .services/ports, and env, status and down read them from there.
# SPACE_SERVICES_DIR moves .services/. SPACE_SERVICES_ONLY limits what `up` starts to some of "postgres redis
# cluster" (all three by default); `down` and `clean` always stop all three.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
# Canonical (symlinks resolved, need not exist yet), because the place of Postgres's
# data as root is derived from it: one checkout reached by two paths is one checkout.
dir=$(realpath -m "${SPACE_SERVICES_DIR:-$root/.services}")
pg_port="${SPACE_SERVICES_PG_PORT:-55432}"
redis_port="${SPACE_SERVICES_REDIS_PORT:-56379}"
read -r -a cluster_ports <<<"${SPACE_SERVICES_CLUSTER_PORTS:-37001 37002 37003}"
# The ports `up` last started this checkout's services on, when they were not given.
ports_file="$dir/ports"
if [ -f "$ports_file" ]; then
  while IFS='=' read -r k v; do
    case "$k" in
      pg) [ -n "${SPACE_SERVICES_PG_PORT:-}" ] || pg_port=$v ;;
      redis) [ -n "${SPACE_SERVICES_REDIS_PORT:-}" ] || redis_port=$v ;;
      cluster) [ -n "${SPACE_SERVICES_CLUSTER_PORTS:-}" ] || read -r -a cluster_ports <<<"$v" ;;
    esac
  done <"$ports_file"
fi
pg_bin="${SPACE_SERVICES_PG_BIN:-/usr/lib/postgresql/15/bin}"
only="${SPACE_SERVICES_ONLY:-postgres redis cluster}"
# As root, Postgres's data of every checkout lives under here, one directory each,
# named by a short hash of $dir (see pg_locate).
pg_state_root=/var/lib/space-services
pg_outside="$pg_state_root/$(printf '%s' "$dir" | sha256sum | cut -c1-12)"

log() { printf 'services: %s\n' "$*" >&2; }
die() { printf 'services: %s\n' "$*" >&2; exit 1; }

is_root() { [ "$(id -u)" -eq 0 ]; }

wanted() { [[ " $only " == *" $1 "* ]]; }

# as_pg runs a command as the user that owns the Postgres data: Postgres refuses to run
# as root, so as root that is the `postgres` user, otherwise the caller. As `postgres`
# it runs from /: the Postgres tools change directory and back while finding their own
# executable, and fail when the caller's directory is one `postgres` cannot enter (a
# checkout under a 0700 home or mktemp -d).
as_pg() {
  if is_root; then
    (cd / && runuser -u postgres -- "$@")
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

# exited says whether a process has exited: gone, or a zombie that the init of a
# container may never reap.
exited() {
  ! kill -0 "$1" 2>/dev/null || [ "$(awk '{print $3}' "/proc/$1/stat" 2>/dev/null)" = Z ]
}

pid_alive() { [ -f "$1" ] && ! exited "$(cat "$1" 2>/dev/null)"; }

# ---------------------------------------------------------------- ports

# port_taken says whether something accepts connections on 127.0.0.1:$1.
port_taken() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# free_ports prints $1 ports, consecutive, that nothing listens on, nor on each port
# plus 10000 (a Redis Cluster node's bus port), below the kernel's ephemeral range.
free_ports() {
  local n=$1 base i ok
  for _ in $(seq 1 200); do
    base=$((20000 + RANDOM % 9000))
    ok=1
    for i in $(seq 0 $((n - 1))); do
      if port_taken $((base + i)) || port_taken $((base + i + 10000)); then ok=0; break; fi
    done
    if [ $ok -eq 1 ]; then
      seq "$base" $((base + n - 1)) | tr '\n' ' '
      return 0
    fi
  done
  die "no free ports found for the services"
}

# choose_port VAR NAME EXPLICIT: when the port in VAR is held by another process and
# was not set explicitly, move VAR to a free one.
choose_port() {
  local var=$1 name=$2 explicit=$3 port
  port=${!var}
  port_taken "$port" || return 0
  [ -z "$explicit" ] || die "$name: port $port is taken (set explicitly); free it or choose another"
  local free
  free=$(free_ports 1)
  free=${free% }
  log "$name: port $port is taken by another process (another checkout's services?); using $free"
  printf -v "$var" '%s' "$free"
}

save_ports() {
  mkdir -p "$dir"
  printf 'pg=%s\nredis=%s\ncluster=%s\n' "$pg_port" "$redis_port" "${cluster_ports[*]}" >"$ports_file"
}

# ---------------------------------------------------------------- Postgres

# pg_locate sets pg_data, the Postgres data directory, and pg_state, the directory
# outside the checkout that holds it as root (empty otherwise).
#
# Not root: $dir/postgres, owned by the caller, as it always was.
#
# Root: Postgres runs as `postgres`, which cannot reach a checkout under a 0700 home or
# mktemp -d. So the data lives in $pg_state_root/<hash>/postgres, a directory
# `postgres` owns, where <hash> is a short hash of $dir's path: two checkouts never
# share one. $dir/postgres is a symlink to it, and $pg_state_root/<hash>/services-dir
# names the checkout's $dir, so that either side tells where the other is. The symlink
# is only for people: the hash decides, so a checkout copied with its .services/ does
# not reach the original's data.
#
# Root, with $dir/postgres a directory initialised by an older services.sh (data
# inside the checkout): kept where it is, so that a running server carries on and `down`
# stops it; pg_up moves it out only if `postgres` cannot reach it.
pg_locate() {
  pg_state=""
  if ! is_root; then
    pg_data="$dir/postgres"
    return
  fi
  if [ -d "$dir/postgres" ] && [ ! -L "$dir/postgres" ] && [ -f "$dir/postgres/PG_VERSION" ]; then
    pg_data="$dir/postgres"
    return
  fi
  pg_state="$pg_outside"
  pg_data="$pg_state/postgres"
}

# pg_pid prints the PID of the postmaster of $pg_data when it is running. It reads
# postmaster.pid itself rather than asking pg_ctl, which (as `postgres`) cannot read a
# data directory it cannot reach; the process name check keeps a stale file whose PID
# was reused from naming another process.
pg_pid() {
  local pid
  pid=$(head -n 1 "$pg_data/postmaster.pid" 2>/dev/null) || return 1
  [ -n "$pid" ] && ! exited "$pid" || return 1
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = postgres ] || return 1
  printf '%s\n' "$pid"
}

# pg_running_port prints the port the running postmaster listens on (postmaster.pid's
# fourth line).
pg_running_port() { sed -n 4p "$pg_data/postmaster.pid" 2>/dev/null; }

# pg_adopt_legacy: as root, data left inside the checkout by an older services.sh is
# used where it is when `postgres` can reach it. When it cannot (the checkout's parents
# were closed since), it is moved out to where pg_locate puts new data, if stopped.
pg_adopt_legacy() {
  if as_pg test -r "$pg_data/PG_VERSION" || pg_pid >/dev/null; then
    return 0
  fi
  local legacy="$pg_data"
  pg_state="$pg_outside"
  pg_data="$pg_state/postgres"
  [ ! -e "$pg_data" ] || die "both $legacy and $pg_data hold Postgres data; remove one"
  log "moving Postgres data from $legacy to $pg_data: the postgres user cannot reach it"
  mkdir -p "$pg_state"
  mv "$legacy" "$pg_data"
  chown -R postgres: "$pg_data"
  printf '%s\n' "$dir" >"$pg_state/services-dir"
  ln -s "$pg_data" "$dir/postgres"
}

# pg_prepare makes the directories pg_locate chose, and the symlink to them as root.
pg_prepare() {
  mkdir -p "$dir"
  if ! is_root; then
    if [ -d "$pg_data" ] && [ ! -O "$pg_data" ]; then
      die "$pg_data belongs to $(stat -L -c %U "$pg_data") (set up as root?); run this as root, or remove it with: sudo scripts/services.sh clean"
    fi
    if [ -L "$pg_data" ] && [ ! -e "$pg_data" ]; then
      rm -f "$pg_data" # a root run's link to data since deleted
    fi
    return 0
  fi
  [ -n "$pg_state" ] || return 0 # old data inside the checkout, used where it is
  mkdir -p "$pg_state"
  chmod 755 "$pg_state_root" "$pg_state"
  printf '%s\n' "$dir" >"$pg_state/services-dir"
  local link="$dir/postgres"
  if [ "$(readlink "$link" 2>/dev/null)" != "$pg_data" ]; then
    # A directory there holds no database (pg_locate would have kept it): the empty one
    # an older services.sh left when initdb could not reach it.
    rm -rf "$link"
    ln -s "$pg_data" "$link"
  fi
}

pg_up() {
  pg_locate
  if is_root && [ -z "$pg_state" ]; then
    pg_adopt_legacy
  fi
  pg_prepare
  if [ ! -f "$pg_data/PG_VERSION" ]; then
    log "initialising Postgres in $pg_data"
    rm -rf "$pg_data"
    mkdir -p "$pg_data"
    if is_root; then chown postgres: "$pg_data"; fi
    chmod 700 "$pg_data"
    as_pg "$pg_bin/initdb" -D "$pg_data" -U postgres --auth=trust -E UTF8 --locale=C.UTF-8 >/dev/null
    # The port and the socket directory are given at start, not here, so that a new
    # SPACE_SERVICES_PG_PORT or a moved data directory takes effect.
    cat >>"$pg_data/postgresql.conf" <<EOF
# space: test and development settings (never production): loopback only, no fsync.
listen_addresses = '127.0.0.1'
max_connections = 400
fsync = off
synchronous_commit = off
full_page_writes = off
shared_buffers = 256MB
log_min_messages = warning
EOF
  fi
  local pid
  if pid=$(pg_pid); then
    local running
    running=$(pg_running_port)
    if [ "$running" != "$pg_port" ]; then
      [ -z "${SPACE_SERVICES_PG_PORT:-}" ] || die "postgres of $dir already runs on port $running, not $pg_port; stop it first with scripts/services.sh down"
      pg_port=$running
    fi
    log "postgres already running on 127.0.0.1:$pg_port"
  else
    choose_port pg_port postgres "${SPACE_SERVICES_PG_PORT:-}"
    log "starting postgres on 127.0.0.1:$pg_port (data in $pg_data)"
    # The unix socket goes beside the data. A socket path is limited to 107 bytes, and
    # pg_ctl hands -o to a shell: for a long or quoted path, no socket (every client
    # here uses TCP).
    local sock="$pg_data"
    if [ ${#sock} -gt 90 ] || [[ "$sock" == *"'"* ]]; then sock=""; fi
    as_pg "$pg_bin/pg_ctl" -D "$pg_data" -l "$pg_data/server.log" -o "-p $pg_port -k '$sock'" -w -t 60 start >/dev/null ||
      die "postgres did not start (see $pg_data/server.log)"
  fi
  for db in space space_test; do
    if ! as_pg "$pg_bin/psql" -h 127.0.0.1 -p "$pg_port" -U postgres -tAc "SELECT 1 FROM pg_database WHERE datname = '$db'" postgres | grep -q 1; then
      as_pg "$pg_bin/createdb" -h 127.0.0.1 -p "$pg_port" -U postgres "$db"
    fi
  done
}

# pg_down stops the postmaster of this checkout's data with SIGINT, what
# `pg_ctl stop -m fast` sends, and waits for it to exit. Signalling it directly works
# wherever the data is, including old data `postgres` can no longer reach.
pg_down() {
  pg_locate
  local pid
  pid=$(pg_pid) || return 0
  log "stopping postgres"
  kill -INT "$pid"
  local i
  for i in $(seq 1 600); do
    exited "$pid" && return 0
    sleep 0.1
  done
  die "postgres (pid $pid) did not stop within 60s (see $pg_data/server.log)"
}

# pg_clean deletes the data: the directory outside the checkout and the symlink to it
# as root, the directory inside it otherwise.
pg_clean() {
  pg_locate
  log "deleting Postgres data in $pg_data"
  rm -rf "$pg_data" "$dir/postgres"
  if [ -n "$pg_state" ]; then
    rm -rf "$pg_state"
    rmdir "$pg_state_root" 2>/dev/null || true # others' data may still be there
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
      exited "$pid" && break
      sleep 0.05
    done
  fi
  rm -f "$d/redis.pid"
}

cluster_ok() {
  redis-cli -h 127.0.0.1 -p "${cluster_ports[0]}" cluster info 2>/dev/null | grep -q 'cluster_state:ok'
}

redis_up() {
  if pid_alive "$dir/redis/redis.pid"; then
    log "redis already running on 127.0.0.1:$redis_port"
    return 0
  fi
  choose_port redis_port redis "${SPACE_SERVICES_REDIS_PORT:-}"
  log "starting redis on 127.0.0.1:$redis_port"
  # Many logical databases so that tests can each take one.
  redis_start redis "$redis_port" --databases 256
}

cluster_up() {
  local p running=1
  for p in "${cluster_ports[@]}"; do
    pid_alive "$dir/cluster-$p/redis.pid" || running=0
  done
  if [ $running -eq 0 ]; then
    local taken=0
    for p in "${cluster_ports[@]}"; do
      if port_taken "$p" || port_taken $((p + 10000)); then taken=1; fi
    done
    if [ $taken -eq 1 ]; then
      [ -z "${SPACE_SERVICES_CLUSTER_PORTS:-}" ] || die "redis cluster: ports ${cluster_ports[*]} (or their bus ports, +10000) are taken (set explicitly); free them or choose others"
      local free
      free=$(free_ports 3)
      log "redis cluster: ports ${cluster_ports[*]} are taken by another process (another checkout's services?); using ${free% }"
      read -r -a cluster_ports <<<"$free"
    fi
  fi
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
  # Every node `up` started, whatever SPACE_SERVICES_CLUSTER_PORTS says now.
  local d
  for d in "$dir"/cluster-*/; do
    [ -d "$d" ] || continue
    d=${d%/}
    redis_stop "${d##*/}"
    # Cluster state is disposable: the next `up` creates a fresh cluster.
    rm -rf "$d"
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
  pg_locate
  if pg_pid >/dev/null; then
    echo "postgres: running on 127.0.0.1:$(pg_running_port) (data in $pg_data)"
  else
    echo "postgres: stopped (data in $pg_data)"
  fi
  if pid_alive "$dir/redis/redis.pid"; then echo "redis: running on 127.0.0.1:$redis_port"; else echo "redis: stopped"; fi
  if cluster_ok; then echo "redis cluster: ok on ${cluster_ports[*]}"; else echo "redis cluster: down"; fi
}

case "${1:-}" in
  up)
    for s in $only; do
      case "$s" in postgres | redis | cluster) ;; *) die "SPACE_SERVICES_ONLY: unknown service $s (postgres, redis, cluster)" ;; esac
    done
    ensure_installed
    if wanted postgres; then pg_up; fi
    if wanted redis; then redis_up; fi
    if wanted cluster; then cluster_up; fi
    save_ports
    ;;
  down)
    redis_down
    pg_down
    ;;
  clean)
    redis_down
    pg_down
    pg_clean
    rm -rf "$dir/redis"
    rm -f "$ports_file"
    # The demo API key of `make run` names a key in the database just deleted.
    rm -f "$dir/demo-api-key"
    ;;
  env) print_env ;;
  status) status ;;
  *)
    echo "usage: $0 up|down|clean|env|status" >&2
    exit 2
    ;;
esac
