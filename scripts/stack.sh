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
#                                        these SHOP_* settings; nginx follows
#   scripts/stack.sh shop ARGS...        run bin/shop against the stack (seed, verify)
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

# stop_replicas stops every replica; in-flight requests finish first. They
# drain side by side.
stop_replicas() {
  local i
  for i in $(seq 1 $max_replicas); do stop_pidfile "$state/replica$i/pid" $replica_stop_timeout & done
  wait
}

# start_replicas N [VAR=VALUE...] starts replicas 1..N with the settings.
start_replicas() {
  local n=$1 i dir env=()
  shift
  mapfile -t env < <(shop_env)
  for i in $(seq 1 "$n"); do
    dir=$state/replica$i
    mkdir -p "$dir"
    env "${env[@]}" SHOP_HTTP_ADDR="127.0.0.1:${replica_ports[$((i - 1))]}" "$@" \
      bin/shop serve </dev/null >>"$dir/shop.log" 2>&1 &
    echo $! >"$dir/pid"
  done
  for i in $(seq 1 "$n"); do
    wait_ready "${replica_ports[$((i - 1))]}" 30 || { tail -5 "$state/replica$i/shop.log" >&2; die "replica $i is not ready"; }
  done
  echo "$n" >"$state/replicas"
  log "$n replica(s) on ports ${replica_ports[*]:0:$n}${*:+ with $*}"
}

# nginx_up points nginx at replicas 1..N, starting it or reloading it.
nginx_up() {
  local n=$1 bin dir=$state/nginx upstreams= i opts
  bin=$(find_bin nginx) || die "nginx not found"
  mkdir -p "$dir/logs"
  for i in $(seq 1 "$n"); do upstreams+="server 127.0.0.1:${replica_ports[$((i - 1))]}; "; done
  render deploy/nginx.conf "$dir/nginx.conf" \
    NGINX_LISTEN="127.0.0.1:$NGINX_PORT" NGINX_DIR="$dir" NGINX_LOG_DIR="$dir/logs" SHOP_UPSTREAMS="$upstreams"
  opts="daemon off;"
  [ "$(id -u)" -ne 0 ] || opts+=" user root;"
  "$bin" -t -q -p "$dir" -e "$dir/logs/error.log" -c "$dir/nginx.conf" -g "$opts" || die "nginx rejected $dir/nginx.conf"
  if alive "$dir"; then
    kill -HUP "$(cat "$dir/pid")"
    sleep 0.3 # the new workers take over; old ones finish their requests
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
  local n=${REPLICAS:-3} i running=1
  for i in $(seq 1 "$n"); do alive "$state/replica$i" || running=; done
  if [ -z "$running" ]; then
    stop_replicas
    start_replicas "$n"
  fi
  nginx_up "$(cat "$state/replicas")"
  cat <<EOF
shop is up: http://127.0.0.1:$NGINX_PORT  (nginx → $(cat "$state/replicas") replicas)
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
  local i name
  for name in mariadb redis0 redis1 redis2 nginx replica1 replica2 replica3; do
    if alive "$state/$name"; then echo "$name: running (pid $(cat "$state/$name/pid"))"; else echo "$name: stopped"; fi
  done
  echo "nginx: http://127.0.0.1:$NGINX_PORT, replicas on ${replica_ports[*]}, MariaDB $MYSQL_PORT, Redis ${redis_ports[*]}"
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
  shop) load_ports; run_shop "${@:2}" ;;
  *) die "usage: $0 up|down|status|replicas N [VAR=VALUE...]|shop ARGS..." ;;
esac
