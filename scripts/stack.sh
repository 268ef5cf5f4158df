#!/usr/bin/env bash
# The local stack: private MariaDB, Redis (and two more Redis masters for
# Redlock), shop replicas and nginx in front of them, all on loopback, with
# pids, ports, data and logs in one state directory.
#
#   scripts/stack.sh up                  start what is not running (make up)
#   scripts/stack.sh down                stop everything, remove the state (make down)
#   scripts/stack.sh status              what runs where
#   scripts/stack.sh replicas N [VAR=VALUE...]
#                                        restart the replicas: N of them, with
#                                        these SHOP_* settings (kept for later
#                                        restarts); nginx follows
#   scripts/stack.sh shop ARGS...        run bin/shop against the stack (seed, verify)
#
# Faults, for a load running through nginx; each returns once done and
# leaves the stack serving:
#   scripts/stack.sh kill-replica I      SIGKILL replica I; it stays down
#   scripts/stack.sh rolling-restart     restart the running replicas one by one;
#                                        each drains while nginx still sends to it
#   scripts/stack.sh restart-redis       SIGKILL Redis master 0 (cache and lock),
#                                        start it again empty on its port
#   scripts/stack.sh restart-mariadb     stop MariaDB (SIGTERM, waits), start it
#                                        again on its port and data
#
# Environment: SHOP_STATE (state directory, default .state/stack), NGINX_PORT
# (default 8080; 0 picks a free port), REPLICAS (default 3).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

state=${SHOP_STATE:-.state/stack}
mkdir -p "$state"
state=$(cd "$state" && pwd)
ports=$state/ports.env
max_replicas=3

# alive DIR tells whether the process of DIR/pid runs.
alive() { [ -f "$1/pid" ] && pid_alive "$(cat "$1/pid")"; }

# http_get PORT PATH prints the status code of GET PATH on 127.0.0.1:PORT,
# or 000 when nothing answers (no curl needed).
http_get() {
  local code=000
  if { exec 3<>"/dev/tcp/127.0.0.1/$1"; } 2>/dev/null; then
    printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' "$2" >&3
    read -r -t 5 _ code _ <&3 || code=000
    exec 3>&-
  fi
  echo "$code"
}

# wait_ready PORT SECONDS waits for 200 from /readyz on PORT.
wait_ready() {
  local deadline=$(( SECONDS + $2 ))
  until [ "$(http_get "$1" /readyz)" = 200 ]; do
    [ $SECONDS -lt $deadline ] || return 1
    sleep 0.2
  done
}

# load_ports reads the ports of this stack, choosing them on first use.
load_ports() {
  if [ ! -f "$ports" ]; then
    local nginx_port=${NGINX_PORT:-8080} i
    [ "$nginx_port" != 0 ] || nginx_port=$(free_port)
    {
      echo "MYSQL_PORT=$(free_port)"
      echo "REDIS_PORTS='$(free_port) $(free_port) $(free_port)'"
      echo "REPLICA_PORTS='$(for i in $(seq 1 $max_replicas); do free_port; done | xargs)'"
      echo "NGINX_PORT=$nginx_port"
      echo "ADMIN_TOKEN=$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')"
    } >"$ports"
  fi
  . "$ports"
  read -r -a redis_ports <<<"$REDIS_PORTS"
  read -r -a replica_ports <<<"$REPLICA_PORTS"
}

# shop_env prints the settings every shop process of the stack shares.
shop_env() {
  echo "SHOP_MYSQL_DSN=root@tcp(127.0.0.1:$MYSQL_PORT)/shop?parseTime=true"
  echo "SHOP_REDIS_ADDR=127.0.0.1:${redis_ports[0]}"
  echo "SHOP_REDLOCK_ADDRS=127.0.0.1:${redis_ports[0]},127.0.0.1:${redis_ports[1]},127.0.0.1:${redis_ports[2]}"
  echo "SHOP_ADMIN_TOKEN=$ADMIN_TOKEN"
}

run_shop() {
  local env=()
  mapfile -t env < <(shop_env)
  env "${env[@]}" bin/shop "$@"
}

build() {
  log "building bin/shop and bin/loadtest"
  go build -o bin/shop ./cmd/shop
  go build -o bin/loadtest ./loadtest
}

start_servers() {
  local i fresh=
  [ -d "$state/mariadb/data/mysql" ] || fresh=1
  alive "$state/mariadb" || start_mariadb "$state/mariadb" "$MYSQL_PORT"
  start_masters
  run_shop migrate >/dev/null
  if [ -n "$fresh" ]; then
    run_shop seed --products "${PRODUCTS:-5000}" --stock "${STOCK:-1}" >&2
  fi
}

# start_masters starts the Redis masters that are not running (a master
# killed by the demo comes back empty, as after a crash).
start_masters() {
  local i
  for i in 0 1 2; do
    alive "$state/redis$i" || start_redis "$state/redis$i" "${redis_ports[$i]}"
  done
}

# A replica drains on SIGTERM: it stops accepting, lets its in-flight
# orders commit or roll back and answers them, within 30 seconds and a
# short drain period. It is killed only if it takes longer than this.
replica_stop_timeout=45

# nginx leaves a replica out this many seconds after a connection to it
# failed (upstream fail_timeout).
upstream_fail_timeout=2

# stop_replicas stops every replica; in-flight requests finish first. They
# drain side by side.
stop_replicas() {
  local i
  for i in $(seq 1 $max_replicas); do stop_pidfile "$state/replica$i/pid" $replica_stop_timeout & done
  wait
}

# replica_port I prints the port of replica I (from 1).
replica_port() { echo "${replica_ports[$(($1 - 1))]}"; }

# binary_sum [BINARY] prints the SHA-256 of BINARY (bin/shop): what a
# replica records at start, so that `up` can tell the replicas still running
# an older build.
binary_sum() {
  local bin=${1:-bin/shop}
  if command -v sha256sum >/dev/null 2>&1; then sha256sum "$bin"; else shasum -a 256 "$bin"; fi | cut -d' ' -f1
}

# start_replica I starts replica I, without waiting for it, with the
# settings the replicas were last given (state/replica-settings, one
# VAR=VALUE a line), and records which binary it runs. SHOP_BINARY among
# the settings runs another build of shop (the demo's failpoints build).
start_replica() {
  local dir=$state/replica$1 env=() settings=() kv bin=bin/shop
  mapfile -t env < <(shop_env)
  [ ! -f "$state/replica-settings" ] || mapfile -t settings <"$state/replica-settings"
  for kv in "${settings[@]}"; do
    case $kv in SHOP_BINARY=*) bin=${kv#SHOP_BINARY=} ;; esac
  done
  mkdir -p "$dir"
  binary_sum "$bin" >"$dir/binary"
  env "${env[@]}" SHOP_HTTP_ADDR="127.0.0.1:$(replica_port "$1")" "${settings[@]}" \
    "$bin" serve </dev/null >>"$dir/shop.log" 2>&1 &
  echo $! >"$dir/pid"
}

# wait_replica I waits for replica I's /readyz.
wait_replica() {
  wait_ready "$(replica_port "$1")" 30 || { tail -5 "$state/replica$1/shop.log" >&2; die "replica $1 is not ready"; }
}

# start_replicas N [VAR=VALUE...] starts replicas 1..N with the settings,
# which later restarts of a replica keep.
start_replicas() {
  local n=$1 i
  shift
  printf '%s\n' "$@" | grep -v '^$' >"$state/replica-settings" || true
  for i in $(seq 1 "$n"); do start_replica "$i"; done
  for i in $(seq 1 "$n"); do wait_replica "$i"; done
  echo "$n" >"$state/replicas"
  log "$n replica(s) on ports ${replica_ports[*]:0:$n}${*:+ with $*}"
}

# restart_replicas I... restarts replicas I..., one at a time, while nginx
# keeps sending them requests, as a balancer that is not told would. A
# replica drains on SIGTERM (see shop serve): it stops accepting at once — a
# connection refused is one nginx never sent a request on, so it tries the
# next replica, POST included — then answers what it has on the connections
# open, each answer closing its connection, while nginx closes its idle ones
# itself (its upstream keepalive_timeout is shorter than the drain), and
# only then shuts down. Reloading nginx to take the replica out first would
# cost more: nginx's old workers close their idle keep-alive connections to
# the clients, and a request a client sends on one just then is lost.
#
# While a replica is down nginx finds its connections refused and leaves it
# out for fail_timeout; the next replica is stopped only once that is over
# and nginx sends to the restarted one again, or nginx would find every
# replica out at once and answer 502 for all of them.
restart_replicas() {
  local i
  for i in "$@"; do
    log "replica $i: draining"
    stop_pidfile "$state/replica$i/pid" $replica_stop_timeout
    start_replica "$i"
    wait_replica "$i"
    sleep "$upstream_fail_timeout"
    log "replica $i: restarted"
  done
}

# rolling_restart restarts the running replicas (restart_replicas).
rolling_restart() {
  local n i running=()
  n=$(cat "$state/replicas")
  for i in $(seq 1 "$n"); do
    if alive "$state/replica$i"; then running+=("$i"); fi
  done
  [ ${#running[@]} -gt 0 ] || die "no replica runs"
  restart_replicas "${running[@]}"
}

# nginx_up N points nginx at replicas 1..N, starting nginx or reloading it.
# A reload returns once nginx's old workers have finished their requests and
# exited, so that none of them still sends a request to a replica left out.
nginx_up() {
  local n=$1 bin dir=$state/nginx upstreams= i opts
  bin=$(find_bin nginx) || die "nginx not found"
  mkdir -p "$dir/logs"
  for i in $(seq 1 "$n"); do
    upstreams+="server 127.0.0.1:$(replica_port "$i") max_fails=1 fail_timeout=${upstream_fail_timeout}s; "
  done
  render deploy/nginx.conf "$dir/nginx.conf" \
    NGINX_LISTEN="127.0.0.1:$NGINX_PORT" NGINX_DIR="$dir" NGINX_LOG_DIR="$dir/logs" SHOP_UPSTREAMS="$upstreams"
  opts="daemon off;"
  [ "$(id -u)" -ne 0 ] || opts+=" user root;"
  "$bin" -t -q -p "$dir" -e "$dir/logs/error.log" -c "$dir/nginx.conf" -g "$opts" || die "nginx rejected $dir/nginx.conf"
  if alive "$dir"; then
    reload_nginx "$(cat "$dir/pid")"
  else
    if (exec 3<>"/dev/tcp/127.0.0.1/$NGINX_PORT") 2>/dev/null; then
      die "127.0.0.1:$NGINX_PORT is taken by another program: set NGINX_PORT (0 picks a free port) or stop it"
    fi
    "$bin" -p "$dir" -e "$dir/logs/error.log" -c "$dir/nginx.conf" -g "$opts" </dev/null >>"$dir/logs/stdout.log" 2>&1 &
    echo $! >"$dir/pid"
    wait_port "$NGINX_PORT" 10 $! || { tail -5 "$dir/logs/error.log" >&2; die "nginx did not start"; }
  fi
  wait_ready "$NGINX_PORT" 30 || die "no /readyz through nginx on port $NGINX_PORT"
}

# reload_nginx MASTER makes nginx read its configuration again (SIGHUP) and
# waits, at most 30 seconds (twice its proxy_read_timeout), until the
# workers it had before have exited: the new ones take every new request,
# the old ones finish theirs first.
reload_nginx() {
  local master=$1 old pid deadline=$((SECONDS + 30))
  old=$(pgrep -P "$master" 2>/dev/null || true)
  kill -HUP "$master"
  for pid in $old; do
    while pid_alive "$pid"; do
      if [ $SECONDS -ge $deadline ]; then
        log "nginx's old worker $pid still runs 30s after the reload"
        return 0
      fi
      sleep 0.1
    done
  done
  [ -n "$old" ] || sleep 1 # no pgrep: give the new workers a moment
}

# render TEMPLATE OUT NAME=VALUE... replaces each ${NAME} in TEMPLATE.
render() {
  local text kv
  text=$(<"$1")
  for kv in "${@:3}"; do
    text=${text//"\${${kv%%=*}}"/"${kv#*=}"}
  done
  printf '%s\n' "$text" >"$2"
}

up() {
  ensure_deps
  build
  load_ports
  start_servers
  local n=${REPLICAS:-$(cat "$state/replicas" 2>/dev/null || echo 3)} i sum started=() stale=()
  sum=$(binary_sum)
  for i in $(seq 1 "$n"); do
    if ! alive "$state/replica$i"; then
      start_replica "$i"
      started+=("$i")
    elif [ "$(cat "$state/replica$i/binary" 2>/dev/null)" != "$sum" ]; then
      stale+=("$i")
    fi
  done
  for i in "${started[@]}"; do wait_replica "$i"; done
  echo "$n" >"$state/replicas"
  [ ${#started[@]} -eq 0 ] || log "started replica(s) ${started[*]}"
  nginx_up "$n"
  # Replicas started from an older bin/shop: restarted one at a time.
  [ ${#stale[@]} -eq 0 ] || restart_replicas "${stale[@]}"
  cat <<EOF
shop is up: http://127.0.0.1:$NGINX_PORT  (nginx → $n replicas)
  try:   curl -s -XPOST http://127.0.0.1:$NGINX_PORT/api/v1/orders -H 'Content-Type: application/json' -d '{"sku_id":1,"user_id":1}'
  admin: Authorization: Bearer $ADMIN_TOKEN
  logs:  $state/replica*/shop.log, $state/nginx/logs/
  stop:  make down
EOF
}

down() {
  if [ ! -f "$ports" ]; then
    log "no stack in $state"
    rm -rf "$state"
    return
  fi
  stop_pidfile "$state/nginx/pid"
  stop_replicas
  local i
  for i in 0 1 2; do stop_pidfile "$state/redis$i/pid"; done
  stop_pidfile "$state/mariadb/pid" 30 # InnoDB writes its buffers out
  rm -rf "$state"
  log "stack stopped, $state removed"
}

status() {
  [ -f "$ports" ] || { echo "no stack in $state"; return; }
  load_ports
  local name sum
  sum=$(binary_sum 2>/dev/null || true)
  for name in mariadb redis0 redis1 redis2 nginx replica1 replica2 replica3; do
    if alive "$state/$name"; then
      echo -n "$name: running (pid $(cat "$state/$name/pid"))"
      if [ -f "$state/$name/binary" ] && [ "$(cat "$state/$name/binary")" != "$sum" ]; then echo -n ", an older bin/shop"; fi
      echo
    else echo "$name: stopped"; fi
  done
  echo "nginx: http://127.0.0.1:$NGINX_PORT, replicas on ${replica_ports[*]}, MariaDB $MYSQL_PORT, Redis ${redis_ports[*]}"
  [ ! -s "$state/replica-settings" ] || echo "replica settings: $(xargs <"$state/replica-settings")"
}

# kill_replica I kills replica I (SIGKILL), as a crash would; nginx sends
# new requests to the others. It stays down until `replicas` or `up`.
kill_replica() {
  local pid
  alive "$state/replica$1" || die "replica $1 is not running"
  pid=$(cat "$state/replica$1/pid")
  kill -9 "$pid"
  log "replica $1 (pid $pid) killed"
}

# restart_redis kills Redis master 0, the cache's and the lock's (SIGKILL),
# and starts it again on its port, empty, as after a crash without
# persistence.
restart_redis() {
  local dir=$state/redis0 pid
  if alive "$dir"; then
    pid=$(cat "$dir/pid")
    kill -9 "$pid"
    while pid_alive "$pid"; do sleep 0.05; done
    log "Redis master 0 (pid $pid) killed"
  fi
  start_redis "$dir" "${redis_ports[0]}"
}

# restart_mariadb stops MariaDB (SIGTERM: it finishes, writes its buffers
# out and exits), starts it again on its port and data directory, and
# returns once it accepts connections.
restart_mariadb() {
  stop_pidfile "$state/mariadb/pid" 60
  log "MariaDB stopped"
  start_mariadb "$state/mariadb" "$MYSQL_PORT"
}

case ${1:-} in
  up) up ;;
  down) down ;;
  status) status ;;
  replicas)
    [ $# -ge 2 ] && [ "$2" -ge 1 ] && [ "$2" -le $max_replicas ] || die "usage: $0 replicas 1..$max_replicas [VAR=VALUE...]"
    load_ports
    stop_replicas
    start_masters
    start_replicas "${@:2}"
    nginx_up "$2"
    ;;
  kill-replica)
    [ $# -eq 2 ] && [ "$2" -ge 1 ] && [ "$2" -le $max_replicas ] || die "usage: $0 kill-replica 1..$max_replicas"
    kill_replica "$2"
    ;;
  rolling-restart) load_ports; rolling_restart ;;
  restart-redis) load_ports; restart_redis ;;
  restart-mariadb) load_ports; restart_mariadb ;;
  shop) load_ports; run_shop "${@:2}" ;;
  *) die "usage: $0 up|down|status|replicas N [VAR=VALUE...]|kill-replica I|rolling-restart|restart-redis|restart-mariadb|shop ARGS..." ;;
esac
