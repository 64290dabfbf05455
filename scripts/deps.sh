#!/usr/bin/env bash
# scripts/deps.sh — make a PostgreSQL and a RabbitMQ (and, when asked, a STOMP broker) reachable
# for tests and local runs.
#
# Usage: scripts/deps.sh up [stomp] [DB...] | down [stomp] | install [stomp] | status | clean | help
#
#   up      Picks, for each of Postgres and RabbitMQ, the first of:
#             1. the URL already set in the environment (INTEGRATIONS_PG_URL /
#                INTEGRATIONS_AMQP_URL), if it answers;
#             2. the standard local server (Postgres 127.0.0.1:5432 user postgres,
#                RabbitMQ 127.0.0.1:5672 guest/guest), if it answers;
#             3. a project-local server under .deps/ that is still running;
#             4. a project-local server it starts now
#                (Postgres 127.0.0.1:55432, RabbitMQ 127.0.0.1:55672).
#           Creates the databases "test", "integrations" (and any DB given) on the
#           chosen Postgres, and writes .run/deps.env:
#             INTEGRATIONS_PG_URL=postgres://postgres@127.0.0.1:5432   (no database)
#             INTEGRATIONS_AMQP_URL=amqp://guest:guest@127.0.0.1:5672/
#           Use it with:  set -a; . .run/deps.env; set +a
#           With the word `stomp` (make test gives it) it also makes a STOMP broker
#           reachable, the first of: INTEGRATIONS_STOMP_URL if it answers; this checkout's
#           ActiveMQ under .deps/activemq if running; one it starts now (Debian's activemq
#           package, ActiveMQ Classic 5.17: only a STOMP connector on 127.0.0.1:56613, login
#           admin/admin, scheduler on, -Xmx256M, data and logs in .deps/activemq). A port held by
#           another checkout's ActiveMQ that answers STOMP is used as it is (never stopped from
#           here); a port held by anything else moves it to the next free one. It writes
#             INTEGRATIONS_STOMP_URL=stomp://admin:admin@127.0.0.1:56613
#           (also on a later `up` without the word, while this checkout's ActiveMQ runs).
#           DEPS_STARTED_FILE=<file>: appends "stomp" to it when this run started the
#           ActiveMQ (make test stops that one at exit with `down stomp`).
#           For a project-local RabbitMQ it also writes INTEGRATIONS_RABBITMQ_NODE and
#           INTEGRATIONS_RABBITMQCTL (.deps/rabbitmq/rabbitmqctl: rabbitmqctl with the
#           node's name, cookie and epmd port), which tests and benchmarks use instead of
#           a plain `rabbitmqctl`, which would talk to the system's node.
#   down    Stops only the project-local servers this script started; leaves the
#           others alone. Their data is kept for the next `up`. `down stomp` stops only the
#           ActiveMQ.
#   install Installs (as root, with apt-get) the packages `up` would need to start its own
#           servers, and nothing else: for a machine about to lose its network (CI runs `make
#           test` in a loopback-only namespace, see scripts/offline.sh), where `up` could not.
#           With the word `stomp`, ActiveMQ's too.
#   status  Prints what is in use and the state of the project-local servers.
#           Exit 0 when .run/deps.env exists and both URLs answer, 3 otherwise.
#   clean   `down`, then removes .deps/, .run/ and the Postgres data directory.
#
# Where the project-local servers keep their data:
#   RabbitMQ  .deps/rabbitmq/ (the node runs as the invoking user).
#   ActiveMQ  .deps/activemq/ (conf/, data/, activemq.log, console.log; runs as the invoking
#             user).
#   Postgres  as root: /var/tmp/integrations-<hash of the checkout's path>/postgres/,
#             owned by the postgres OS user, because Postgres refuses to run as root and
#             the postgres user may not be able to enter the checkout (e.g. one under
#             /root, mode 0700); .deps/postgres is a symlink to it. As any other user:
#             .deps/postgres/. A directory .deps/postgres made by an earlier deps.sh is
#             kept where it is. (/var/tmp survives reboots, but systemd-tmpfiles may
#             prune files idle for 30 days there: if the cluster no longer starts,
#             `scripts/deps.sh clean`; it holds only throwaway dev/test data.)
#
# Overrides (environment): DEPS_PG_PORT (55432), DEPS_AMQP_PORT (55672),
# DEPS_AMQP_DIST_PORT (55673), DEPS_EPMD_PORT (55674), DEPS_STOMP_PORT (56613), DEPS_PG_BIN (Postgres bin
# dir), DEPS_PG_DIR (Postgres directory for a new cluster, see above),
# DEPS_START_TIMEOUT (seconds to wait for a server to start, 60).
#
# Log lines go to stderr prefixed with "deps:"; server logs go to files under .deps/.
# If packages are missing and we run as root, installs them with apt-get.

set -euo pipefail

# --- settings ---------------------------------------------------------------------

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
DEPS_DIR=$ROOT/.deps
RUN_DIR=$ROOT/.run
ENV_FILE=$RUN_DIR/deps.env

PG_PORT=${DEPS_PG_PORT:-55432}
AMQP_PORT=${DEPS_AMQP_PORT:-55672}
AMQP_DIST_PORT=${DEPS_AMQP_DIST_PORT:-55673}
EPMD_PORT=${DEPS_EPMD_PORT:-55674}
STOMP_PORT=${DEPS_STOMP_PORT:-56613}
START_TIMEOUT=${DEPS_START_TIMEOUT:-60}
DEFAULT_DATABASES=(test integrations)

STD_PG_URL=postgres://postgres@127.0.0.1:5432
STD_AMQP_URL=amqp://guest:guest@127.0.0.1:5672/

# The Postgres directory (see the header): what .deps/postgres is or points to, else
# DEPS_PG_DIR, else (as root) a directory outside the checkout that the postgres user
# can enter. pg_prepare_dir creates it and the .deps/postgres symlink.
CHECKOUT_HASH=$(printf '%s' "$ROOT" | sha1sum | cut -c1-8) # like the hash in scripts/run.sh's names
PG_LINK=$DEPS_DIR/postgres
PG_OUTSIDE_BASE=/var/tmp/integrations-$CHECKOUT_HASH
if [[ -L $PG_LINK ]]; then
  PG_DIR=$(readlink "$PG_LINK")
elif [[ -e $PG_LINK ]]; then
  PG_DIR=$PG_LINK
elif [[ -n ${DEPS_PG_DIR:-} ]]; then
  PG_DIR=$DEPS_PG_DIR
elif [[ $(id -u) -eq 0 ]]; then
  PG_DIR=$PG_OUTSIDE_BASE/postgres
else
  PG_DIR=$PG_LINK
fi
PG_DATA=$PG_DIR/data
PG_SOCK_DIR=$PG_DIR/run
PG_LOG=$PG_DIR/postgres.log
PG_CTL_LOG=$PG_DIR/pg_ctl.log
PG_MARKER=$PG_DIR/started-by-deps

RMQ_DIR=$DEPS_DIR/rabbitmq
RMQ_BIN=/usr/lib/rabbitmq/bin
RMQ_HOME=$RMQ_DIR/home
RMQ_LOG_DIR=$RMQ_DIR/log
RMQ_PID_FILE=$RMQ_DIR/rabbitmq.pid
RMQ_MARKER=$RMQ_DIR/started-by-deps   # also records the ports the node was started with
RMQ_NODENAME=deps@localhost

# Tools like runuser live in sbin, which a bare CI environment may not have on PATH.
export PATH="$PATH:/usr/sbin:/sbin"
if [[ -z ${LANG:-} && -z ${LC_ALL:-} ]]; then
  export LANG=C.UTF-8
fi

# --- helpers ----------------------------------------------------------------------

log() { printf 'deps: %s\n' "$*" >&2; }
die() {
  log "error: $*"
  exit 1
}

usage() {
  sed -n '2,/^$/{s/^# \{0,1\}//;p}' "${BASH_SOURCE[0]}" >&2
}

is_root() { [[ $(id -u) -eq 0 ]]; }

now_us() { local t=${EPOCHREALTIME//[.,]/}; printf '%s' "$t"; }
elapsed() { # start_us -> "1.2s"
  local ms=$((($(now_us) - $1) / 1000))
  printf '%d.%ds' $((ms / 1000)) $((ms % 1000 / 100))
}

# Show the end of a server log on failure (prefixed, so it is clearly ours).
show_log_tail() {
  local f=$1
  [[ -f $f ]] || return 0
  log "last lines of ${f#"$ROOT"/}:"
  tail -n 15 "$f" | sed 's/^/deps:   | /' >&2 || true
}

# TCP connect to host:port.
# shellcheck disable=SC2016 # $1/$2 expand in the child shell
tcp_open() {
  timeout 3 "$BASH" -c 'exec 3<>"/dev/tcp/$1/$2"' tcp-check "$1" "$2" 2>/dev/null
}

# Sends the AMQP 0-9-1 protocol header; a broker answers with a method frame (type 1).
# shellcheck disable=SC2016 # $1/$2 expand in the child shell
amqp_answers() {
  timeout 5 "$BASH" -c '
    exec 3<>"/dev/tcp/$1/$2" || exit 1
    printf "AMQP\0\0\011\001" >&3 || exit 1
    b=$(head -c 1 <&3 | od -An -tx1) || exit 1
    [ "${b// /}" = 01 ]' amqp-check "$1" "$2" 2>/dev/null
}

# amqp[s]://[user:pass@]host[:port][/vhost] -> "host port"
amqp_host_port() {
  local url=$1 re='^(amqps?)://([^@/]*@)?(\[[^]/]*\]|[^:/?]*)(:([0-9]+))?([/?].*)?$'
  [[ $url =~ $re ]] || return 1
  local scheme=${BASH_REMATCH[1]} host=${BASH_REMATCH[3]} port=${BASH_REMATCH[5]}
  host=${host#[}
  host=${host%]}
  [[ -n $host ]] || host=localhost
  if [[ -z $port ]]; then
    if [[ $scheme == amqps ]]; then port=5671; else port=5672; fi
  fi
  printf '%s %s\n' "$host" "$port"
}

amqp_url_ok() {
  local hp
  hp=$(amqp_host_port "$1") || return 1
  # shellcheck disable=SC2086 # "host port"
  amqp_answers $hp
}

# Server URL (no database) + database name -> URL of that database; keeps ?query.
pg_db_url() {
  local url=$1 db=$2 base query=
  base=${url%%\?*}
  [[ $url == *\?* ]] && query=${url#*\?}
  base=${base%/}
  printf '%s/%s%s\n' "$base" "$db" "${query:+?$query}"
}

# --- postgres binaries --------------------------------------------------------------

PG_BIN=
find_pg_bin() { # [major] -> sets PG_BIN
  local want=${1:-} d
  PG_BIN=
  if [[ -n ${DEPS_PG_BIN:-} ]]; then
    [[ -x $DEPS_PG_BIN/postgres ]] || die "DEPS_PG_BIN=$DEPS_PG_BIN has no postgres binary"
    PG_BIN=$DEPS_PG_BIN
    return 0
  fi
  if [[ -n $want ]]; then
    [[ -x /usr/lib/postgresql/$want/bin/postgres ]] && PG_BIN=/usr/lib/postgresql/$want/bin
    [[ -n $PG_BIN ]]
    return
  fi
  if [[ -x /usr/lib/postgresql/15/bin/postgres ]]; then
    PG_BIN=/usr/lib/postgresql/15/bin
    return 0
  fi
  while IFS= read -r d; do
    [[ -x $d/postgres ]] && PG_BIN=$d
  done < <(printf '%s\n' /usr/lib/postgresql/*/bin | sort -V)
  [[ -n $PG_BIN ]]
}

# Client tools: from the server bin dir if there is one, else from PATH.
PSQL=
PG_ISREADY=
find_pg_client() {
  if find_pg_bin && [[ -x $PG_BIN/psql && -x $PG_BIN/pg_isready ]]; then
    PSQL=$PG_BIN/psql
    PG_ISREADY=$PG_BIN/pg_isready
  elif command -v psql >/dev/null 2>&1 && command -v pg_isready >/dev/null 2>&1; then
    PSQL=$(command -v psql)
    PG_ISREADY=$(command -v pg_isready)
  else
    return 1
  fi
}

APT_UPDATED=
# ensure_packages postgres|rabbitmq...
ensure_packages() {
  local what pkgs=()
  for what in "$@"; do
    case $what in
      postgres) find_pg_bin || pkgs+=(postgresql) ;;
      rabbitmq) [[ -x $RMQ_BIN/rabbitmq-server ]] || pkgs+=(rabbitmq-server) ;;
      activemq)
        [[ -f $AMQ_JAR ]] && command -v java >/dev/null 2>&1 || pkgs+=(activemq)
        # Not dependencies of Debian's activemq, but its STOMP connector needs them to turn an
        # advisory message into a frame (jms-advisory-json); see amq_link_libs. Installed when we
        # can; without them only the advisories are missing, which is no reason to stop.
        if is_root && ! [[ -f $AMQ_XSTREAM_JAR && -f $AMQ_JETTISON_JAR ]]; then
          pkgs+=(libxstream-java libjettison-java)
        fi ;;
      *) die "internal: unknown package group $what" ;;
    esac
  done
  ((${#pkgs[@]})) || return 0
  if ! is_root; then
    die "missing ${pkgs[*]} (no /usr/lib/postgresql/*/bin/postgres, $RMQ_BIN/rabbitmq-server or $AMQ_JAR with java); install with: sudo apt-get update && sudo apt-get install -y ${pkgs[*]}"
  fi
  command -v apt-get >/dev/null 2>&1 || die "missing ${pkgs[*]} and no apt-get; install PostgreSQL 15, RabbitMQ 3.10 (and for STOMP ActiveMQ Classic 5.17) by hand"
  mkdir -p "$DEPS_DIR"
  local t0 apt_log=$DEPS_DIR/apt.log
  t0=$(now_us)
  log "installing ${pkgs[*]} with apt-get (log: ${apt_log#"$ROOT"/})"
  if [[ -z $APT_UPDATED ]]; then
    DEBIAN_FRONTEND=noninteractive apt-get update >>"$apt_log" 2>&1 ||
      { show_log_tail "$apt_log"; die "apt-get update failed"; }
    APT_UPDATED=1
  fi
  DEBIAN_FRONTEND=noninteractive apt-get install -y "${pkgs[@]}" >>"$apt_log" 2>&1 ||
    { show_log_tail "$apt_log"; die "apt-get install -y ${pkgs[*]} failed"; }
  log "installed ${pkgs[*]} in $(elapsed "$t0")"
}

# Runs a command as the postgres OS user when we are root (initdb/postgres refuse root).
as_pg_user() {
  if is_root; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

# As root: the postgres user must reach $1 through every parent directory.
check_pg_user_access() {
  local dir=$1 d culprit=
  is_root || return 0
  id -u postgres >/dev/null 2>&1 || die "there is no 'postgres' OS user (is the postgresql package installed?)"
  command -v runuser >/dev/null 2>&1 || die "runuser (util-linux) not found; it is needed to run initdb as the postgres user"
  runuser -u postgres -- test -x "$dir" -a -w "$dir" && return 0
  d=$dir
  while [[ -n $d && $d != / ]]; do
    runuser -u postgres -- test -x "$d" || culprit=$d
    d=$(dirname "$d")
  done
  if [[ -n $culprit ]]; then
    die "the postgres OS user cannot enter $culprit ($(stat -c '%A %U:%G' "$culprit")), so it cannot use $dir; start over with a cluster it can reach (scripts/deps.sh clean; see DEPS_PG_DIR in scripts/deps.sh help) or run: chmod o+x $culprit"
  fi
  die "the postgres OS user cannot write to $dir"
}

# --- project-local postgres ---------------------------------------------------------

pg_local_port() { # port of the running project-local postmaster (from postmaster.pid)
  [[ -f $PG_DATA/postmaster.pid ]] || return 1
  sed -n 4p "$PG_DATA/postmaster.pid"
}

pg_local_running() {
  [[ -f $PG_DATA/postmaster.pid && -f $PG_DATA/PG_VERSION ]] || return 1
  find_pg_bin "$(cat "$PG_DATA/PG_VERSION")" || find_pg_bin || return 1
  as_pg_user "$PG_BIN/pg_ctl" -D "$PG_DATA" status >/dev/null 2>&1
}

pg_ready() { # port
  "$PG_ISREADY" -q -h 127.0.0.1 -p "$1" -t 3
}

pg_url_ok() {
  PGCONNECT_TIMEOUT=5 "$PSQL" -X -q -A -t -v ON_ERROR_STOP=1 \
    -d "$(pg_db_url "$1" postgres)" -c 'select 1' >/dev/null 2>&1
}

pg_write_settings() {
  local sock_dir=$PG_SOCK_DIR conf=$PG_DATA/deps.conf
  # unix socket paths are limited to 107 bytes; without room, listen on TCP only.
  if ((${#sock_dir} + 20 > 107)); then
    log "warning: ${sock_dir} is too long for a unix socket; Postgres listens on TCP only"
    sock_dir=
  fi
  cat >"$conf" <<EOF
# Written by scripts/deps.sh on every start; a throwaway dev/test cluster.
port = $PG_PORT
listen_addresses = '127.0.0.1'
unix_socket_directories = '${sock_dir//\'/\'\'}'
fsync = off
synchronous_commit = off
full_page_writes = off
logging_collector = off
EOF
  if ! grep -q "^include_if_exists = 'deps.conf'" "$PG_DATA/postgresql.conf"; then
    printf "\ninclude_if_exists = 'deps.conf'\n" >>"$PG_DATA/postgresql.conf"
  fi
  if is_root; then chown postgres:postgres "$conf"; fi
}

# Creates the Postgres directory (where: see the header) and, for one outside .deps/, the
# .deps/postgres symlink that records where it is. /var/tmp is writable by everyone: the
# directory there is created by us or must already be ours, never one someone else planted.
pg_prepare_dir() {
  [[ $PG_DIR == /* ]] || die "the Postgres directory must be an absolute path (DEPS_PG_DIR=$PG_DIR)"
  mkdir -p "$DEPS_DIR"
  if [[ $PG_DIR != "$PG_LINK" ]]; then
    if [[ $PG_DIR == "$PG_OUTSIDE_BASE"/* ]]; then
      [[ -e $PG_OUTSIDE_BASE || -L $PG_OUTSIDE_BASE ]] || mkdir -m 0755 "$PG_OUTSIDE_BASE" ||
        die "cannot create $PG_OUTSIDE_BASE"
      if [[ -L $PG_OUTSIDE_BASE || ! -d $PG_OUTSIDE_BASE || $(stat -c %u "$PG_OUTSIDE_BASE") != "$(id -u)" ]]; then
        die "$PG_OUTSIDE_BASE exists but is not a directory of this user ($(stat -c '%F, owner %U' "$PG_OUTSIDE_BASE")); remove it or choose another place with DEPS_PG_DIR=..."
      fi
    fi
    mkdir -p "$PG_DIR"
    [[ -L $PG_LINK ]] || ln -s "$PG_DIR" "$PG_LINK"
  fi
  mkdir -p "$PG_DIR" "$PG_SOCK_DIR"
  if is_root; then
    chown postgres:postgres "$PG_DIR" "$PG_SOCK_DIR"
    chmod 0700 "$PG_DIR"
  fi
  check_pg_user_access "$PG_DIR"
}

pg_start_local() {
  local t0 ver bin_ver
  ensure_packages postgres
  pg_prepare_dir

  if [[ -f $PG_DATA/PG_VERSION ]]; then
    ver=$(cat "$PG_DATA/PG_VERSION")
    find_pg_bin "$ver" ||
      die "${PG_DATA#"$ROOT"/} was created by PostgreSQL $ver, whose binaries are not installed; remove it with: scripts/deps.sh clean"
  else
    find_pg_bin || die "no PostgreSQL binaries under /usr/lib/postgresql/*/bin"
    t0=$(now_us)
    log "initialising a Postgres cluster in ${PG_DATA#"$ROOT"/}"
    rm -rf "$PG_DATA"
    as_pg_user "$PG_BIN/initdb" -D "$PG_DATA" -U postgres -A trust -E UTF8 --locale=C.UTF-8 \
      >"$PG_DIR/initdb.log" 2>&1 9>&- ||
      { show_log_tail "$PG_DIR/initdb.log"; die "initdb failed (log: ${PG_DIR#"$ROOT"/}/initdb.log)"; }
    log "initdb took $(elapsed "$t0")"
  fi
  bin_ver=$("$PG_BIN/postgres" --version | sed -E 's/.* ([0-9]+)(\.[0-9]+)*.*/\1/')
  [[ $bin_ver == "$(cat "$PG_DATA/PG_VERSION")" ]] ||
    die "${PG_DATA#"$ROOT"/} is PostgreSQL $(cat "$PG_DATA/PG_VERSION") but $PG_BIN is $bin_ver; remove it with: scripts/deps.sh clean"

  if tcp_open 127.0.0.1 "$PG_PORT"; then
    die "port $PG_PORT on 127.0.0.1 is taken by another program; pick a free one with DEPS_PG_PORT=..."
  fi
  pg_write_settings

  t0=$(now_us)
  log "starting Postgres on 127.0.0.1:$PG_PORT (log: ${PG_LOG#"$ROOT"/})"
  : >"$PG_MARKER"
  STARTED_PG=1
  if ! as_pg_user "$PG_BIN/pg_ctl" -D "$PG_DATA" -l "$PG_LOG" -w -t "$START_TIMEOUT" start \
    </dev/null >>"$PG_CTL_LOG" 2>&1 9>&-; then
    show_log_tail "$PG_LOG"
    pg_local_running || rm -f "$PG_MARKER"
    die "Postgres did not start (logs: ${PG_LOG#"$ROOT"/}, ${PG_CTL_LOG#"$ROOT"/})"
  fi
  pg_ready "$PG_PORT" || die "Postgres started but does not answer on 127.0.0.1:$PG_PORT"
  log "Postgres started in $(elapsed "$t0")"
}

pg_stop_local() {
  [[ -f $PG_MARKER ]] || return 1
  if pg_local_running; then
    local t0
    t0=$(now_us)
    log "stopping the project-local Postgres"
    as_pg_user "$PG_BIN/pg_ctl" -D "$PG_DATA" -m fast -w -t "$START_TIMEOUT" stop \
      </dev/null >>"$PG_CTL_LOG" 2>&1 9>&- ||
      die "pg_ctl stop failed (log: ${PG_CTL_LOG#"$ROOT"/})"
    log "Postgres stopped in $(elapsed "$t0")"
  else
    log "the project-local Postgres had already stopped"
  fi
  rm -f "$PG_MARKER"
}

# --- project-local rabbitmq ---------------------------------------------------------

# Ports of the project-local node: the recorded ones if it was started by us.
rmq_load_ports() {
  if [[ -f $RMQ_MARKER ]]; then
    local k v
    while IFS='=' read -r k v; do
      case $k in
        AMQP_PORT) AMQP_PORT=$v ;;
        AMQP_DIST_PORT) AMQP_DIST_PORT=$v ;;
        EPMD_PORT) EPMD_PORT=$v ;;
        *) ;;
      esac
    done <"$RMQ_MARKER"
  fi
}

rmq_env() { # the complete environment the node runs in (nothing from /etc/rabbitmq)
  printf '%s\n' \
    "PATH=$PATH" \
    "LANG=C.UTF-8" \
    "HOME=$RMQ_HOME" \
    "RABBITMQ_NODENAME=$RMQ_NODENAME" \
    "RABBITMQ_NODE_IP_ADDRESS=127.0.0.1" \
    "RABBITMQ_NODE_PORT=$AMQP_PORT" \
    "RABBITMQ_DIST_PORT=$AMQP_DIST_PORT" \
    "ERL_EPMD_PORT=$EPMD_PORT" \
    "ERL_EPMD_ADDRESS=127.0.0.1" \
    "RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS=-kernel inet_dist_use_interface {127,0,0,1}" \
    "RABBITMQ_CONFIG_FILE=$RMQ_DIR/rabbitmq.conf" \
    "RABBITMQ_ADVANCED_CONFIG_FILE=$RMQ_DIR/advanced.config" \
    "RABBITMQ_CONF_ENV_FILE=$RMQ_DIR/rabbitmq-env.conf" \
    "RABBITMQ_ENABLED_PLUGINS_FILE=$RMQ_DIR/enabled_plugins" \
    "RABBITMQ_MNESIA_BASE=$RMQ_DIR/mnesia" \
    "RABBITMQ_LOG_BASE=$RMQ_LOG_DIR" \
    "RABBITMQ_PID_FILE=$RMQ_PID_FILE"
}

# Every live process of our node, found by the environment it was started with:
# the rabbitmq-server wrapper (sh), the VM (beam.smp) and its helpers, and epmd.
# This also works for a node started in another network namespace.
rmq_all_pids() {
  local f
  while IFS= read -r f; do
    f=${f#/proc/}
    printf '%s\n' "${f%/environ}"
  done < <(grep -lzxF "RABBITMQ_PID_FILE=$RMQ_PID_FILE" /proc/[0-9]*/environ 2>/dev/null || true)
}

rmq_pids_by_comm() { # [!]comm -> our pids whose command name is (not) comm
  local want=$1 p comm
  while IFS= read -r p; do
    comm=$(cat "/proc/$p/comm" 2>/dev/null) || continue
    if [[ $want == !* ]]; then
      [[ $comm != "${want#!}" ]] && printf '%s\n' "$p"
    else
      [[ $comm == "$want" ]] && printf '%s\n' "$p"
    fi
  done < <(rmq_all_pids)
  return 0
}

# pid of the VM: from the pid file if it names one of ours, else found by environment.
rmq_pid() {
  local pid beams
  beams=$(rmq_pids_by_comm beam.smp)
  [[ -n $beams ]] || return 1
  if [[ -f $RMQ_PID_FILE ]]; then
    pid=$(tr -dc '0-9' <"$RMQ_PID_FILE")
    if [[ -n $pid ]] && grep -qx "$pid" <<<"$beams"; then
      printf '%s\n' "$pid"
      return 0
    fi
  fi
  head -n 1 <<<"$beams"
}

rmq_local_running() { [[ -n $(rmq_pids_by_comm '!epmd') ]]; }

# rabbitmqctl for the project-local node: the node's environment (its name, the cookie in
# its HOME, its epmd port), so that a call reaches this node and not the system's. Tests and
# benchmarks run it as $INTEGRATIONS_RABBITMQCTL (written to .run/deps.env).
RMQ_CTL=$RMQ_DIR/rabbitmqctl
rmq_write_ctl() {
  local line tmp=$RMQ_CTL.tmp.$$
  {
    printf '#!/usr/bin/env bash\n'
    printf '# Written by scripts/deps.sh: rabbitmqctl for the project-local node %s.\n' "$RMQ_NODENAME"
    printf 'exec env -i'
    while IFS= read -r line; do
      printf ' \\\n  %q' "$line"
    done < <(rmq_env)
    printf ' \\\n  %q "$@"\n' "$RMQ_BIN/rabbitmqctl"
  } >"$tmp"
  chmod 0755 "$tmp"
  mv -f "$tmp" "$RMQ_CTL"
}

RMQ_STARTING_PID=
RMQ_T0=
rmq_spawn_local() {
  ensure_packages rabbitmq
  mkdir -p "$DEPS_DIR" "$RMQ_DIR" "$RMQ_HOME" "$RMQ_LOG_DIR" "$RMQ_DIR/mnesia"
  local p
  for p in "$AMQP_PORT" "$AMQP_DIST_PORT" "$EPMD_PORT"; do
    if tcp_open 127.0.0.1 "$p"; then
      die "port $p on 127.0.0.1 is taken by another program; pick free ones with DEPS_AMQP_PORT / DEPS_AMQP_DIST_PORT / DEPS_EPMD_PORT"
    fi
  done
  [[ -f $RMQ_DIR/rabbitmq-env.conf ]] || : >"$RMQ_DIR/rabbitmq-env.conf"
  [[ -f $RMQ_DIR/enabled_plugins ]] || printf '[].\n' >"$RMQ_DIR/enabled_plugins"
  cat >"$RMQ_DIR/rabbitmq.conf" <<EOF
# Written by scripts/deps.sh on every start; a throwaway dev/test node.
# The AMQP listener comes from RABBITMQ_NODE_IP_ADDRESS/RABBITMQ_NODE_PORT.
loopback_users.guest = true
EOF
  printf 'AMQP_PORT=%s\nAMQP_DIST_PORT=%s\nEPMD_PORT=%s\n' \
    "$AMQP_PORT" "$AMQP_DIST_PORT" "$EPMD_PORT" >"$RMQ_MARKER"
  rm -f "$RMQ_PID_FILE"

  local env_lines=()
  mapfile -t env_lines < <(rmq_env)
  RMQ_T0=$(now_us)
  log "starting RabbitMQ on 127.0.0.1:$AMQP_PORT (logs: ${RMQ_LOG_DIR#"$ROOT"/}/)"
  (cd "$RMQ_DIR" && exec env -i "${env_lines[@]}" setsid "$RMQ_BIN/rabbitmq-server" \
    </dev/null >>"$RMQ_LOG_DIR/console.log" 2>&1 9>&-) &
  RMQ_STARTING_PID=$!
  STARTED_RMQ=1
}

rmq_wait_local() {
  local deadline=$((SECONDS + START_TIMEOUT))
  while ! amqp_answers 127.0.0.1 "$AMQP_PORT"; do
    if ! kill -0 "$RMQ_STARTING_PID" 2>/dev/null; then
      show_log_tail "$RMQ_LOG_DIR/console.log"
      show_log_tail "$RMQ_LOG_DIR/$RMQ_NODENAME.log"
      rmq_kill_epmd
      rm -f "$RMQ_MARKER"
      die "RabbitMQ exited during start (logs: ${RMQ_LOG_DIR#"$ROOT"/}/)"
    fi
    if ((SECONDS >= deadline)); then
      show_log_tail "$RMQ_LOG_DIR/$RMQ_NODENAME.log"
      rmq_stop_local || true
      die "RabbitMQ did not accept AMQP connections on 127.0.0.1:$AMQP_PORT within ${START_TIMEOUT}s (logs: ${RMQ_LOG_DIR#"$ROOT"/}/)"
    fi
    sleep 0.2
  done
  log "RabbitMQ started in $(elapsed "$RMQ_T0")"
}

# Stops the private epmd: `epmd -kill` on its port, or by its environment if that
# port is not reachable from here (e.g. it was started in another network namespace).
rmq_kill_epmd() {
  local epmd p
  epmd=$(command -v epmd || true)
  if [[ -n $epmd ]] && ERL_EPMD_PORT=$EPMD_PORT ERL_EPMD_ADDRESS=127.0.0.1 "$epmd" -kill >/dev/null 2>&1; then
    return 0
  fi
  for p in $(rmq_pids_by_comm epmd); do
    kill -TERM "$p" 2>/dev/null || true
  done
}

rmq_stop_local() {
  [[ -f $RMQ_MARKER ]] || return 1
  rmq_load_ports
  local t0 deadline next=0 pids beam
  t0=$(now_us)
  deadline=$((SECONDS + START_TIMEOUT))
  pids=$(rmq_pids_by_comm '!epmd')
  if [[ -n $pids ]]; then
    log "stopping the project-local RabbitMQ"
    while [[ -n $pids ]]; do
      if ((SECONDS >= deadline)); then
        log "warning: RabbitMQ did not stop within ${START_TIMEOUT}s; killing it"
        # shellcheck disable=SC2086 # one pid per word
        kill -KILL $pids 2>/dev/null || true
        sleep 0.5
        break
      fi
      if ((SECONDS >= next)); then
        # TERM to the VM shuts the node down cleanly and the wrapper exits after it.
        # A TERM that arrives while the VM is still booting can be lost: repeat it.
        beam=$(rmq_pid || true)
        # shellcheck disable=SC2086 # one pid per word
        kill -TERM ${beam:-$pids} 2>/dev/null || true
        next=$((SECONDS + 5))
      fi
      sleep 0.2
      pids=$(rmq_pids_by_comm '!epmd')
    done
    log "RabbitMQ stopped in $(elapsed "$t0")"
  else
    log "the project-local RabbitMQ had already stopped"
  fi
  rmq_kill_epmd
  rm -f "$RMQ_MARKER" "$RMQ_PID_FILE"
}

# --- project-local ActiveMQ (a STOMP broker, only when asked for: `up stomp`) --------

AMQ_DIR=$DEPS_DIR/activemq
AMQ_HOME=/usr/share/activemq
AMQ_JAR=$AMQ_HOME/bin/activemq.jar
AMQ_CONF_SRC=/etc/activemq/instances-available/main
AMQ_XSTREAM_JAR=/usr/share/java/xstream.jar
AMQ_JETTISON_JAR=/usr/share/java/jettison.jar
AMQ_LOG=$AMQ_DIR/console.log
AMQ_BROKER_LOG=$AMQ_DIR/activemq.log
AMQ_PID_FILE=$AMQ_DIR/activemq.pid
AMQ_MARKER=$AMQ_DIR/started-by-deps # also records the port it was started with
AMQ_USER=admin
AMQ_PASS=admin

# Sends a STOMP 1.2 CONNECT (with the login, if given); a broker answers CONNECTED.
# shellcheck disable=SC2016 # $1..$4 expand in the child shell
stomp_answers() { # host port [login passcode]
  timeout 5 "$BASH" -c '
    exec 3<>"/dev/tcp/$1/$2" || exit 1
    printf "CONNECT\naccept-version:1.2\nhost:%s\n" "$1" >&3 || exit 1
    if [ -n "${3:-}" ]; then printf "login:%s\npasscode:%s\n" "$3" "${4:-}" >&3 || exit 1; fi
    printf "\n\0" >&3 || exit 1
    IFS= read -r line <&3 || exit 1
    line=${line%$'\''\r'\''}
    printf "DISCONNECT\n\n\0" >&3 || true
    [ "$line" = CONNECTED ]' stomp-check "$@" 2>/dev/null
}

# stomp://[user:pass@]host[:port] answers a CONNECT with those credentials. (A stomp+ssl://
# URL from the environment is taken as given: bash cannot speak TLS.)
stomp_url_ok() {
  local url=$1 re='^stomp://(([^:@/]*)(:([^@/]*))?@)?(\[[^]/]*\]|[^:/?]*)(:([0-9]+))?/?$'
  [[ $url == stomp+ssl://* ]] && return 0
  [[ $url =~ $re ]] || return 1
  local user=${BASH_REMATCH[2]} pass=${BASH_REMATCH[4]} host=${BASH_REMATCH[5]} port=${BASH_REMATCH[7]}
  host=${host#[}
  host=${host%]}
  stomp_answers "${host:-localhost}" "${port:-61613}" "$user" "$pass"
}

amq_load_port() {
  if [[ -f $AMQ_MARKER ]]; then
    local k v
    while IFS='=' read -r k v; do
      [[ $k == STOMP_PORT ]] && STOMP_PORT=$v
    done <"$AMQ_MARKER"
  fi
  return 0
}

# pids of the java whose command line names this checkout's ActiveMQ directory (found so, it
# works for one started in another network namespace, or after its pid file was lost).
amq_pids() {
  local f
  while IFS= read -r f; do
    f=${f#/proc/}
    printf '%s\n' "${f%/cmdline}"
  done < <(grep -lzxF -- "-Dactivemq.base=$AMQ_DIR" /proc/[0-9]*/cmdline 2>/dev/null || true)
}

amq_local_running() { [[ -n $(amq_pids) ]]; }

# Who holds a port, for the messages: a project-local ActiveMQ of some checkout, or not.
amq_port_holder() { # port
  local f base netns
  netns=$(readlink /proc/self/ns/net 2>/dev/null || true)
  while IFS= read -r f; do
    # Only one of our network namespace can hold our port: an ActiveMQ in another namespace
    # (scripts/offline.sh runs make test under `unshare -n`) holds its own port 56613, not ours.
    [[ $(readlink "${f%/cmdline}/ns/net" 2>/dev/null || true) == "$netns" ]] || continue
    base=$(tr '\0' '\n' <"$f" 2>/dev/null | sed -n 's/^-Dactivemq.base=//p' | head -n 1)
    [[ -n $base ]] || continue
    if grep -qx "STOMP_PORT=$1" "$base/started-by-deps" 2>/dev/null; then
      f=${f#/proc/}
      printf 'the project-local ActiveMQ of %s (pid %s)\n' "${base%/.deps/activemq}" "${f%/cmdline}"
      return 0
    fi
  done < <(grep -lzF -- "-Dactivemq.base=" /proc/[0-9]*/cmdline 2>/dev/null || true)
  printf 'another program\n'
}

# The broker's files: Debian's instance configuration with the scheduler on, only a STOMP
# connector on our port (no OpenWire on 61616, no web console: nothing on standard ports),
# one user, and its data and logs under .deps/activemq.
amq_write_conf() {
  mkdir -p "$AMQ_DIR/conf" "$AMQ_DIR/data" "$AMQ_DIR/tmp"
  local src=$AMQ_CONF_SRC/activemq.xml
  [[ -f $src ]] || src=$AMQ_HOME/conf/activemq.xml
  [[ -f $src ]] || die "no activemq.xml in $AMQ_CONF_SRC or $AMQ_HOME/conf (is the activemq package installed?)"
  cat >"$AMQ_DIR/conf/activemq.xml" <<EOF
<?xml version="1.0" encoding="UTF-8"?>
<!-- Written by scripts/deps.sh on every start, after $src: a throwaway dev/test broker. -->
<beans xmlns="http://www.springframework.org/schema/beans"
  xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
  xsi:schemaLocation="http://www.springframework.org/schema/beans http://www.springframework.org/schema/beans/spring-beans-2.0.xsd
  http://activemq.apache.org/schema/core http://activemq.apache.org/schema/core/activemq-core.xsd">
  <bean class="org.springframework.beans.factory.config.PropertyPlaceholderConfigurer"/>
  <broker xmlns="http://activemq.apache.org/schema/core" useJmx="false" brokerName="deps"
          schedulerSupport="true" dataDirectory="\${activemq.data}">
    <persistenceAdapter>
      <kahaDB directory="\${activemq.data}/kahadb"/>
    </persistenceAdapter>
    <!-- Bounds of a test broker, so its behaviour does not follow the machine's free disk. -->
    <systemUsage>
      <systemUsage>
        <memoryUsage><memoryUsage percentOfJvmHeap="70"/></memoryUsage>
        <storeUsage><storeUsage limit="2 gb"/></storeUsage>
        <tempUsage><tempUsage limit="1 gb"/></tempUsage>
      </systemUsage>
    </systemUsage>
    <plugins>
      <simpleAuthenticationPlugin>
        <users>
          <authenticationUser username="$AMQ_USER" password="$AMQ_PASS" groups="admins"/>
        </users>
      </simpleAuthenticationPlugin>
    </plugins>
    <transportConnectors>
      <!-- tcpNoDelay: without it the broker's small frames wait on Nagle's algorithm behind the
           client's delayed TCP ack: an ACK's RECEIPT and the next MESSAGE took ~44 ms, 2 ms with it
           (docs/decisions.md, "ActiveMQ's transport needs tcpNoDelay"). -->
      <transportConnector name="stomp" uri="stomp://127.0.0.1:$STOMP_PORT?transport.tcpNoDelay=true"/>
    </transportConnectors>
  </broker>
</beans>
EOF
  # Debian's build logs through log4j 1.2 (the instance's log4j2.properties is not read).
  cat >"$AMQ_DIR/conf/log4j.properties" <<EOF
# Written by scripts/deps.sh on every start.
log4j.rootLogger=INFO, file
log4j.logger.org.springframework=WARN
log4j.logger.org.apache.xbean=WARN
log4j.appender.file=org.apache.log4j.FileAppender
log4j.appender.file.File=$AMQ_BROKER_LOG
log4j.appender.file.layout=org.apache.log4j.PatternLayout
log4j.appender.file.layout.ConversionPattern=%d | %-5p | %m | %c | %t%n
EOF
}

# ActiveMQ sends an advisory (a consumer came or went, with the queue's consumerCount) to a STOMP
# subscriber only through its JSON translator, which needs xstream and jettison; Debian's activemq
# leaves them off its class path (the subscriber's connection fails with NoClassDefFoundError).
# The broker's launcher adds the jars of ${activemq.base}/lib: link them there. The advisories are
# how a STOMP client counts a queue's consumers (bench-mq starts its clock on it).
amq_link_libs() {
  if ! [[ -f $AMQ_XSTREAM_JAR && -f $AMQ_JETTISON_JAR ]]; then
    log "warning: no $AMQ_XSTREAM_JAR or $AMQ_JETTISON_JAR (apt-get install libxstream-java libjettison-java): this ActiveMQ will not send advisories over STOMP (bench-mq's STOMP port rows need them)"
    return 0
  fi
  mkdir -p "$AMQ_DIR/lib"
  ln -sf "$AMQ_XSTREAM_JAR" "$AMQ_JETTISON_JAR" "$AMQ_DIR/lib/"
}

AMQ_STARTING_PID=
AMQ_T0=
amq_spawn_local() {
  ensure_packages activemq
  mkdir -p "$AMQ_DIR"
  amq_write_conf
  amq_link_libs
  printf 'STOMP_PORT=%s\n' "$STOMP_PORT" >"$AMQ_MARKER"
  rm -f "$AMQ_PID_FILE"
  AMQ_T0=$(now_us)
  log "starting ActiveMQ, STOMP on 127.0.0.1:$STOMP_PORT (logs: ${AMQ_LOG#"$ROOT"/}, ${AMQ_BROKER_LOG#"$ROOT"/})"
  (cd "$AMQ_DIR" && exec setsid java -Xmx256M \
    -Dactivemq.base="$AMQ_DIR" -Dactivemq.home="$AMQ_HOME" -Dactivemq.conf="$AMQ_DIR/conf" \
    -Dactivemq.data="$AMQ_DIR/data" -Djava.io.tmpdir="$AMQ_DIR/tmp" \
    -Dlog4j.configuration="file:$AMQ_DIR/conf/log4j.properties" \
    -jar "$AMQ_JAR" start "xbean:file:$AMQ_DIR/conf/activemq.xml" \
    </dev/null >>"$AMQ_LOG" 2>&1 9>&-) &
  AMQ_STARTING_PID=$!
  printf '%s\n' "$AMQ_STARTING_PID" >"$AMQ_PID_FILE"
  STARTED_AMQ=1
}

amq_wait_local() {
  local deadline=$((SECONDS + START_TIMEOUT))
  while ! stomp_answers 127.0.0.1 "$STOMP_PORT" "$AMQ_USER" "$AMQ_PASS"; do
    if ! kill -0 "$AMQ_STARTING_PID" 2>/dev/null; then
      show_log_tail "$AMQ_LOG"
      show_log_tail "$AMQ_BROKER_LOG"
      rm -f "$AMQ_MARKER" "$AMQ_PID_FILE"
      die "ActiveMQ exited during start (log: ${AMQ_LOG#"$ROOT"/})"
    fi
    if ((SECONDS >= deadline)); then
      show_log_tail "$AMQ_BROKER_LOG"
      amq_stop_local || true
      die "ActiveMQ did not answer STOMP on 127.0.0.1:$STOMP_PORT within ${START_TIMEOUT}s (log: ${AMQ_LOG#"$ROOT"/})"
    fi
    sleep 0.5
  done
  log "ActiveMQ started in $(elapsed "$AMQ_T0")"
}

# Stops this checkout's ActiveMQ by pid (TERM; KILL past the timeout) and waits for it to exit.
amq_stop_local() {
  [[ -f $AMQ_MARKER ]] || return 1
  local t0 deadline pids killed=
  t0=$(now_us)
  deadline=$((SECONDS + START_TIMEOUT))
  pids=$(amq_pids)
  if [[ -n $pids ]]; then
    log "stopping the project-local ActiveMQ"
    # shellcheck disable=SC2086 # one pid per word
    kill -TERM $pids 2>/dev/null || true
    while [[ -n $pids ]]; do
      if [[ -z $killed ]] && ((SECONDS >= deadline)); then
        log "warning: ActiveMQ did not stop within ${START_TIMEOUT}s; killing it"
        # shellcheck disable=SC2086 # one pid per word
        kill -KILL $pids 2>/dev/null || true
        killed=1
      fi
      sleep 0.2
      pids=$(amq_pids)
    done
    log "ActiveMQ stopped in $(elapsed "$t0")"
  else
    log "the project-local ActiveMQ had already stopped"
  fi
  rm -f "$AMQ_MARKER" "$AMQ_PID_FILE"
}

# --- choosing -----------------------------------------------------------------------

PG_URL=
PG_SOURCE=
resolve_pg() {
  if ! find_pg_client; then
    ensure_packages postgres
    find_pg_client || die "psql/pg_isready not found"
  fi
  if [[ -n ${INTEGRATIONS_PG_URL:-} ]]; then
    if pg_url_ok "$INTEGRATIONS_PG_URL"; then
      PG_URL=${INTEGRATIONS_PG_URL%/}
      PG_SOURCE="from the environment"
      log "Postgres: using INTEGRATIONS_PG_URL from the environment"
      return 0
    fi
    log "warning: INTEGRATIONS_PG_URL is set but does not answer; looking further"
  fi
  if pg_ready 5432 && pg_url_ok "$STD_PG_URL"; then
    PG_URL=$STD_PG_URL
    PG_SOURCE="standard local server"
    log "Postgres: using the standard local server on 127.0.0.1:5432"
    return 0
  fi
  if pg_local_running; then
    local port
    port=$(pg_local_port)
    if pg_ready "$port" && pg_url_ok "postgres://postgres@127.0.0.1:$port"; then
      PG_URL=postgres://postgres@127.0.0.1:$port
      PG_SOURCE="project-local server in $PG_DIR"
      log "Postgres: using the project-local server on 127.0.0.1:$port"
      return 0
    fi
    die "the project-local Postgres runs (pid $(sed -n 1p "$PG_DATA/postmaster.pid")) but does not answer on 127.0.0.1:$port (started in another network namespace?); stop it with: scripts/deps.sh down"
  fi
  pg_start_local
  PG_URL=postgres://postgres@127.0.0.1:$PG_PORT
  PG_SOURCE="project-local server in $PG_DIR, started by deps.sh"
}

AMQP_URL=
AMQP_SOURCE=
# Decides, and if a node has to be started, spawns it; rmq_wait_local finishes.
resolve_amqp_begin() {
  if [[ -n ${INTEGRATIONS_AMQP_URL:-} ]]; then
    if amqp_url_ok "$INTEGRATIONS_AMQP_URL"; then
      AMQP_URL=$INTEGRATIONS_AMQP_URL
      AMQP_SOURCE="from the environment"
      log "RabbitMQ: using INTEGRATIONS_AMQP_URL from the environment"
      return 0
    fi
    log "warning: INTEGRATIONS_AMQP_URL is set but does not answer; looking further"
  fi
  if amqp_answers 127.0.0.1 5672; then
    AMQP_URL=$STD_AMQP_URL
    AMQP_SOURCE="standard local server"
    log "RabbitMQ: using the standard local server on 127.0.0.1:5672"
    return 0
  fi
  if rmq_local_running; then
    rmq_load_ports
    if amqp_answers 127.0.0.1 "$AMQP_PORT"; then
      AMQP_URL=amqp://guest:guest@127.0.0.1:$AMQP_PORT/
      AMQP_SOURCE="project-local server in .deps/rabbitmq"
      log "RabbitMQ: using the project-local server on 127.0.0.1:$AMQP_PORT"
      return 0
    fi
    die "the project-local RabbitMQ runs (pid $(rmq_pid || true)) but does not answer on 127.0.0.1:$AMQP_PORT (still starting, or in another network namespace?); stop it with: scripts/deps.sh down"
  fi
  rmq_spawn_local
  AMQP_URL=amqp://guest:guest@127.0.0.1:$AMQP_PORT/
  AMQP_SOURCE="project-local server in .deps/rabbitmq, started by deps.sh"
}

resolve_amqp_end() {
  if [[ -n $RMQ_STARTING_PID ]]; then rmq_wait_local; fi
  if [[ $AMQP_SOURCE == project-local* ]]; then rmq_write_ctl; fi
}

STOMP_URL=
STOMP_SOURCE=
# Only for `up stomp`, or when this checkout's ActiveMQ already runs: the first of
# INTEGRATIONS_STOMP_URL if it answers, this checkout's ActiveMQ, one it starts now. A port taken
# by another checkout's ActiveMQ (a CI clone whose run was cut before its `make test` trap) is
# reused when it answers STOMP with our login; taken by anything else, the next free port is used.
resolve_stomp_begin() {
  local want=$1
  if [[ -n ${INTEGRATIONS_STOMP_URL:-} ]]; then
    if stomp_url_ok "$INTEGRATIONS_STOMP_URL"; then
      STOMP_URL=$INTEGRATIONS_STOMP_URL
      STOMP_SOURCE="from the environment"
      log "STOMP: using INTEGRATIONS_STOMP_URL from the environment"
      return 0
    fi
    log "warning: INTEGRATIONS_STOMP_URL is set but does not answer; looking further"
  fi
  if amq_local_running; then
    amq_load_port
    if stomp_answers 127.0.0.1 "$STOMP_PORT" "$AMQ_USER" "$AMQ_PASS"; then
      STOMP_URL=stomp://$AMQ_USER:$AMQ_PASS@127.0.0.1:$STOMP_PORT
      STOMP_SOURCE="project-local server in .deps/activemq"
      log "STOMP: using the project-local ActiveMQ on 127.0.0.1:$STOMP_PORT"
      return 0
    fi
    [[ -n $want ]] || return 0
    die "the project-local ActiveMQ runs (pid $(amq_pids | head -n 1)) but does not answer STOMP on 127.0.0.1:$STOMP_PORT (still starting, or in another network namespace?); stop it with: scripts/deps.sh down"
  fi
  [[ -n $want ]] || return 0
  local first=$STOMP_PORT
  while tcp_open 127.0.0.1 "$STOMP_PORT"; do
    if stomp_answers 127.0.0.1 "$STOMP_PORT" "$AMQ_USER" "$AMQ_PASS"; then
      STOMP_URL=stomp://$AMQ_USER:$AMQ_PASS@127.0.0.1:$STOMP_PORT
      STOMP_SOURCE="a STOMP broker already on 127.0.0.1:$STOMP_PORT: $(amq_port_holder "$STOMP_PORT"); not stopped by down"
      log "STOMP: port $STOMP_PORT answers STOMP ($(amq_port_holder "$STOMP_PORT")); using it"
      return 0
    fi
    log "port $STOMP_PORT on 127.0.0.1 is taken by $(amq_port_holder "$STOMP_PORT") and does not answer STOMP with our login; trying the next"
    STOMP_PORT=$((STOMP_PORT + 1))
    ((STOMP_PORT < first + 20)) || die "ports $first..$((STOMP_PORT - 1)) on 127.0.0.1 are all taken; pick a free one with DEPS_STOMP_PORT"
  done
  amq_spawn_local
  STOMP_URL=stomp://$AMQ_USER:$AMQ_PASS@127.0.0.1:$STOMP_PORT
  STOMP_SOURCE="project-local server in .deps/activemq, started by deps.sh"
}

resolve_stomp_end() {
  if [[ -n $AMQ_STARTING_PID ]]; then amq_wait_local; fi
  # For `make test`'s trap: it stops at exit only the ActiveMQ that its own `up` started.
  if [[ -n ${DEPS_STARTED_FILE:-} && -n $STARTED_AMQ ]]; then
    printf 'stomp\n' >>"$DEPS_STARTED_FILE"
  fi
}

ensure_databases() {
  local db exists out
  for db in "$@"; do
    [[ $db =~ ^[A-Za-z_][A-Za-z0-9_]*$ ]] || die "invalid database name: $db"
    exists=$(PGCONNECT_TIMEOUT=5 "$PSQL" -X -q -A -t -v ON_ERROR_STOP=1 -d "$(pg_db_url "$PG_URL" postgres)" \
      -c "select 1 from pg_database where datname = '$db'" 2>&1) ||
      die "cannot query $PG_URL: $exists"
    [[ $exists == 1 ]] && continue
    if out=$(PGCONNECT_TIMEOUT=5 "$PSQL" -X -q -v ON_ERROR_STOP=1 -d "$(pg_db_url "$PG_URL" postgres)" \
      -c "create database \"$db\"" 2>&1); then
      log "created database $db"
    elif [[ $out != *"already exists"* ]]; then
      die "cannot create database $db: $out"
    fi
  done
}

# VAR=value, quoted only when the value needs it (keeps the file usable by make too).
env_line() {
  if [[ $2 =~ ^[A-Za-z0-9@:/._%+=?,-]*$ ]]; then
    printf '%s=%s\n' "$1" "$2"
  else
    printf '%s=%q\n' "$1" "$2"
  fi
}

write_env_file() {
  mkdir -p "$RUN_DIR"
  local tmp=$ENV_FILE.tmp.$$
  {
    printf '# Written by scripts/deps.sh up; use: set -a; . .run/deps.env; set +a\n'
    printf '# INTEGRATIONS_PG_URL source: %s\n' "$PG_SOURCE"
    printf '# INTEGRATIONS_AMQP_URL source: %s\n' "$AMQP_SOURCE"
    env_line INTEGRATIONS_PG_URL "$PG_URL"
    env_line INTEGRATIONS_AMQP_URL "$AMQP_URL"
    if [[ -n $STOMP_URL ]]; then
      printf '# INTEGRATIONS_STOMP_URL source: %s\n' "$STOMP_SOURCE"
      env_line INTEGRATIONS_STOMP_URL "$STOMP_URL"
    fi
    # The node and the rabbitmqctl that tests (closing a connection from the broker's side)
    # and make bench (the broker's counters) use: the project-local node when it is the one in
    # use; for the standard server plain rabbitmqctl and its default node (empty values, so that
    # ones left in a shell by an earlier project-local run do not apply); for a broker given in
    # the environment, whatever the environment says.
    if [[ $AMQP_SOURCE == project-local* ]]; then
      env_line INTEGRATIONS_RABBITMQ_NODE "$RMQ_NODENAME"
      env_line INTEGRATIONS_RABBITMQCTL "$RMQ_CTL"
    elif [[ $AMQP_SOURCE == "standard local server" ]]; then
      env_line INTEGRATIONS_RABBITMQ_NODE ""
      env_line INTEGRATIONS_RABBITMQCTL ""
    fi
  } >"$tmp"
  mv -f "$tmp" "$ENV_FILE"
}

# One deps.sh at a time per checkout. fd 9 is closed for every server we start.
take_lock() {
  command -v flock >/dev/null 2>&1 || return 0
  mkdir -p "$RUN_DIR"
  exec 9>"$RUN_DIR/deps.lock"
  flock -w 300 9 || die "another scripts/deps.sh is still running (lock: .run/deps.lock)"
}

# --- commands -----------------------------------------------------------------------

# If `up` fails, stop what this run started, so nothing is left half-started.
STARTED_PG=
STARTED_RMQ=
STARTED_AMQ=
up_cleanup() {
  local rc=$?
  ((rc != 0)) || return 0
  rm -f "$ENV_FILE"
  if [[ -n $STARTED_RMQ || -n $STARTED_PG || -n $STARTED_AMQ ]]; then
    log "up failed; stopping the servers this run started"
    if [[ -n $STARTED_AMQ ]]; then (amq_stop_local) || true; fi
    if [[ -n $STARTED_RMQ ]]; then (rmq_stop_local) || true; fi
    if [[ -n $STARTED_PG ]]; then (pg_stop_local) || true; fi
  fi
  exit "$rc"
}

cmd_up() {
  local dbs=("${DEFAULT_DATABASES[@]}") arg stomp=
  for arg in "$@"; do
    if [[ $arg == stomp ]]; then stomp=1; else dbs+=("$arg"); fi
  done
  take_lock
  trap up_cleanup EXIT
  resolve_stomp_begin "$stomp" # a broker that must be started boots while the others are prepared
  resolve_amqp_begin
  resolve_pg
  ensure_databases "${dbs[@]}"
  resolve_amqp_end
  resolve_stomp_end
  write_env_file
  log "ready; wrote ${ENV_FILE#"$ROOT"/}: INTEGRATIONS_PG_URL=$PG_URL INTEGRATIONS_AMQP_URL=$AMQP_URL${STOMP_URL:+ INTEGRATIONS_STOMP_URL=$STOMP_URL}"
}

cmd_down() {
  local stopped=
  take_lock
  if [[ ${1:-} == stomp ]]; then
    # Only the ActiveMQ (make test's trap); the env file loses its STOMP URL.
    if amq_stop_local && [[ -f $ENV_FILE ]]; then
      sed -i '/INTEGRATIONS_STOMP_URL/d' "$ENV_FILE"
    fi
    return 0
  fi
  if amq_stop_local; then stopped=1; fi
  if rmq_stop_local; then stopped=1; fi
  if pg_stop_local; then stopped=1; fi
  if [[ -n $stopped ]]; then
    rm -f "$ENV_FILE"
  else
    log "nothing started by scripts/deps.sh is running; other servers are left alone"
  fi
}

cmd_status() {
  local rc=0 pg amqp stomp line
  if [[ -f $ENV_FILE ]]; then
    pg=$(
      set +u
      # shellcheck disable=SC1090
      . "$ENV_FILE"
      printf '%s' "$INTEGRATIONS_PG_URL"
    )
    amqp=$(
      set +u
      # shellcheck disable=SC1090
      . "$ENV_FILE"
      printf '%s' "$INTEGRATIONS_AMQP_URL"
    )
    echo "in use (${ENV_FILE#"$ROOT"/}):"
    while IFS= read -r line; do
      [[ $line == "# INTEGRATIONS_"* ]] && echo "  ${line#\# }"
    done <"$ENV_FILE"
    if find_pg_client && pg_url_ok "$pg"; then
      echo "  INTEGRATIONS_PG_URL=$pg (answers)"
    else
      echo "  INTEGRATIONS_PG_URL=$pg (DOES NOT ANSWER)"
      rc=3
    fi
    if amqp_url_ok "$amqp"; then
      echo "  INTEGRATIONS_AMQP_URL=$amqp (answers)"
    else
      echo "  INTEGRATIONS_AMQP_URL=$amqp (DOES NOT ANSWER)"
      rc=3
    fi
    stomp=$(
      set +u
      # shellcheck disable=SC1090
      . "$ENV_FILE"
      printf '%s' "${INTEGRATIONS_STOMP_URL:-}"
    )
    if [[ -n $stomp ]]; then
      if stomp_url_ok "$stomp"; then
        echo "  INTEGRATIONS_STOMP_URL=$stomp (answers)"
      else
        echo "  INTEGRATIONS_STOMP_URL=$stomp (DOES NOT ANSWER)"
        rc=3
      fi
    fi
  else
    echo "not up: no ${ENV_FILE#"$ROOT"/} (run scripts/deps.sh up)"
    rc=3
  fi
  local started
  if [[ -f $PG_DATA/PG_VERSION ]]; then
    started=
    [[ -f $PG_MARKER ]] && started=", started by deps.sh"
    if pg_local_running; then
      echo "project-local Postgres ($PG_DIR): running, pid $(sed -n 1p "$PG_DATA/postmaster.pid"), port $(pg_local_port)$started"
    else
      echo "project-local Postgres ($PG_DIR): stopped"
    fi
  else
    echo "project-local Postgres: none"
  fi
  if [[ -d $RMQ_DIR/mnesia ]]; then
    started=
    [[ -f $RMQ_MARKER ]] && started=", started by deps.sh"
    rmq_load_ports
    if rmq_local_running; then
      echo "project-local RabbitMQ (.deps/rabbitmq): running, pid $(rmq_pid || true), port $AMQP_PORT$started"
    else
      echo "project-local RabbitMQ (.deps/rabbitmq): stopped"
    fi
  else
    echo "project-local RabbitMQ: none"
  fi
  if [[ -f $AMQ_DIR/conf/activemq.xml ]]; then
    started=
    [[ -f $AMQ_MARKER ]] && started=", started by deps.sh"
    amq_load_port
    if amq_local_running; then
      echo "project-local ActiveMQ (.deps/activemq): running, pid $(amq_pids | head -n 1), STOMP port $STOMP_PORT$started"
    else
      echo "project-local ActiveMQ (.deps/activemq): stopped"
    fi
  else
    echo "project-local ActiveMQ: none"
  fi
  return "$rc"
}

cmd_clean() {
  cmd_down
  exec 9>&-
  if [[ $PG_DIR != "$PG_LINK" && -L $PG_LINK ]]; then
    if [[ $PG_DIR == "$PG_OUTSIDE_BASE"/* ]]; then
      rm -rf "$PG_DIR"
      rmdir "$PG_OUTSIDE_BASE" 2>/dev/null || true
    else # a directory given with DEPS_PG_DIR: remove only what this script put there
      rm -rf "$PG_DATA" "$PG_SOCK_DIR" "$PG_LOG" "$PG_CTL_LOG" "$PG_MARKER" "$PG_DIR/initdb.log"
      rmdir "$PG_DIR" 2>/dev/null || true
    fi
    log "removed $PG_DIR"
  fi
  rm -rf "$DEPS_DIR" "$RUN_DIR"
  log "removed .deps/ and .run/"
}

cd "$ROOT"
case ${1:-} in
  up) shift; cmd_up "$@" ;;
  down) shift; cmd_down "$@" ;;
  install)
    shift
    if [[ ${1:-} == stomp ]]; then ensure_packages postgres rabbitmq activemq; else ensure_packages postgres rabbitmq; fi
    ;;
  status) cmd_status ;;
  clean) cmd_clean ;;
  help | -h | --help) usage ;;
  *)
    log "unknown command '${1:-}'; use up, down, install, status or clean"
    usage
    exit 2
    ;;
esac
