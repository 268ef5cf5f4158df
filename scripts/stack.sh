#!/usr/bin/env bash
# The local stack: private MariaDB, Redis (and two more Redis masters for
# Redlock), shop replicas and nginx in front of them, all on loopback, with
# pids, ports, data and logs in one state directory. The replicas' Redis is
# the first master, or a Redis Cluster, or a master with a replica watched by
# Sentinels (REDIS_TOPOLOGY).
#
#   scripts/stack.sh up                  start what is not running (make up)
#   scripts/stack.sh down                stop everything, remove the state (make down)
#   scripts/stack.sh status              what runs where
#   scripts/stack.sh replicas N [VAR=VALUE...]
#                                        restart the replicas: N of them, with
#                                        these SHOP_* settings (kept for later
#                                        restarts; I:VAR=VALUE is replica I's
#                                        alone); nginx follows
#   scripts/stack.sh shop ARGS...        run bin/shop against the stack (seed, verify)
#   scripts/stack.sh redis-up            start the Redis servers of the topology that
#                                        are not running; print the replicas'
#                                        SHOP_REDIS_* settings
#   scripts/stack.sh db-up               start the database of DB_TOPOLOGY (and the
#                                        Redis a seed resets) unless running,
#                                        migrated and seeded; print SHOP_MYSQL_DSN
#
# Faults, for a load running through nginx; each returns once done and
# leaves the stack serving:
#   scripts/stack.sh kill-replica I      SIGKILL replica I; it stays down
#   scripts/stack.sh start-replica I     start replica I again, if it is down, with
#                                        the replicas' settings; returns once ready
#   scripts/stack.sh rolling-restart     restart the running replicas one by one;
#                                        each drains while nginx still sends to it
#   scripts/stack.sh restart-redis       SIGKILL Redis master 0 (cache and lock on
#                                        the single topology), start it again
#                                        empty on its port
#   scripts/stack.sh restart-mariadb     stop MariaDB (SIGTERM, waits), start it
#                                        again on its port and data
#   scripts/stack.sh failover-redis      (Sentinel) SENTINEL FAILOVER: the replica
#                                        becomes the master, the master its replica
#   scripts/stack.sh kill-redis-master   (Sentinel) SIGKILL the master; once the
#                                        Sentinels have promoted the replica, start
#                                        it again, empty, to rejoin as a replica
#   scripts/stack.sh kill-etcd-leader    (SHOP_LOCK_MODE=etcd) SIGKILL the etcd leader;
#                                        once another leads, start it again on its data
#   scripts/stack.sh kill-zk-leader      (SHOP_LOCK_MODE=zookeeper) the same for the
#                                        ZooKeeper ensemble's leader
#   scripts/stack.sh db-writer           (DB_TOPOLOGY=galera) print the index of the
#                                        node new connections through HAProxy reach
#   scripts/stack.sh kill-db-writer      (Galera) SIGKILL the writer; once a write
#                                        through HAProxy commits on another node,
#                                        start it again on its data; returns once it
#                                        is Synced (IST) and HAProxy sends to it
#   scripts/stack.sh stop-db-node I      (Galera) SIGTERM node I (0..2); returns once
#                                        HAProxy sends to a running node
#   scripts/stack.sh start-db-node I     (Galera) start node I on its data; returns
#                                        once it is Synced
#   scripts/stack.sh partition-db-writer (Galera) cut the writer off from the others
#                                        (gmcast.isolate=1); returns once a write
#                                        through HAProxy commits on another node
#   scripts/stack.sh heal-db-partition   (Galera) rejoin the isolated node(s); returns
#                                        once Synced
# Each fault prints one line of timings on stderr.
#
# The replicas of SHOP_LOCK_MODE=etcd or zookeeper start a private etcd
# cluster or ZooKeeper ensemble of three on first use, which runs until down.
#
# Payments: the replicas take them from the payment provider, signed
# (SHOP_PAYMENTS). By default as Standard Webhooks events signed with
# SHOP_PAYMENT_WEBHOOK_SECRET, which up generates once and keeps in the
# state (ports.env's PAYMENT_WEBHOOK_SECRET, beside ADMIN_TOKEN) and prints.
# Replicas given SHOP_PAYMENTS=stripe (`SHOP_PAYMENTS=stripe make up`, kept
# among the replicas' settings, or `replicas N SHOP_PAYMENTS=stripe`) talk
# to a private stripe-mock (scripts/lib.sh, start_stripe) behind the
# recording proxy, which logs every call to Stripe's API in
# $SHOP_STATE/stripe/calls.jsonl; its webhooks are signed with ports.env's
# STRIPE_WEBHOOK_SECRET. stripe-mock starts on first use and runs until
# down.
#
# Environment: SHOP_STATE (state directory, default .state/stack; up,
# replicas and redis-up create it, and mark it as theirs with a file
# .shop-stack: a directory that exists without it is not used, and down
# removes nothing else), NGINX_PORT
# (default 8080; 0 picks a free port), REPLICAS (default 3), REDIS_TOPOLOGY
# (single, cluster or sentinel; read by up, replicas and redis-up, which
# start its servers, and kept in the state for every later command; default
# single): the Redis of the replicas and of `shop`. single is Redis master 0;
# cluster a Redis Cluster of three masters; sentinel a master, one replica and
# three Sentinels watching them as "shop". The Redlock masters stay the three
# single servers whatever the topology.
#
# DB_TOPOLOGY (single or galera; read by up and replicas, which start its
# servers, and kept in the state like REDIS_TOPOLOGY; default single): the
# MySQL of the replicas and of `shop`. single is one MariaDB; galera three
# MariaDB nodes with Galera (scripts/galera.sh), HAProxy in front of them and
# a `bin/shop db-agent` per node for HAProxy's agent-check. ports.env's
# MYSQL_PORT is the port the replicas use: HAProxy's on galera, the single
# MariaDB's (SINGLE_MYSQL_PORT) otherwise; the cluster's ports (DB_NODE_PORTS,
# DB_AGENT_PORTS, HAPROXY_PORT, HAPROXY_STATS_PORT, gcomm, IST, SST) are kept
# beside them. A cluster, once started, runs until down, so that the demo can
# switch back and forth.
#
# Each replica has an operators' listener of its own (SHOP_ADMIN_ADDR) on a
# port kept with the others (ADMIN_PORTS): the admin API and /metrics are
# served there, never through nginx or a replica's public port.
#
# Ports are chosen once and kept in the state (ports.env). A server counts
# as running only while the pid the stack recorded for it listens on its
# port. When another process has taken a saved port, up and redis-up move
# the server to a free port (and restart the replicas that pointed at the
# old one); every other command fails, naming the port and the process.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

state=${SHOP_STATE:-.state/stack}
# The file that marks a state directory as made by this script.
marker=.shop-stack

# make_state creates the state directory, and marks it as this script's.
make_state() {
  if mkdir -p "$(dirname "$state")" && mkdir "$state" 2>/dev/null; then
    echo "made by scripts/stack.sh; scripts/stack.sh down (make down) removes this directory" >"$state/$marker"
  fi
  own_state
}

# own_state fails unless the state directory is one that make_state made:
# SHOP_STATE may name any directory, and down removes it.
own_state() {
  [ -f "$state/$marker" ] ||
    die "SHOP_STATE=$state was not made by scripts/stack.sh (no $marker in it): not using it, not removing it; name a directory that does not exist yet"
}

# need_stack fails unless a stack's state directory is there.
need_stack() {
  [ -d "$state" ] || die "no stack in $state: $0 up first"
  own_state
}

case ${1:-} in
  up) ensure_go; make_state ;;
  replicas | redis-up) make_state ;;
  db-up) ensure_go; make_state ;;
esac
[ ! -d "$state" ] || state=$(cd "$state" && pwd)
ports=$state/ports.env
max_replicas=3

# repick is set by the commands whose callers read the ports only after
# them (up, redis-up): a saved port that another process took meanwhile
# is then given up for a new one (claim_port).
repick=

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
  local p=()
  if [ ! -f "$ports" ]; then
    mapfile -t p < <(free_ports 27)
    SINGLE_MYSQL_PORT=${p[0]} REDIS_PORTS=${p[*]:1:3} REPLICA_PORTS=${p[*]:4:3} CLUSTER_PORTS=${p[*]:7:3}
    SENTINEL_REDIS_PORTS=${p[*]:10:2} SENTINEL_PORTS=${p[*]:12:3} ADMIN_PORTS=${p[*]:16:3}
    ETCD_PORTS=${p[*]:19:3} ZK_PORTS=${p[*]:22:3} STRIPE_MOCK_PORT=${p[25]} STRIPE_RECORDER_PORT=${p[26]}
    NGINX_PORT=${NGINX_PORT:-8080} HAPROXY_PORT= HAPROXY_STATS_PORT=
    [ "$NGINX_PORT" != 0 ] || NGINX_PORT=${p[15]}
    ADMIN_TOKEN=$(od -An -N12 -tx1 /dev/urandom | tr -d ' \n')
    PAYMENT_WEBHOOK_SECRET=$(new_webhook_secret) STRIPE_WEBHOOK_SECRET=$(new_webhook_secret)
  else
    ADMIN_PORTS= ETCD_PORTS= ZK_PORTS= STRIPE_MOCK_PORT= STRIPE_RECORDER_PORT=
    PAYMENT_WEBHOOK_SECRET= STRIPE_WEBHOOK_SECRET= SINGLE_MYSQL_PORT= HAPROXY_PORT=
    . "$ports"
    # A stack from before DB_TOPOLOGY: MYSQL_PORT was the single MariaDB's.
    SINGLE_MYSQL_PORT=${SINGLE_MYSQL_PORT:-$MYSQL_PORT}
  fi
  read -r -a redis_ports <<<"$REDIS_PORTS"
  read -r -a replica_ports <<<"$REPLICA_PORTS"
  read -r -a admin_ports <<<"$ADMIN_PORTS"
  read -r -a cluster_ports <<<"$CLUSTER_PORTS"
  read -r -a sentinel_redis_ports <<<"$SENTINEL_REDIS_PORTS"
  read -r -a sentinel_ports <<<"$SENTINEL_PORTS"
  read -r -a etcd_ports <<<"$ETCD_PORTS"
  read -r -a zk_ports <<<"$ZK_PORTS"
  read -r -a db_node_ports <<<"${DB_NODE_PORTS:-}"
  read -r -a db_gcomm_ports <<<"${DB_GCOMM_PORTS:-}"
  read -r -a db_ist_ports <<<"${DB_IST_PORTS:-}"
  read -r -a db_sst_ports <<<"${DB_SST_PORTS:-}"
  read -r -a db_agent_ports <<<"${DB_AGENT_PORTS:-}"
  if [ ${#admin_ports[@]} -eq 0 ]; then
    # A stack from before the replicas had an operators' listener.
    mapfile -t admin_ports < <(free_ports 3)
    [ ! -f "$ports" ] || save_ports
  fi
  if [ ${#etcd_ports[@]} -eq 0 ]; then
    # A stack from before the etcd and ZooKeeper locks.
    mapfile -t p < <(free_ports 6)
    etcd_ports=("${p[@]:0:3}") zk_ports=("${p[@]:3:3}")
    [ ! -f "$ports" ] || save_ports
  fi
  if [ -z "$PAYMENT_WEBHOOK_SECRET" ]; then
    # A stack from before signed payments: its secrets and stripe-mock's
    # ports, kept from now on.
    PAYMENT_WEBHOOK_SECRET=$(new_webhook_secret) STRIPE_WEBHOOK_SECRET=$(new_webhook_secret)
    STRIPE_MOCK_PORT=$(free_port_except "$(taken_ports)")
    STRIPE_RECORDER_PORT=$(free_port_except "$(taken_ports)")
    [ ! -f "$ports" ] || save_ports
  fi
  if [ -z "$HAPROXY_PORT" ]; then
    # The Galera cluster's ports (DB_TOPOLOGY=galera), chosen with the
    # others and kept, whichever topology runs: mysql, gcomm, IST and SST
    # for each node, an agent per node, HAProxy and its stats.
    p=()
    while [ ${#p[@]} -lt 17 ]; do p+=("$(free_port_except "$(taken_ports) ${p[*]} ")"); done
    db_node_ports=("${p[@]:0:3}") db_gcomm_ports=("${p[@]:3:3}") db_ist_ports=("${p[@]:6:3}")
    db_sst_ports=("${p[@]:9:3}") db_agent_ports=("${p[@]:12:3}") HAPROXY_PORT=${p[15]} HAPROXY_STATS_PORT=${p[16]}
    [ ! -f "$ports" ] || save_ports
  fi
  if [ ! -f "$ports" ] || [ "$MYSQL_PORT" != "$(db_port)" ]; then save_ports; fi
}

# db_topology prints the stack's database topology: single or galera.
db_topology() { cat "$state/db-topology" 2>/dev/null || echo single; }

# set_db_topology records DB_TOPOLOGY, when it is set, as the stack's
# database topology, as set_topology does REDIS_TOPOLOGY.
set_db_topology() {
  case ${DB_TOPOLOGY:-} in
    "") ;;
    single | galera) echo "$DB_TOPOLOGY" >"$state/db-topology" ;;
    *) die "DB_TOPOLOGY=$DB_TOPOLOGY: want single or galera" ;;
  esac
}

# db_port prints the port the stack's shop processes reach MySQL on, ports.env's
# MYSQL_PORT: the single MariaDB's, or HAProxy's in front of the Galera
# cluster.
db_port() {
  case $(db_topology) in
    single) echo "$SINGLE_MYSQL_PORT" ;;
    galera) echo "$HAPROXY_PORT" ;;
  esac
}

# taken_ports prints the stack's saved ports, between spaces (" 1 2 ").
taken_ports() {
  echo " ${SINGLE_MYSQL_PORT:-} ${HAPROXY_PORT:-} ${HAPROXY_STATS_PORT:-} ${db_node_ports[*]} ${db_gcomm_ports[*]} ${db_ist_ports[*]} ${db_sst_ports[*]} ${db_agent_ports[*]} ${redis_ports[*]} ${replica_ports[*]} $NGINX_PORT ${cluster_ports[*]} ${sentinel_redis_ports[*]} ${sentinel_ports[*]} ${admin_ports[*]} ${etcd_ports[*]} ${zk_ports[*]} ${STRIPE_MOCK_PORT:-} ${STRIPE_RECORDER_PORT:-} "
}

# save_ports writes the ports to the state.
save_ports() {
  {
    MYSQL_PORT=$(db_port)
    echo "MYSQL_PORT=$MYSQL_PORT"
    echo "SINGLE_MYSQL_PORT=$SINGLE_MYSQL_PORT"
    echo "HAPROXY_PORT=$HAPROXY_PORT"
    echo "HAPROXY_STATS_PORT=$HAPROXY_STATS_PORT"
    echo "DB_NODE_PORTS='${db_node_ports[*]}'"
    echo "DB_GCOMM_PORTS='${db_gcomm_ports[*]}'"
    echo "DB_IST_PORTS='${db_ist_ports[*]}'"
    echo "DB_SST_PORTS='${db_sst_ports[*]}'"
    echo "DB_AGENT_PORTS='${db_agent_ports[*]}'"
    echo "REDIS_PORTS='${redis_ports[*]}'"
    echo "REPLICA_PORTS='${replica_ports[*]}'"
    echo "NGINX_PORT=$NGINX_PORT"
    echo "ADMIN_TOKEN=$ADMIN_TOKEN"
    echo "CLUSTER_PORTS='${cluster_ports[*]}'"
    echo "SENTINEL_REDIS_PORTS='${sentinel_redis_ports[*]}'"
    echo "SENTINEL_PORTS='${sentinel_ports[*]}'"
    echo "ADMIN_PORTS='${admin_ports[*]}'"
    echo "ETCD_PORTS='${etcd_ports[*]}'"
    echo "ZK_PORTS='${zk_ports[*]}'"
    echo "PAYMENT_WEBHOOK_SECRET=$PAYMENT_WEBHOOK_SECRET"
    echo "STRIPE_WEBHOOK_SECRET=$STRIPE_WEBHOOK_SECRET"
    echo "STRIPE_MOCK_PORT=$STRIPE_MOCK_PORT"
    echo "STRIPE_RECORDER_PORT=$STRIPE_RECORDER_PORT"
  } >"$ports.new"
  mv "$ports.new" "$ports"
}

# claim_port VAR INDEX WHAT makes sure that the saved port VAR[INDEX] (an
# array of the ports, or SINGLE_MYSQL_PORT with INDEX 0) is free for WHAT to start
# on. Taken by another process meanwhile, it is given up for a new free
# port, saved, where repick is set; elsewhere that fails, naming the port
# and the process, rather than let the stack talk to that process.
claim_port() {
  local -n var=$1
  local i=$2 what=$3 holder port
  holder=$(port_holder "${var[$i]}") || return 0
  [ -n "$repick" ] ||
    die "port ${var[$i]} of $what (saved in $ports) is held by $holder, not by this stack: stop it, or run $0 up, which moves $what to a free port"
  port=$(free_port_except "$(taken_ports)")
  log "port ${var[$i]} of $what is held by $holder: $what moves to port $port"
  var[i]=$port
  save_ports
}

# The name under which the Sentinels watch the master.
sentinel_name=shop

# topology prints the stack's Redis topology: single, cluster or sentinel.
topology() { cat "$state/topology" 2>/dev/null || echo single; }

# set_topology records REDIS_TOPOLOGY, when it is set, as the stack's
# topology; the commands that start servers call it, every other command
# keeps to the one recorded, so that `shop seed` talks to the replicas'
# Redis whatever the caller's environment says.
set_topology() {
  case ${REDIS_TOPOLOGY:-} in
    "") ;;
    single | cluster | sentinel) echo "$REDIS_TOPOLOGY" >"$state/topology" ;;
    *) die "REDIS_TOPOLOGY=$REDIS_TOPOLOGY: want single, cluster or sentinel" ;;
  esac
}

# addr_list PORT... prints 127.0.0.1:PORT,... .
addr_list() {
  local port addrs=()
  for port in "$@"; do addrs+=("127.0.0.1:$port"); done
  (IFS=,; echo "${addrs[*]}")
}

# redis_env prints the SHOP_REDIS_* settings that point a shop process at
# the stack's topology.
redis_env() {
  case $(topology) in
    single) echo "SHOP_REDIS_ADDR=127.0.0.1:${redis_ports[0]}" ;;
    cluster) echo "SHOP_REDIS_ADDR=$(addr_list "${cluster_ports[@]}")" ;;
    sentinel)
      echo "SHOP_REDIS_ADDR=$(addr_list "${sentinel_ports[@]}")"
      echo "SHOP_REDIS_MASTER_NAME=$sentinel_name"
      ;;
  esac
}

# shop_env prints the settings every shop process of the stack shares.
shop_env() {
  echo "SHOP_MYSQL_DSN=root@tcp(127.0.0.1:$(db_port))/shop?parseTime=true"
  redis_env
  echo "SHOP_REDLOCK_ADDRS=127.0.0.1:${redis_ports[0]},127.0.0.1:${redis_ports[1]},127.0.0.1:${redis_ports[2]}"
  echo "SHOP_ETCD_ENDPOINTS=$(addr_list "${etcd_ports[@]}")"
  echo "SHOP_ZK_SERVERS=$(addr_list "${zk_ports[@]}")"
  echo "SHOP_ADMIN_TOKEN=$ADMIN_TOKEN"
  echo "SHOP_PAYMENT_WEBHOOK_SECRET=$PAYMENT_WEBHOOK_SECRET"
  if [ "$(payments)" = stripe ]; then
    echo "SHOP_STRIPE_API_BASE=$(stripe_api_base "$STRIPE_MOCK_PORT" "$STRIPE_RECORDER_PORT")"
    echo "SHOP_STRIPE_SECRET_KEY=$stripe_secret_key"
    echo "SHOP_STRIPE_WEBHOOK_SECRET=$STRIPE_WEBHOOK_SECRET"
  fi
}

# stripe-mock takes any test-mode key (sk_test_…).
stripe_secret_key=sk_test_123

run_shop() {
  local env=()
  need_shop
  mapfile -t env < <(shop_env)
  env "${env[@]}" bin/shop "$@"
}

# need_shop builds bin/shop when it is missing, for the stack's own uses of
# it outside `up` (which always builds it): the migrations and the seed of
# a database `replicas` starts, the Galera nodes' agents.
need_shop() {
  [ -x bin/shop ] && return 0
  log "building bin/shop"
  go build -o bin/shop ./cmd/shop
}

build() {
  log "building bin/shop and bin/loadtest"
  go build -o bin/shop ./cmd/shop
  go build -o bin/loadtest ./loadtest
}

start_servers() {
  start_db
  start_masters
  start_topology
  prepare_db always
}

# start_db starts the database of the stack's topology unless it runs: the
# single MariaDB, or the Galera cluster behind HAProxy (which then runs
# until down, as the lock servers do, so that the demo can go back and
# forth). It tells prepare_db whether it started one (db_started), and one
# without data (db_fresh).
db_started= db_fresh=
start_db() {
  case $(db_topology) in
    single)
      [ -d "$state/mariadb/data/mysql" ] || db_fresh=1
      serving "$state/mariadb" "$SINGLE_MYSQL_PORT" || { start_mariadb_on_port; db_started=1; }
      ;;
    galera)
      [ -e "$galera/nodes" ] || db_fresh=1
      galera_serving || { start_galera_stack; db_started=1; }
      ;;
  esac
}

# prepare_db [always] applies the migrations to the database start_db
# started (or, with always, to the one running), and seeds the catalog of
# one it started without data. Redis must run: a seed resets the cache.
prepare_db() {
  [ -n "$db_started" ] || [ -n "${1:-}" ] || return 0
  run_shop migrate >/dev/null
  if [ -n "$db_fresh" ]; then
    run_shop seed --products "${PRODUCTS:-5000}" --stock "${STOCK:-1}" >&2
  fi
}

# start_mariadb_on_port starts MariaDB on its saved port (claim_port).
start_mariadb_on_port() {
  claim_port SINGLE_MYSQL_PORT 0 MariaDB
  start_mariadb "$state/mariadb" "$SINGLE_MYSQL_PORT"
}

# The Galera cluster, its agents and HAProxy live in $galera
# (scripts/galera.sh).
galera=$state/galera

# galera_serving tells whether the Galera cluster's nodes, their agents and
# HAProxy all run, each on its port.
galera_serving() {
  local i
  [ -e "$galera/nodes" ] || return 1
  for i in 0 1 2; do
    serving "$galera/nodes/n$i" "${db_node_ports[$i]}" && serving "$galera/agent$i" "${db_agent_ports[$i]}" || return 1
  done
  serving "$galera/haproxy" "$HAPROXY_PORT"
}

# start_galera_stack starts what of the Galera cluster, its agents and
# HAProxy does not run, and returns once a connection through HAProxy
# commits. A cluster's ports are claimed when it is made: they are written
# into its nodes' command lines.
start_galera_stack() {
  local i sets=() nodes=() start=$SECONDS
  if [ ! -e "$galera/nodes" ]; then
    claim_ports db_node_ports "a Galera node"
    claim_ports db_gcomm_ports "a Galera node's gcomm"
    claim_ports db_ist_ports "a Galera node's IST"
    claim_ports db_sst_ports "a Galera node's SST"
  fi
  for i in 0 1 2; do
    sets+=("${db_node_ports[$i]},${db_gcomm_ports[$i]},${db_ist_ports[$i]},${db_sst_ports[$i]}")
    nodes+=("${db_node_ports[$i]}:${db_agent_ports[$i]}")
  done
  start_galera "$galera" "${sets[@]}"
  need_shop
  for i in 0 1 2; do
    serving "$galera/agent$i" "${db_agent_ports[$i]}" && continue
    claim_port db_agent_ports "$i" "the db-agent of Galera node n$i"
    start_db_agent "$galera/agent$i" "${db_agent_ports[$i]}" "${db_node_ports[$i]}" bin/shop
  done
  if ! serving "$galera/haproxy" "$HAPROXY_PORT"; then
    claim_port HAPROXY_PORT 0 HAProxy
    claim_port HAPROXY_STATS_PORT 0 "HAProxy's stats"
    start_haproxy "$galera/haproxy" "$HAPROXY_PORT" "$HAPROXY_STATS_PORT" "${nodes[@]}"
  fi
  wait_db_write "" 60 >/dev/null || die "no write commits through HAProxy on :$HAPROXY_PORT"
  log "Galera cluster behind HAProxy on 127.0.0.1:$HAPROXY_PORT in $((SECONDS - start))s; new connections reach n$(galera_writer "$HAPROXY_PORT")"
}

# db_write commits a row through HAProxy, into the stack's own table
# (shop_stack.probe), and prints the index of the node it committed on.
db_write() {
  local name
  name=$(galera_sql "$HAPROXY_PORT" "CREATE DATABASE IF NOT EXISTS shop_stack;
    CREATE TABLE IF NOT EXISTS shop_stack.probe (id BIGINT AUTO_INCREMENT PRIMARY KEY, node VARCHAR(8) NOT NULL, at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6));
    INSERT INTO shop_stack.probe (node) VALUES (@@wsrep_node_name); SELECT @@wsrep_node_name" 2>/dev/null) || return 1
  [[ $name == n[0-9] ]] && echo "${name#n}"
}

# wait_db_write NOT SECONDS waits until a write through HAProxy commits on a
# node other than NOT (empty: any), and prints that node's index.
wait_db_write() {
  local deadline=$((SECONDS + $2)) node
  while :; do
    if node=$(db_write) && [ "$node" != "$1" ]; then echo "$node"; return 0; fi
    [ $SECONDS -lt $deadline ] || return 1
    sleep 0.1
  done
}

# start_master I starts Redis master I on its saved port (claim_port).
start_master() {
  claim_port redis_ports "$1" "Redis master $1"
  start_redis "$state/redis$1" "${redis_ports[$1]}"
}

# start_masters starts the Redis masters that are not running (a master
# killed by the demo comes back empty, as after a crash).
start_masters() {
  local i
  for i in 0 1 2; do
    serving "$state/redis$i" "${redis_ports[$i]}" || start_master "$i"
  done
}

# set_running DIR PORT... tells whether the server of each PORT runs (a
# Cluster's or a Sentinel set-up's, in DIR/PORT).
set_running() {
  local dir=$1 port
  shift
  for port in "$@"; do serving "$dir/$port" "$port" || return 1; done
}

# claim_ports VAR WHAT claims each port of the array VAR (claim_port).
claim_ports() {
  local -n list=$1
  local i
  for i in "${!list[@]}"; do claim_port "$1" "$i" "$2"; done
}

# start_topology starts the Redis Cluster or the Sentinel set-up of the
# stack's topology unless all of it runs. A set that runs in part is
# stopped and started again from nothing: its servers keep no data, and a
# Cluster's nodes or a Sentinel's view would remember the old set.
start_topology() {
  local dir
  case $(topology) in
    cluster)
      dir=$state/redis-cluster
      set_running "$dir" "${cluster_ports[@]}" && return 0
      stop_redis_set "$dir"
      rm -rf "$dir"
      claim_ports cluster_ports "the Redis Cluster"
      start_redis_cluster "$dir" "${cluster_ports[@]}"
      ;;
    sentinel)
      dir=$state/redis-sentinel
      set_running "$dir" "${sentinel_redis_ports[@]}" "${sentinel_ports[@]}" && return 0
      stop_redis_set "$dir"
      rm -rf "$dir"
      claim_ports sentinel_redis_ports "the Sentinels' Redis"
      claim_ports sentinel_ports "the Sentinels"
      start_redis_sentinel "$dir" "$sentinel_name" "${sentinel_redis_ports[@]}" "${sentinel_ports[@]}"
      ;;
  esac
}

# replica_setting NAME prints the value of NAME among the settings the
# replicas were last given (empty when not among them).
replica_setting() { sed -n "s/^$1=//p" "$state/replica-settings" 2>/dev/null | tail -1; }

# lock_mode prints the SHOP_LOCK_MODE the replicas were last given (empty:
# the default, redis).
lock_mode() { replica_setting SHOP_LOCK_MODE; }

# payments prints the replicas' payment provider, SHOP_PAYMENTS: webhook
# (the default) or stripe.
payments() {
  local mode
  mode=$(replica_setting SHOP_PAYMENTS)
  echo "${mode:-webhook}"
}

# set_payments records SHOP_PAYMENTS, when it is set, among the replicas'
# settings, in place of the one there: `SHOP_PAYMENTS=stripe make up`.
# The other settings are kept.
set_payments() {
  local kept=()
  case ${SHOP_PAYMENTS:-} in
    "") return 0 ;;
    webhook | stripe) ;;
    *) die "SHOP_PAYMENTS=$SHOP_PAYMENTS: want webhook or stripe" ;;
  esac
  [ ! -f "$state/replica-settings" ] || mapfile -t kept < <(grep -v '^SHOP_PAYMENTS=' "$state/replica-settings")
  printf '%s\n' "${kept[@]}" "SHOP_PAYMENTS=$SHOP_PAYMENTS" | grep -v '^$' >"$state/replica-settings"
}

# start_payment_servers starts stripe-mock, and the recording proxy in
# front of it, when the replicas take payments from Stripe, unless they
# run. Once started they run until down, as the lock servers do.
start_payment_servers() {
  local dir=$state/stripe
  [ "$(payments)" = stripe ] || return 0
  stripe_running "$dir" "$STRIPE_MOCK_PORT" "$STRIPE_RECORDER_PORT" && return 0
  stop_stripe "$dir"
  claim_port STRIPE_MOCK_PORT 0 stripe-mock
  claim_port STRIPE_RECORDER_PORT 0 "stripe-mock's recording proxy"
  start_stripe "$dir" "$STRIPE_MOCK_PORT" "$STRIPE_RECORDER_PORT"
}

# start_lock_servers starts the etcd cluster or the ZooKeeper ensemble when
# the replicas' lock mode needs it, unless all of it runs. Once started
# they run until down: the rows of other modes leave them alone. A set that
# runs in part is stopped and started again on its data.
start_lock_servers() {
  case $(lock_mode) in
    etcd)
      set_running "$state/etcd" "${etcd_ports[@]}" && return 0
      if [ -d "$state/etcd" ]; then
        stop_etcd_cluster "$state/etcd"
      else
        claim_ports etcd_ports "the etcd cluster"
      fi
      start_etcd_cluster "$state/etcd" "${etcd_ports[@]}"
      ;;
    zookeeper)
      set_running "$state/zookeeper" "${zk_ports[@]}" && return 0
      if [ -d "$state/zookeeper" ]; then
        stop_zk_ensemble "$state/zookeeper"
      else
        claim_ports zk_ports "the ZooKeeper ensemble"
      fi
      start_zk_ensemble "$state/zookeeper" "${zk_ports[@]}"
      ;;
  esac
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

# admin_port I prints the port of replica I's operators' listener
# (SHOP_ADMIN_ADDR): its admin API and /metrics, which its public port and
# nginx answer 404 for.
admin_port() { echo "${admin_ports[$(($1 - 1))]}"; }

# binary_sum [BINARY] prints the SHA-256 of BINARY (bin/shop): what a
# replica records at start, so that `up` can tell the replicas still running
# an older build.
binary_sum() {
  local bin=${1:-bin/shop}
  if command -v sha256sum >/dev/null 2>&1; then sha256sum "$bin"; else shasum -a 256 "$bin"; fi | cut -d' ' -f1
}

# replica_env prints the settings the replicas are started with: those
# all shop processes share, then those the replicas were last given
# (state/replica-settings, one VAR=VALUE a line), which win.
replica_env() {
  shop_env
  [ ! -f "$state/replica-settings" ] || cat "$state/replica-settings"
}

# start_replica I starts replica I, without waiting for it, with
# replica_env, and records which binary it runs and with which settings.
# SHOP_BINARY among the settings runs another build of shop (the demo's
# failpoints build). A setting written I:VAR=VALUE is replica I's alone
# (the demo's events row runs one replica on the failpoints build).
start_replica() {
  local dir=$state/replica$1 env=() all=() settings=() kv bin=bin/shop
  mapfile -t env < <(shop_env)
  [ ! -f "$state/replica-settings" ] || mapfile -t all <"$state/replica-settings"
  for kv in "${all[@]}"; do
    case $kv in
      "$1":*) settings+=("${kv#*:}") ;;
      [0-9]:*) ;;
      *) settings+=("$kv") ;;
    esac
  done
  for kv in "${settings[@]}"; do
    case $kv in SHOP_BINARY=*) bin=${kv#SHOP_BINARY=} ;; esac
  done
  claim_port replica_ports $(($1 - 1)) "replica $1"
  claim_port admin_ports $(($1 - 1)) "replica $1's admin listener"
  mkdir -p "$dir"
  binary_sum "$bin" >"$dir/binary"
  replica_env >"$dir/env"
  env "${env[@]}" SHOP_HTTP_ADDR="127.0.0.1:$(replica_port "$1")" SHOP_ADMIN_ADDR="127.0.0.1:$(admin_port "$1")" "${settings[@]}" \
    "$bin" serve </dev/null >>"$dir/shop.log" 2>&1 &
  echo $! >"$dir/pid"
}

# wait_replica I waits until replica I listens on its port and answers
# its /readyz.
wait_replica() {
  local port
  port=$(replica_port "$1")
  { wait_port "$port" 30 "$(cat "$state/replica$1/pid")" && wait_ready "$port" 30; } ||
    { tail -5 "$state/replica$1/shop.log" >&2; die "replica $1 is not ready on port $port"; }
}

# start_replicas N [VAR=VALUE...] starts replicas 1..N with the settings,
# which later restarts of a replica keep.
start_replicas() {
  local n=$1 i
  shift
  printf '%s\n' "$@" | grep -v '^$' >"$state/replica-settings" || true
  start_lock_servers
  start_payment_servers
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
    if serving "$state/replica$i" "$(replica_port "$i")"; then running+=("$i"); fi
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
  if serving "$dir" "$NGINX_PORT"; then
    reload_nginx "$(cat "$dir/pid")"
  else
    local holder
    if holder=$(port_holder "$NGINX_PORT"); then
      die "127.0.0.1:$NGINX_PORT is taken by $holder: stop it, or make down and start again with NGINX_PORT set (0 picks a free port)"
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
  set_topology
  set_db_topology
  set_payments
  load_ports
  start_servers
  start_lock_servers
  start_payment_servers
  local n=${REPLICAS:-$(cat "$state/replicas" 2>/dev/null || echo 3)} i sum started=() stale=()
  sum=$(binary_sum)
  for i in $(seq 1 "$n"); do
    if ! serving "$state/replica$i" "$(replica_port "$i")"; then
      start_replica "$i"
      started+=("$i")
    elif [ "$(cat "$state/replica$i/binary" 2>/dev/null)" != "$sum" ] ||
      [ "$(cat "$state/replica$i/env" 2>/dev/null)" != "$(replica_env)" ]; then
      stale+=("$i")
    fi
  done
  for i in "${started[@]}"; do wait_replica "$i"; done
  echo "$n" >"$state/replicas"
  [ ${#started[@]} -eq 0 ] || log "started replica(s) ${started[*]}"
  nginx_up "$n"
  # Replicas started from an older bin/shop, or on another Redis topology,
  # or before a server moved to another port, or with other settings (a
  # SHOP_PAYMENTS given now): restarted one at a time.
  [ ${#stale[@]} -eq 0 ] || restart_replicas "${stale[@]}"
  local admins= metrics= pay
  for i in $(seq 1 "$n"); do
    admins+=" http://127.0.0.1:$(admin_port "$i")"
    metrics+=" http://127.0.0.1:$(admin_port "$i")/metrics"
  done
  pay="POST http://127.0.0.1:$NGINX_PORT/api/v1/payments/events, Standard Webhooks signed with SHOP_PAYMENT_WEBHOOK_SECRET=$PAYMENT_WEBHOOK_SECRET"
  if [ "$(payments)" = stripe ]; then
    local calls=
    ! has_stripe_recorder || calls=", calls recorded in $state/stripe/calls.jsonl"
    pay="Stripe on stripe-mock ($(stripe_api_base "$STRIPE_MOCK_PORT" "$STRIPE_RECORDER_PORT")$calls); its webhooks to POST http://127.0.0.1:$NGINX_PORT/api/v1/payments/stripe signed with SHOP_STRIPE_WEBHOOK_SECRET=$STRIPE_WEBHOOK_SECRET"
  fi
  cat <<EOF
shop is up: http://127.0.0.1:$NGINX_PORT  (nginx → $n replicas, Redis: $(topology), MySQL: $(db_status_line))
  try:     curl -s -XPOST http://127.0.0.1:$NGINX_PORT/api/v1/orders -H 'Content-Type: application/json' -d '{"sku_id":1,"user_id":1}'
  payments: $pay
  admin:  ${admins}  (each replica's operators' listener: /api/v1/admin/* with Authorization: Bearer $ADMIN_TOKEN)
  metrics:${metrics}
  logs:    $state/replica*/shop.log, $state/nginx/logs/
  stop:    make down
EOF
}

down() {
  if [ ! -e "$state" ]; then
    log "no stack in $state"
    return
  fi
  own_state
  if [ ! -f "$ports" ]; then
    rm -rf "$state"
    log "no stack ran in $state; removed it"
    return
  fi
  stop_pidfile "$state/nginx/pid"
  stop_replicas
  local i
  for i in 0 1 2; do stop_pidfile "$state/redis$i/pid"; done
  stop_redis_set "$state/redis-cluster"
  stop_redis_set "$state/redis-sentinel"
  [ ! -d "$state/etcd" ] || stop_etcd_cluster "$state/etcd"
  [ ! -d "$state/zookeeper" ] || stop_zk_ensemble "$state/zookeeper"
  stop_stripe "$state/stripe"
  stop_pidfile "$state/mariadb/pid" 30 # InnoDB writes its buffers out
  stop_pidfile "$galera/haproxy/pid"
  for i in 0 1 2; do stop_pidfile "$galera/agent$i/pid"; done
  stop_galera "$galera"
  remove_galera "$galera"
  rm -rf "$state"
  log "stack stopped, $state removed"
}

status() {
  [ -e "$state" ] || { echo "no stack in $state"; return; }
  own_state
  [ -f "$ports" ] || { echo "no stack in $state"; return; }
  load_ports
  local name sum port
  sum=$(binary_sum 2>/dev/null || true)
  for name in mariadb redis0 redis1 redis2 nginx replica1 replica2 replica3; do
    case $name in
      mariadb) port=$SINGLE_MYSQL_PORT ;;
      redis?) port=${redis_ports[${name#redis}]} ;;
      nginx) port=$NGINX_PORT ;;
      replica?) port=$(replica_port "${name#replica}") ;;
    esac
    if serving "$state/$name" "$port"; then
      echo -n "$name: running (pid $(cat "$state/$name/pid"))"
      if [ -f "$state/$name/binary" ] && [ "$(cat "$state/$name/binary")" != "$sum" ]; then echo -n ", an older bin/shop"; fi
      echo
    elif alive "$state/$name"; then echo "$name: pid $(cat "$state/$name/pid") runs but does not listen on :$port"
    else echo "$name: stopped"; fi
  done
  topology_status
  galera_status
  echo "nginx: http://127.0.0.1:$NGINX_PORT, replicas on ${replica_ports[*]} (admin and /metrics on ${admin_ports[*]}), MySQL $(db_status_line), Redis ${redis_ports[*]}"
  echo "Redis topology: $(topology) ($(redis_env | xargs))"
  echo "payments: $(payments)"
  if [ -d "$state/stripe" ]; then
    if stripe_running "$state/stripe" "$STRIPE_MOCK_PORT" "$STRIPE_RECORDER_PORT"; then
      echo "stripe-mock: running on :$STRIPE_MOCK_PORT, Stripe's API for shop at $(stripe_api_base "$STRIPE_MOCK_PORT" "$STRIPE_RECORDER_PORT")"
    else echo "stripe-mock: stopped"; fi
  fi
  [ ! -s "$state/replica-settings" ] || echo "replica settings: $(xargs <"$state/replica-settings")"
}

# db_status_line says which database the stack's shop processes use, and
# on which port (MYSQL_PORT).
db_status_line() {
  case $(db_topology) in
    single) echo "single MariaDB on :$SINGLE_MYSQL_PORT" ;;
    galera) echo "Galera behind HAProxy on :$HAPROXY_PORT (nodes on ${db_node_ports[*]})" ;;
  esac
}

# galera_status prints, once the stack has had a Galera cluster, each
# node's state (wsrep_local_state, cluster status, ready) and HAProxy's view
# of it, and the node new connections reach.
galera_status() {
  local i port st hp writer
  [ -e "$galera/nodes" ] || return 0
  hp=$(haproxy_servers "$HAPROXY_STATS_PORT" 2>/dev/null | tr '\n' ' ') || hp=
  for i in 0 1 2; do
    port=${db_node_ports[$i]}
    if serving "$galera/nodes/n$i" "$port"; then
      st=$(galera_state "$port") || st="no answer"
      echo "galera n$i :$port: running (pid $(cat "$galera/nodes/n$i/pid")), wsrep state/cluster/ready: $st"
    else echo "galera n$i :$port: stopped"; fi
    if serving "$galera/agent$i" "${db_agent_ports[$i]}"; then echo "db-agent n$i :${db_agent_ports[$i]}: running"
    else echo "db-agent n$i :${db_agent_ports[$i]}: stopped"; fi
  done
  if serving "$galera/haproxy" "$HAPROXY_PORT"; then
    writer=$(galera_writer "$HAPROXY_PORT") && writer=n$writer || writer=none
    echo "haproxy :$HAPROXY_PORT: running (pid $(cat "$galera/haproxy/pid")); servers: ${hp:-?}; new connections reach: $writer; stats http://127.0.0.1:$HAPROXY_STATS_PORT/;csv"
  else echo "haproxy :$HAPROXY_PORT: stopped"; fi
}

# topology_status prints which servers of a Cluster or a Sentinel set-up
# run, and which is the master as the Sentinels see it.
topology_status() {
  local port
  for port in "${cluster_ports[@]}"; do
    [ -d "$state/redis-cluster/$port" ] || continue
    if serving "$state/redis-cluster/$port" "$port"; then echo "cluster :$port: running (pid $(cat "$state/redis-cluster/$port/pid"))"
    else echo "cluster :$port: stopped"; fi
  done
  for port in "${sentinel_redis_ports[@]}" "${sentinel_ports[@]}"; do
    [ -d "$state/redis-sentinel/$port" ] || continue
    if serving "$state/redis-sentinel/$port" "$port"; then echo "sentinel set :$port: running (pid $(cat "$state/redis-sentinel/$port/pid"))"
    else echo "sentinel set :$port: stopped"; fi
  done
  if [ -d "$state/redis-sentinel" ]; then
    echo "sentinel set: master $sentinel_name on :$(sentinel_master || echo '?') (Sentinels on ${sentinel_ports[*]})"
  fi
}

# kill_replica I kills replica I (SIGKILL), as a crash would; nginx sends
# new requests to the others. It stays down until `replicas` or `up`.
kill_replica() {
  local pid
  serving "$state/replica$1" "$(replica_port "$1")" || die "replica $1 is not running"
  pid=$(cat "$state/replica$1/pid")
  kill -9 "$pid"
  log "replica $1 (pid $pid) killed"
}

# start_one_replica I starts replica I, with the settings the replicas were
# last given, unless it runs, and waits until it is ready; nginx, which
# already lists it, sends to it again once its fail_timeout is over.
start_one_replica() {
  [ "$1" -le "$(cat "$state/replicas")" ] || die "replica $1 is not one of the stack's $(cat "$state/replicas")"
  if serving "$state/replica$1" "$(replica_port "$1")"; then
    log "replica $1 is running"
    return 0
  fi
  start_replica "$1"
  wait_replica "$1"
  log "replica $1 (pid $(cat "$state/replica$1/pid")) started"
}

# restart_redis kills Redis master 0, the cache's and the lock's (SIGKILL),
# and starts it again on its port, empty, as after a crash without
# persistence.
restart_redis() {
  local dir=$state/redis0 pid
  if serving "$dir" "${redis_ports[0]}"; then
    pid=$(cat "$dir/pid")
    kill_pidfile "$dir/pid"
    log "Redis master 0 (pid $pid) killed"
  fi
  start_master 0
}

# restart_mariadb stops MariaDB (SIGTERM: it finishes, writes its buffers
# out and exits), starts it again on its port and data directory, and
# returns once it accepts connections.
restart_mariadb() {
  stop_pidfile "$state/mariadb/pid" 60
  log "MariaDB stopped"
  start_mariadb_on_port
}

# sentinel_master [SENTINEL_PORT] prints the port of the master as the
# Sentinel on SENTINEL_PORT (default the first) sees it; it fails when that
# Sentinel does not answer.
sentinel_master() {
  local port
  port=$(redis_cli "${1:-${sentinel_ports[0]}}" SENTINEL get-master-addr-by-name "$sentinel_name" 2>/dev/null |
    tr -d '\r' | sed -n 2p)
  [ -n "$port" ] && echo "$port"
}

# need_sentinel fails unless the stack's topology is sentinel and its
# Sentinel set-up runs.
need_sentinel() {
  [ "$(topology)" = sentinel ] ||
    die "the stack's Redis topology is $(topology): REDIS_TOPOLOGY=sentinel $0 replicas N (or redis-up) first"
  set_running "$state/redis-sentinel" "${sentinel_ports[@]}" || die "the Sentinels are not running: $0 redis-up"
}

# Failover waits, in seconds: the Sentinels see a master down after 3 s
# and elect a leader within a few; a replica's first sync takes well under
# a second. Loose bounds for a slow, shared machine.
failover_timeout=60

# wait_new_master OLD waits until every Sentinel names a master other than
# the one on port OLD, the same one, and prints its port.
wait_new_master() {
  local old=$1 deadline=$((SECONDS + failover_timeout)) port master seen
  while :; do
    seen=
    for port in "${sentinel_ports[@]}"; do
      master=$(sentinel_master "$port") || master=
      if [ -z "$master" ] || [ "$master" = "$old" ] || { [ -n "$seen" ] && [ "$master" != "$seen" ]; }; then
        seen=
        break
      fi
      seen=$master
    done
    if [ -n "$seen" ]; then echo "$seen"; return 0; fi
    [ $SECONDS -lt $deadline ] || die "the Sentinels did not promote a master other than :$old within ${failover_timeout}s"
    sleep 0.1
  done
}

# wait_following PORT MASTER waits until the Redis on PORT is a replica of
# the master on port MASTER and in sync with it.
wait_following() {
  local port=$1 master=$2 deadline=$((SECONDS + failover_timeout)) info
  while :; do
    info=$(redis_cli "$port" INFO replication 2>/dev/null | tr -d '\r') || info=
    if grep -qx role:slave <<<"$info" && grep -qx "master_port:$master" <<<"$info" &&
      grep -qx master_link_status:up <<<"$info"; then
      return 0
    fi
    [ $SECONDS -lt $deadline ] || die "Redis on :$port is not a replica in sync with :$master within ${failover_timeout}s"
    sleep 0.1
  done
}

# failover_redis has the Sentinels fail the master over (SENTINEL FAILOVER,
# as for maintenance: no agreement needed, the master need not be down) and
# returns once they all name the promoted replica and the old master follows
# it. The old master is running: it is made a replica of the new one.
failover_redis() {
  local old new reply deadline
  need_sentinel
  old=$(sentinel_master) || die "the Sentinel on :${sentinel_ports[0]} does not name a master"
  # A Sentinel promotes a replica only once it has had that replica's own
  # INFO, on its own schedule: until then it answers NOGOODSLAVE.
  deadline=$((SECONDS + failover_timeout))
  while :; do
    reply=$(redis_cli "${sentinel_ports[0]}" SENTINEL FAILOVER "$sentinel_name" 2>&1 | tr -d '\r')
    [ "$reply" = OK ] && break
    [[ $reply == NOGOODSLAVE* ]] && [ $SECONDS -lt $deadline ] || die "SENTINEL FAILOVER $sentinel_name: $reply"
    sleep 0.2
  done
  new=$(wait_new_master "$old")
  log "Redis master $sentinel_name failed over from :$old to :$new"
  wait_following "$old" "$new"
  log "Redis on :$old follows the new master :$new"
}

# kill_redis_master kills the master (SIGKILL), as a crash would, waits
# until the Sentinels have seen it down (after 3 s) and promoted the
# replica, then starts it again on its port, empty, as after a crash
# without persistence, and as a replica of the master the Sentinels name,
# the way a deployment's start script asks them first. Left to find its old
# master back as a master, a Sentinel converts it only after two of its
# INFO rounds, 10 s apart, and not at all while it is in TILT (30 s after
# a stall of 2 s, which a loaded machine has): over a minute on a busy run.
# Returns once it is in sync.
kill_redis_master() {
  local old new pid dir
  need_sentinel
  old=$(sentinel_master) || die "the Sentinel on :${sentinel_ports[0]} does not name a master"
  dir=$state/redis-sentinel/$old
  serving "$dir" "$old" || die "the master on :$old is not running"
  pid=$(cat "$dir/pid")
  kill_pidfile "$dir/pid"
  log "Redis master $sentinel_name on :$old (pid $pid) killed"
  new=$(wait_new_master "$old")
  log "the Sentinels promoted :$new"
  start_redis "$dir" "$old" --replicaof 127.0.0.1 "$new"
  wait_following "$old" "$new"
  log "Redis on :$old is back, a replica of :$new"
}

# kill_etcd_leader kills the etcd cluster's leader (SIGKILL), as a crash
# would, waits until the others have elected a new one, and starts the
# killed member again on its data; it returns once that member serves.
kill_etcd_leader() {
  local dir=$state/etcd old new
  set_running "$dir" "${etcd_ports[@]}" || die "the etcd cluster is not running: $0 replicas N SHOP_LOCK_MODE=etcd first"
  old=$(etcd_leader_dir "$dir") || die "the etcd cluster has no leader"
  kill_pidfile "$old/pid"
  log "etcd leader on :${old##*/} killed"
  new=$(etcd_leader_dir "$dir") || die "no new etcd leader within 10s"
  log "etcd elected :${new##*/}"
  start_etcd_member "$dir" "${old##*/}"
}

# kill_zk_leader kills the ZooKeeper ensemble's leader (SIGKILL), waits
# until the others have elected a new one, and starts the killed server
# again on its data; it returns once that server follows.
kill_zk_leader() {
  local dir=$state/zookeeper old new deadline
  set_running "$dir" "${zk_ports[@]}" || die "the ZooKeeper ensemble is not running: $0 replicas N SHOP_LOCK_MODE=zookeeper first"
  old=$(zk_leader_dir "$dir") || die "the ZooKeeper ensemble has no leader"
  kill_pidfile "$old/pid"
  log "ZooKeeper leader on :${old##*/} killed"
  deadline=$((SECONDS + 30))
  until new=$(zk_leader_dir "$dir"); do
    [ $SECONDS -lt $deadline ] || die "no new ZooKeeper leader within 30s"
    sleep 0.1
  done
  log "ZooKeeper elected :${new##*/}"
  zk_start_server "$old"
  zk_wait_serving "$old" 60 || die "ZooKeeper on :${old##*/} does not serve again"
  log "ZooKeeper on :${old##*/} is back"
}

# need_galera fails unless the stack's database is the Galera cluster and
# HAProxy runs in front of it.
need_galera() {
  [ "$(db_topology)" = galera ] ||
    die "the stack's database is $(db_topology): DB_TOPOLOGY=galera $0 replicas N (or up) first"
  serving "$galera/haproxy" "$HAPROXY_PORT" || die "HAProxy is not running: $0 up"
}

# since START prints the seconds from START (an EPOCHREALTIME) until now.
since() { awk -v a="$1" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }'; }

# A node's eviction takes the cluster about 6 s, a restart on its data
# (IST) some 20 s: loose bounds for a slow, shared machine.
galera_timeout=180

# db_writer prints the index of the node new connections reach through
# HAProxy.
db_writer() {
  need_galera
  galera_writer "$HAPROXY_PORT" || die "no node answers through HAProxy on :$HAPROXY_PORT"
}

# wait_failback I waits until HAProxy has marked node I up (its agent
# answers up twice, 500 ms apart) and new connections through it reach its
# first node that is up, in its order n0, n1, n2: a node marked up again
# takes the writer's place back, cutting the backups' connections; logs
# where they go.
wait_failback() {
  local deadline=$((SECONDS + 30)) want writer servers
  while :; do
    servers=$(haproxy_servers "$HAPROXY_STATS_PORT" 2>/dev/null) || servers=
    want=$(awk '$2 == "UP" { print substr($1, 2); exit }' <<<"$servers")
    writer=$(galera_writer "$HAPROXY_PORT" 2>/dev/null) || writer=
    if grep -qx "n$1 UP" <<<"$servers" && [ -n "$want" ] && [ "$writer" = "$want" ]; then break; fi
    [ $SECONDS -lt $deadline ] || { log "HAProxy's first node up is n${want:-?}, new connections reach n${writer:-?}"; return 0; }
    sleep 0.2
  done
  log "new connections through HAProxy reach n$writer"
}

# spare_donor I prints node I's wsrep_sst_donor for a rejoin: the node that
# is neither I nor the one HAProxy sends to, then any (the trailing comma).
# A donor is Donor/Desynced while it sends, even an IST's write-sets, and
# its agent says down: were it the writer, HAProxy would move the writes
# away from it for the transfer and back after it, two failovers for one
# rejoin.
spare_donor() {
  local w i
  w=$(galera_writer "$HAPROXY_PORT" 2>/dev/null) || w=
  for i in 0 1 2; do
    if [ "$i" != "$1" ] && [ "$i" != "$w" ]; then
      echo "n$i,"
      return
    fi
  done
}

# kill_db_writer kills the node HAProxy sends to (SIGKILL), as a machine's
# loss would, waits until a write through HAProxy commits on another node,
# then starts the killed node again on its data and waits until it is
# Synced (IST: it missed only what the others' gcache holds), and until
# HAProxy sends to it again.
kill_db_writer() {
  local old new t0 t1 nodes
  old=$(db_writer)
  nodes=$(galera_nodes_dir "$galera")
  t0=$EPOCHREALTIME
  kill_pidfile "$nodes/n$old/pid"
  new=$(wait_db_write "$old" $galera_timeout) || die "no write through HAProxy committed on another node within ${galera_timeout}s of n$old's kill"
  log "the writer n$old killed; new connections reach n$new after $(since "$t0") s"
  t1=$EPOCHREALTIME
  launch_galera_node "$galera" "$old" --wsrep-sst-donor="$(spare_donor "$old")"
  wait_galera_synced "$galera" "$old" $galera_timeout || die "Galera node n$old is not Synced again"
  log "n$old started again on its data: Synced after $(since "$t1") s ($(galera_transfer "$old"))"
  wait_failback "$old"
}

# galera_transfer I says how node I's last join was fed, from its log: IST
# or a full state transfer (SST), and from which node.
galera_transfer() {
  local log how donor
  log=$(galera_nodes_dir "$galera")/n$1/mysqld.log
  # The joiner's IST receiver names the first transaction it expects, and
  # the state it starts from: none (zeros) when it is to get a full copy.
  if grep 'IST uuid:' "$log" | tail -1 | grep -q 'uuid:00000000-0000-0000-0000-000000000000'; then
    how="a full state transfer, SST"
  else how=IST; fi
  # "Member 0.0 (n0) requested state transfer from 'n2,'. Selected 1.0 (n2)(SYNCED) as donor."
  donor=$(sed -n "s/.*(n$1) requested state transfer.* Selected [^ ]* (\(n[0-9]\)).* as donor.*/\1/p" "$log" | tail -1)
  echo "$how from ${donor:-?}"
}

# stop_db_node I stops node I (SIGTERM: it leaves the cluster cleanly and
# writes its buffers out) and waits until HAProxy sends to a node that runs.
stop_db_node() {
  local nodes t0 writer
  need_galera
  nodes=$(galera_nodes_dir "$galera")
  t0=$EPOCHREALTIME
  stop_pidfile "$nodes/n$1/pid" 60
  writer=$(wait_db_write "$1" $galera_timeout) || die "no write through HAProxy committed on a running node"
  log "Galera node n$1 stopped; new connections reach n$writer, $(since "$t0") s after the stop began"
}

# start_db_node I starts node I again on its data, unless it runs, and
# waits until it is Synced.
start_db_node() {
  local t0
  need_galera
  if galera_node_running "$galera" "$1"; then
    log "Galera node n$1 is running"
    return 0
  fi
  t0=$EPOCHREALTIME
  launch_galera_node "$galera" "$1" --wsrep-sst-donor="$(spare_donor "$1")"
  wait_galera_synced "$galera" "$1" $galera_timeout || die "Galera node n$1 is not Synced"
  log "Galera node n$1 started on its data: Synced after $(since "$t0") s ($(galera_transfer "$1"))"
  wait_failback "$1"
}

# partition_db_writer cuts the writer off from the other two nodes without
# killing it (gmcast.isolate=1: it drops its group links): it becomes a
# non-Primary component of one and refuses statements (ERROR 1047), the
# others evict it. Returns once a write through HAProxy commits on another
# node; heal_db_partition ends it.
partition_db_writer() {
  local old new t0
  old=$(db_writer)
  t0=$EPOCHREALTIME
  galera_sql "${db_node_ports[$old]}" "SET GLOBAL wsrep_provider_options='gmcast.isolate=1'" ||
    die "could not isolate n$old"
  new=$(wait_db_write "$old" $galera_timeout) || die "no write through HAProxy committed on another node within ${galera_timeout}s of n$old's isolation"
  log "the writer n$old isolated; new connections reach n$new after $(since "$t0") s"
}

# heal_db_partition ends the isolation of every node that is cut off from
# the group (gmcast.isolate=0) and waits until it is Synced again.
heal_db_partition() {
  local i t0 healed=()
  need_galera
  t0=$EPOCHREALTIME
  for i in 0 1 2; do
    galera_node_running "$galera" "$i" || continue
    [ "$(galera_state "${db_node_ports[$i]}" | cut -d' ' -f2)" = Primary ] && continue
    galera_sql "${db_node_ports[$i]}" "SET GLOBAL wsrep_sst_donor='$(spare_donor "$i")'" || die "could not set n$i's donor"
    galera_sql "${db_node_ports[$i]}" "SET GLOBAL wsrep_provider_options='gmcast.isolate=0'" || die "could not heal n$i"
    healed+=("$i")
  done
  [ ${#healed[@]} -gt 0 ] || { log "no Galera node is cut off"; return 0; }
  for i in "${healed[@]}"; do
    wait_galera_synced "$galera" "$i" $galera_timeout || die "Galera node n$i is not Synced again"
    log "n$i rejoined: Synced after $(since "$t0") s"
  done
  wait_failback "${healed[0]}"
}

# db_node_arg I fails unless I is a node's index.
db_node_arg() { [[ ${1:-} =~ ^[0-2]$ ]] || die "usage: $0 ${2} 0..2"; }

case ${1:-} in
  kill-replica | start-replica | rolling-restart | restart-redis | restart-mariadb | failover-redis | kill-redis-master | kill-etcd-leader | kill-zk-leader | shop | \
    db-writer | kill-db-writer | stop-db-node | start-db-node | partition-db-writer | heal-db-partition) need_stack ;;
esac
case ${1:-} in
  up) repick=1; up ;;
  down) down ;;
  status) status ;;
  replicas)
    [ $# -ge 2 ] && [ "$2" -ge 1 ] && [ "$2" -le $max_replicas ] || die "usage: $0 replicas 1..$max_replicas [VAR=VALUE...]"
    set_topology
    set_db_topology
    load_ports
    stop_replicas
    start_db
    start_masters
    start_topology
    prepare_db
    start_replicas "${@:2}"
    nginx_up "$2"
    ;;
  kill-replica)
    [ $# -eq 2 ] && [ "$2" -ge 1 ] && [ "$2" -le $max_replicas ] || die "usage: $0 kill-replica 1..$max_replicas"
    load_ports
    kill_replica "$2"
    ;;
  start-replica)
    [ $# -eq 2 ] && [ "$2" -ge 1 ] && [ "$2" -le $max_replicas ] || die "usage: $0 start-replica 1..$max_replicas"
    load_ports
    start_one_replica "$2"
    ;;
  rolling-restart) load_ports; rolling_restart ;;
  restart-redis) load_ports; restart_redis ;;
  restart-mariadb) load_ports; restart_mariadb ;;
  failover-redis) load_ports; failover_redis ;;
  kill-redis-master) load_ports; kill_redis_master ;;
  kill-etcd-leader) load_ports; kill_etcd_leader ;;
  kill-zk-leader) load_ports; kill_zk_leader ;;
  redis-up) repick=1; set_topology; load_ports; start_masters; start_topology; redis_env ;;
  db-up)
    # The Galera nodes' agents are bin/shop's db-agent.
    go build -o bin/shop ./cmd/shop
    repick=1; set_db_topology; load_ports; start_db; start_masters; start_topology; prepare_db
    shop_env | grep '^SHOP_MYSQL_DSN='
    ;;
  shop) load_ports; run_shop "${@:2}" ;;
  db-writer) load_ports; db_writer ;;
  kill-db-writer) load_ports; kill_db_writer ;;
  stop-db-node) db_node_arg "${2:-}" stop-db-node; load_ports; stop_db_node "$2" ;;
  start-db-node) db_node_arg "${2:-}" start-db-node; load_ports; start_db_node "$2" ;;
  partition-db-writer) load_ports; partition_db_writer ;;
  heal-db-partition) load_ports; heal_db_partition ;;
  *) die "usage: $0 up|down|status|replicas N [VAR=VALUE...]|redis-up|db-up|kill-replica I|start-replica I|rolling-restart|restart-redis|restart-mariadb|failover-redis|kill-redis-master|kill-etcd-leader|kill-zk-leader|db-writer|kill-db-writer|stop-db-node I|start-db-node I|partition-db-writer|heal-db-partition|shop ARGS..." ;;
esac
