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
# the ports in .services/ports before it starts a server on them, and env, status and
# down read them from there.
#
# A server this checkout's earlier `up` started is taken over, not taken for another
# process's: its PID file names a live process of the right program whose data
# directory is this checkout's, and that process answers on the port. So a rerun after
# an `up` that was killed part way finishes the job: it starts the servers that are
# missing and makes the cluster anew when it was left half made. When `up` fails, or is
# interrupted, it stops the servers this run started (not those it took over) and shows
# the end of the failing server's log. SPACE_SERVICES_WAIT (seconds, 60 by default) is
# how long `up` waits for each server to answer and for the cluster to reach
# cluster_state:ok; raise it on a heavily loaded machine.
#
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
wait_s="${SPACE_SERVICES_WAIT:-60}"
# As root, Postgres's data of every checkout lives under here, one directory each,
# named by a short hash of $dir (see pg_locate).
pg_state_root=/var/lib/space-services
pg_outside="$pg_state_root/$(printf '%s' "$dir" | sha256sum | cut -c1-12)"

log() { printf 'services: %s\n' "$*" >&2; }
die() { printf 'services: %s\n' "$*" >&2; exit 1; }

# die_log LOG MESSAGE...: die, after the message, with the end of a server's log, where
# the reason it did not come up is.
die_log() {
  local file=$1
  shift
  log "$*"
  if [ -s "$file" ]; then
    log "the end of $file:"
    tail -n 20 "$file" | sed 's/^/    /' >&2
  fi
  exit 1
}

[[ "$wait_s" =~ ^[1-9][0-9]*$ ]] || die "SPACE_SERVICES_WAIT is $wait_s; set it to a whole number of seconds, such as 120"

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

# stop_pid PID WHAT: SIGTERM, and SIGKILL when the process has not exited within
# SPACE_SERVICES_WAIT seconds.
stop_pid() {
  local pid=$1 what=$2 deadline=$((SECONDS + wait_s))
  kill "$pid" 2>/dev/null || return 0
  until exited "$pid"; do
    if [ $SECONDS -ge $deadline ]; then
      log "$what (pid $pid) did not stop within ${wait_s}s of SIGTERM; killing it"
      kill -KILL "$pid" 2>/dev/null || true
      deadline=$((SECONDS + 5))
      until exited "$pid" || [ $SECONDS -ge $deadline ]; do sleep 0.05; done
      return 0
    fi
    sleep 0.05
  done
}

# ---------------------------------------------------------------- a failed up

# What this run of `up` started, in order: "postgres" or "redis NAME PID". When `up`
# fails or is interrupted, on_exit stops them, so that nothing half started is left
# behind. Servers an earlier run started, which this one took over, keep running: they
# may serve someone, and the next `up` takes them over again.
started=()
interrupted=""

on_exit() {
  local rc=$? i kind name pid
  trap - EXIT
  # The cleanup runs to its end: a second Ctrl-C would leave what it had not reached yet.
  trap '' INT TERM HUP
  if [ "$rc" -ne 0 ] && [ ${#started[@]} -gt 0 ]; then
    if [ -n "$interrupted" ]; then
      log "up was interrupted; stopping the servers it started"
    else
      log "up failed; stopping the servers it started"
    fi
    for ((i = ${#started[@]} - 1; i >= 0; i--)); do
      read -r kind name pid <<<"${started[i]}"
      case "$kind" in
        redis) redis_kill "$name" "$pid" ;;
        # In a subshell: pg_down dies when postgres will not stop, and the rest must
        # still be stopped.
        postgres) (pg_down) || true ;;
      esac
    done
    [ -n "$interrupted" ] || log "fix what is said above, then run scripts/services.sh up again"
  fi
  exit "$rc"
}

# ---------------------------------------------------------------- ports

# port_taken says whether a server could not listen on 127.0.0.1:$1: something
# accepts connections there, or, when $2 is "any", a TCP socket of the machine has it
# as its local port. The defaults lie inside the kernel's ephemeral range, so an
# outgoing connection (a test's, to Redis) may hold one, or leave it in TIME-WAIT, with
# no listener to show it; Postgres then failed to bind ("Address already in use", in
# its log only) although no other server was there. Only a port up chooses itself is
# held to "any": a socket may also be the last server's own on that very port (its
# connections closing as it stops: TIME-WAIT, FIN-WAIT), which the next server binds
# past (SO_REUSEADDR), and /proc does not say which side it was; an explicit port is
# tried unless something listens there.
port_taken() {
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null && return 0
  [ "${2:-}" = any ] || return 1
  local hex
  hex=$(printf ':%04X' "$1")
  awk -v p="$hex" 'FNR > 1 && substr($2, length($2) - 4) == p { found = 1; exit } END { exit !found }' \
    /proc/net/tcp /proc/net/tcp6 2>/dev/null
}

# free_ports prints $1 ports, consecutive, that nothing listens on, nor on each port
# plus 10000 (a Redis Cluster node's bus port), all below the kernel's ephemeral range
# (the bus ports too: a port the kernel hands to an outgoing connection, which no
# listener shows, would make a node fail to bind its bus).
free_ports() {
  local n=$1 base i ok low=32768 span
  [ -r /proc/sys/net/ipv4/ip_local_port_range ] && read -r low _ </proc/sys/net/ipv4/ip_local_port_range
  span=$((low - 10000 - 12000 - n))
  [ "$span" -gt 100 ] || die "the kernel's ephemeral ports start at $low: too low to place the services' ports (and bus ports, +10000) below them"
  for _ in $(seq 1 200); do
    base=$((12000 + RANDOM % span))
    ok=1
    for i in $(seq 0 $((n - 1))); do
      if port_taken $((base + i)) any || port_taken $((base + i + 10000)) any; then ok=0; break; fi
    done
    if [ $ok -eq 1 ]; then
      seq "$base" $((base + n - 1)) | tr '\n' ' '
      return 0
    fi
  done
  die "no free ports found for the services"
}

# choose_port VAR NAME EXPLICIT: when the port in VAR is held by another process and
# was not set explicitly, move VAR to a free one (away from any socket on it: moving
# costs nothing). An explicit port is tried unless something listens there.
choose_port() {
  local var=$1 name=$2 explicit=$3 port
  port=${!var}
  if [ -n "$explicit" ]; then
    port_taken "$port" || return 0
    die "$name: port $port is taken (set explicitly); free it or choose another"
  fi
  port_taken "$port" any || return 0
  local free
  free=$(free_ports 1)
  free=${free% }
  log "$name: port $port is taken (another checkout's services, or a connection's own port); using $free"
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
    # The postmaster of this checkout's data directory: an earlier `up` started it.
    local running
    running=$(pg_running_port)
    if [ "$running" != "$pg_port" ]; then
      [ -z "${SPACE_SERVICES_PG_PORT:-}" ] || die "postgres of $dir already runs on port $running, not $pg_port; stop it first with scripts/services.sh down"
      pg_port=$running
    fi
    save_ports
    pg_wait
    log "postgres already running on 127.0.0.1:$pg_port"
  else
    choose_port pg_port postgres "${SPACE_SERVICES_PG_PORT:-}"
    save_ports
    log "starting postgres on 127.0.0.1:$pg_port (data in $pg_data)"
    # The unix socket goes beside the data. A socket path is limited to 107 bytes, and
    # pg_ctl hands -o to a shell: for a long or quoted path, no socket (every client
    # here uses TCP).
    local sock="$pg_data"
    if [ ${#sock} -gt 90 ] || [[ "$sock" == *"'"* ]]; then sock=""; fi
    started+=(postgres)
    as_pg "$pg_bin/pg_ctl" -D "$pg_data" -l "$pg_data/server.log" -o "-p $pg_port -k '$sock'" -w -t "$wait_s" start >/dev/null ||
      die_log "$pg_data/server.log" "postgres did not start on 127.0.0.1:$pg_port within ${wait_s}s (on a loaded machine, raise SPACE_SERVICES_WAIT)"
  fi
  for db in space space_test; do
    if ! as_pg "$pg_bin/psql" -h 127.0.0.1 -p "$pg_port" -U postgres -tAc "SELECT 1 FROM pg_database WHERE datname = '$db'" postgres | grep -q 1; then
      as_pg "$pg_bin/createdb" -h 127.0.0.1 -p "$pg_port" -U postgres "$db"
    fi
  done
}

# pg_wait waits until the running postmaster accepts connections: one an earlier `up`
# started may still be starting, or recovering after a kill.
pg_wait() {
  local deadline=$((SECONDS + wait_s))
  until "$pg_bin/pg_isready" -q -h 127.0.0.1 -p "$pg_port" -t 5; do
    pg_pid >/dev/null || die_log "$pg_data/server.log" "postgres of $pg_data exited before it accepted connections"
    [ $SECONDS -lt $deadline ] ||
      die_log "$pg_data/server.log" "postgres on 127.0.0.1:$pg_port did not accept connections within ${wait_s}s (on a loaded machine, raise SPACE_SERVICES_WAIT)"
    sleep 0.2
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
  local deadline=$((SECONDS + wait_s))
  until exited "$pid"; do
    [ $SECONDS -lt $deadline ] || die "postgres (pid $pid) did not stop within ${wait_s}s (see $pg_data/server.log); stop it with: kill $pid"
    sleep 0.1
  done
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

# rcli PORT ARGS...: redis-cli against 127.0.0.1:PORT, bounded in time, because the
# port may be held by a process that accepts a connection and never answers.
rcli() {
  local port=$1
  shift
  timeout 10 redis-cli -h 127.0.0.1 -p "$port" "$@"
}

# served_by PORT prints the PID of the Redis server that answers on PORT.
served_by() {
  rcli "$1" info server 2>/dev/null | tr -d '\r' | awk -F: '$1 == "process_id" {print $2}'
}

# own_pid NAME prints the PID of this checkout's redis-server for $dir/NAME when it
# runs: the process its PID file names is alive, is a redis-server, and works in
# $dir/NAME (its --dir, where the server changes directory as it reads its options).
# A stale PID file whose PID another process took names nothing, and neither can a
# server of another checkout. It may not listen yet: redis_wait says when it does.
own_pid() {
  local d="$dir/$1" pid
  pid=$(head -n 1 "$d/redis.pid" 2>/dev/null) || return 1
  [[ "$pid" =~ ^[0-9]+$ ]] && ! exited "$pid" || return 1
  [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = redis-server ] || return 1
  [ "$(readlink "/proc/$pid/cwd" 2>/dev/null)" = "$d" ] || return 1
  printf '%s\n' "$pid"
}

# own_port NAME DEFAULT prints the port that redis_start gave $dir/NAME's server, or
# DEFAULT for a server started without a record of it.
own_port() {
  local port
  port=$(head -n 1 "$dir/$1/port" 2>/dev/null) || port=""
  printf '%s\n' "${port:-$2}"
}

# redis_start NAME PORT [ARGS...] starts a redis-server for $dir/NAME on PORT and
# records it (redis_wait then waits for it). It runs in the foreground in a session of
# its own, not with --daemonize: its PID is known at once, before it listens (a
# daemonized server writes its PID file only then), so a failed or interrupted `up`
# can stop a server that never came up, and a rerun can recognise it.
redis_start() {
  local name=$1 port=$2
  shift 2
  local d="$dir/$name"
  mkdir -p "$d"
  printf '%s\n' "$port" >"$d/port"
  # No --logfile: the server logs to its standard output, redis.log, which thus also
  # holds what it says before it reads its options.
  # setsid execs the server in place (an asynchronous command of a script is no process
  # group leader), so $! is the server's PID.
  setsid redis-server --bind 127.0.0.1 --port "$port" --protected-mode yes \
    --daemonize no --dir "$d" --save '' --appendonly no "$@" </dev/null >>"$d/redis.log" 2>&1 &
  local pid=$!
  started+=("redis $name $pid")
  printf '%s\n' "$pid" >"$d/redis.pid"
}

# redis_wait NAME PORT waits until $dir/NAME's server answers on PORT, for up to
# SPACE_SERVICES_WAIT seconds, and fails with the end of its log when it exits first
# or does not answer in time.
redis_wait() {
  local name=$1 port=$2 d="$dir/$1" pid deadline=$((SECONDS + wait_s))
  pid=$(head -n 1 "$d/redis.pid" 2>/dev/null) || die "redis $name: no PID file in $d; run scripts/services.sh up again"
  until [ "$(served_by "$port")" = "$pid" ]; do
    if exited "$pid"; then
      die_log "$d/redis.log" "redis $name (pid $pid) exited before it answered on 127.0.0.1:$port"
    fi
    if [ $SECONDS -ge $deadline ]; then
      die_log "$d/redis.log" "redis $name (pid $pid) did not answer on 127.0.0.1:$port within ${wait_s}s (on a loaded machine, raise SPACE_SERVICES_WAIT)"
    fi
    sleep 0.1
  done
}

# redis_stop NAME stops $dir/NAME's server, when it is this checkout's.
redis_stop() {
  local pid
  if pid=$(own_pid "$1"); then
    stop_pid "$pid" "redis $1"
  fi
  rm -f "$dir/$1/redis.pid" "$dir/$1/port"
}

# redis_kill NAME PID stops a server this run started, whatever it has become (it may
# not be a redis-server in its directory yet), for on_exit. Its log stays, for whoever
# reads why `up` failed.
redis_kill() {
  local name=$1 pid=$2 what="redis $1"
  [ "$name" != redis ] || what=redis
  log "stopping $what (pid $pid)"
  stop_pid "$pid" "$what"
  rm -f "$dir/$name/redis.pid" "$dir/$name/port" "$dir/$name/nodes.conf"
}

redis_up() {
  local pid port
  if pid=$(own_pid redis); then
    port=$(own_port redis "$redis_port")
    if [ "$port" != "$redis_port" ]; then
      [ -z "${SPACE_SERVICES_REDIS_PORT:-}" ] || die "redis of $dir already runs on port $port, not $redis_port; stop it first with scripts/services.sh down"
      redis_port=$port
    fi
    save_ports
    redis_wait redis "$redis_port"
    log "redis already running on 127.0.0.1:$redis_port"
    return 0
  fi
  choose_port redis_port redis "${SPACE_SERVICES_REDIS_PORT:-}"
  save_ports
  log "starting redis on 127.0.0.1:$redis_port"
  # Many logical databases so that tests can each take one.
  redis_start redis "$redis_port" --databases 256
  redis_wait redis "$redis_port"
}

# cluster_shape says what the nodes on cluster_ports make: "ok" when every node knows
# the 3 nodes, has all 16384 slots assigned and says cluster_state:ok; "made" when
# every node knows the 3 and has the slots assigned but is still converging; "blank"
# when no node has a slot or knows another (nodes just started); "half" otherwise: a
# `--cluster create` cut short, or a node started anew beside two of an earlier cluster.
cluster_shape() {
  local p info state slots known ok=1 made=1 blank=1
  for p in "${cluster_ports[@]}"; do
    info=$(rcli "$p" cluster info 2>/dev/null | tr -d '\r') || info=""
    state=$(awk -F: '$1 == "cluster_state" {print $2}' <<<"$info")
    slots=$(awk -F: '$1 == "cluster_slots_assigned" {print $2}' <<<"$info")
    known=$(awk -F: '$1 == "cluster_known_nodes" {print $2}' <<<"$info")
    if [ "$slots" != 16384 ] || [ "$known" != 3 ]; then ok=0 made=0; fi
    [ "$state" = ok ] || ok=0
    if [ "$slots" != 0 ] || [ "$known" != 1 ]; then blank=0; fi
  done
  if [ $ok -eq 1 ]; then
    echo ok
  elif [ $made -eq 1 ]; then
    echo made
  elif [ $blank -eq 1 ]; then
    echo blank
  else
    echo half
  fi
}

# cluster_wait_ok waits up to SPACE_SERVICES_WAIT seconds until every node says
# cluster_state:ok, which a client's first MOVED-free call needs.
cluster_wait_ok() {
  local deadline=$((SECONDS + wait_s))
  until [ "$(cluster_shape)" = ok ]; do
    [ $SECONDS -lt $deadline ] || return 1
    sleep 0.1
  done
}

# cluster_reset empties the nodes and makes each forget the others, so that
# cluster_make can make them a cluster again. Cluster state is disposable.
cluster_reset() {
  local p cmd out
  for p in "${cluster_ports[@]}"; do
    for cmd in flushall "cluster reset hard"; do
      # redis-cli exits 0 on an error reply too: the reply tells.
      # shellcheck disable=SC2086 # cmd is split into the command's words
      out=$(rcli "$p" $cmd 2>&1) || true
      [ "$out" = OK ] ||
        die "redis cluster: $cmd on 127.0.0.1:$p says ${out:-nothing}; stop the cluster with scripts/services.sh down and run up again"
    done
  done
}

# cluster_make makes blank nodes a cluster and waits until it is ok.
cluster_make() {
  local p addrs=() out
  log "creating the 3-node redis cluster on ports ${cluster_ports[*]}"
  for p in "${cluster_ports[@]}"; do addrs+=("127.0.0.1:$p"); done
  # `--cluster create` waits for the nodes to join with no bound of its own.
  if ! out=$(timeout "$wait_s" redis-cli --cluster create "${addrs[@]}" --cluster-replicas 0 --cluster-yes 2>&1); then
    log "redis-cli --cluster create failed or took more than ${wait_s}s; it said:"
    tail -n 20 <<<"$out" | sed 's/^/    /' >&2
    die "the nodes' logs are $dir/cluster-*/redis.log; on a loaded machine, raise SPACE_SERVICES_WAIT"
  fi
  cluster_wait_ok || cluster_die
}

cluster_die() {
  local p
  log "redis cluster on ports ${cluster_ports[*]} did not reach cluster_state:ok within ${wait_s}s (on a loaded machine, raise SPACE_SERVICES_WAIT); the nodes say:"
  for p in "${cluster_ports[@]}"; do
    log "  127.0.0.1:$p: $(rcli "$p" cluster info 2>&1 | tr -d '\r' | grep -E '^cluster_(state|slots_assigned|known_nodes):' | tr '\n' ' ')"
    if [ -s "$dir/cluster-$p/redis.log" ]; then
      tail -n 5 "$dir/cluster-$p/redis.log" | sed 's/^/    /' >&2
    fi
  done
  exit 1
}

cluster_ok() {
  rcli "${cluster_ports[0]}" cluster info 2>/dev/null | grep -q 'cluster_state:ok'
}

cluster_up() {
  local p d name taken=() adopted=() any=any
  # A port is free for the cluster unless something other than this checkout's node
  # for it holds the port or its bus port (+10000); explicit ports are tried unless
  # something listens there (port_taken).
  [ -z "${SPACE_SERVICES_CLUSTER_PORTS:-}" ] || any=
  for p in "${cluster_ports[@]}"; do
    own_pid "cluster-$p" >/dev/null && continue
    if port_taken "$p" $any || port_taken $((p + 10000)) $any; then taken+=("$p"); fi
  done
  if [ ${#taken[@]} -gt 0 ]; then
    local which="ports ${taken[*]}"
    [ ${#taken[@]} -eq 3 ] || which="$which of ${cluster_ports[*]}"
    [ -z "${SPACE_SERVICES_CLUSTER_PORTS:-}" ] || die "redis cluster: $which (or their bus ports, +10000) are taken by another process (set explicitly); free them or choose others"
    local free
    free=$(free_ports 3)
    log "redis cluster: $which (or their bus ports, +10000) are taken by another process (another checkout's services?); using ${free% }"
    read -r -a cluster_ports <<<"$free"
  fi
  # One cluster per checkout: this checkout's nodes on other ports (left by an earlier
  # `up` on ports since moved) go.
  for d in "$dir"/cluster-*/; do
    [ -d "$d" ] || continue
    d=${d%/}
    name=${d##*/}
    [[ " ${cluster_ports[*]} " == *" ${name#cluster-} "* ]] && continue
    if own_pid "$name" >/dev/null; then
      log "redis cluster: stopping this checkout's node on port ${name#cluster-}, not one of ${cluster_ports[*]}"
    fi
    redis_stop "$name"
    rm -rf "$d"
  done
  save_ports
  # Every missing node is started before any is waited for, so that a slow node costs
  # its own start only. A node started now has no cluster state: its data went with the
  # process it replaces (no persistence), and an old nodes.conf would name a cluster
  # that is gone.
  for p in "${cluster_ports[@]}"; do
    if own_pid "cluster-$p" >/dev/null; then
      adopted+=("$p")
      continue
    fi
    rm -f "$dir/cluster-$p/nodes.conf"
    redis_start "cluster-$p" "$p" --cluster-enabled yes --cluster-config-file nodes.conf \
      --cluster-node-timeout 2000
  done
  if [ ${#adopted[@]} -gt 0 ] && [ ${#adopted[@]} -lt 3 ]; then
    log "redis cluster: taking over the nodes on ${adopted[*]}, which an earlier up of this checkout started; starting the others"
  elif [ ${#adopted[@]} -eq 0 ]; then
    log "starting the redis cluster's nodes on ports ${cluster_ports[*]}"
  fi
  for p in "${cluster_ports[@]}"; do
    redis_wait "cluster-$p" "$p"
  done
  case "$(cluster_shape)" in
    ok) ;;
    blank) cluster_make ;;
    made)
      # An earlier cluster of these nodes, converging. If it does not, it is made anew.
      if ! cluster_wait_ok; then
        log "redis cluster: the nodes on ${cluster_ports[*]} did not agree within ${wait_s}s; making the cluster anew"
        cluster_reset
        cluster_make
      fi
      ;;
    half)
      log "redis cluster: the nodes on ${cluster_ports[*]} are a half-made cluster (an earlier up stopped part way?); making it anew"
      cluster_reset
      cluster_make
      ;;
  esac
  log "redis cluster ok"
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
  if own_pid redis >/dev/null; then echo "redis: running on 127.0.0.1:$(own_port redis "$redis_port")"; else echo "redis: stopped"; fi
  if cluster_ok; then echo "redis cluster: ok on ${cluster_ports[*]}"; else echo "redis cluster: down"; fi
}

case "${1:-}" in
  up)
    for s in $only; do
      case "$s" in postgres | redis | cluster) ;; *) die "SPACE_SERVICES_ONLY: unknown service $s (postgres, redis, cluster)" ;; esac
    done
    trap on_exit EXIT
    trap 'interrupted=1; exit 129' HUP
    trap 'interrupted=1; exit 130' INT
    trap 'interrupted=1; exit 143' TERM
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
