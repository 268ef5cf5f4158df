# shellcheck shell=bash
# Helpers to run a private Galera cluster of three MariaDB nodes on loopback,
# HAProxy in front of it and one agent per node answering HAProxy's
# agent-check (DB_TOPOLOGY=galera in scripts/stack.sh). Sourced by
# scripts/lib.sh, whose log, die, find_bin, need_free_port, wait_port,
# stop_pidfile, kill_pidfile, pid_alive and mariadb_flags they use.
#
# The cluster lives in DIR: node I in DIR/nodes/nI (its data in data/, its
# log in mysqld.log, its pid in pid, its mysql port in port and its command
# line in args, so that it can be killed and started again on its data with
# the same flags), HAProxy in DIR/haproxy and the agents in DIR/agentI.
# Each node has four loopback ports: mysql, gcomm (the group's traffic),
# IST (incremental state transfer) and SST (rsync's full state transfer).
#
# Run as root, the nodes run as the mysql user, as Debian runs them: rsync's
# state transfer fails as root (the joiner's rsync daemon drops to nobody,
# who cannot write a root-owned data directory). Their directories are then
# owned by mysql, under a directory mysql can traverse: DIR itself when it
# can, else a directory of their own in TMPDIR (DIR/nodes links to it). Run
# as another user, the nodes run as that user.

# galera_provider prints the path of Galera 4's library (Debian's galera-4;
# SHOP_GALERA_PROVIDER names another).
galera_provider() {
  local f
  for f in ${SHOP_GALERA_PROVIDER:-} /usr/lib/galera/libgalera_smm.so /usr/lib64/galera-4/libgalera_smm.so; do
    if [ -f "$f" ]; then echo "$f"; return 0; fi
  done
  return 1
}

# galera_user prints the user the nodes run as: mysql when root, else
# nothing (the current user).
galera_user() {
  [ "$(id -u)" -eq 0 ] || return 0
  id mysql >/dev/null 2>&1 || die "no mysql user: Galera's nodes cannot run as root (rsync's state transfer fails); Debian's mariadb-server makes one"
  echo mysql
}

# as_galera_user COMMAND... runs COMMAND as the user the nodes run as.
as_galera_user() {
  local user
  user=$(galera_user)
  if [ -z "$user" ]; then "$@"
  elif command -v runuser >/dev/null 2>&1; then runuser -u "$user" -- "$@"
  else su -s /bin/sh "$user" -c '"$0" "$@"' "$@"; fi
}

# galera_nodes_dir DIR prints where the nodes' directories are (DIR/nodes,
# or the directory it links to), making it on first use: a directory the
# nodes' user can traverse to and write.
galera_nodes_dir() {
  local dir=$1 user nodes
  if [ ! -e "$dir/nodes" ]; then
    mkdir -p "$dir"
    user=$(galera_user)
    if [ -z "$user" ] || as_galera_user test -x "$dir"; then
      mkdir "$dir/nodes"
    else
      nodes=$(mktemp -d "${TMPDIR:-/tmp}/shop-galera.XXXXXX")
      # mktemp's 0700 keeps mysql out.
      chmod 711 "$nodes"
      ln -s "$nodes" "$dir/nodes"
    fi
    [ -z "$user" ] || chown "$user:" "$(readlink -f "$dir/nodes")"
  fi
  readlink -f "$dir/nodes"
}

# remove_galera DIR removes the nodes' directory that DIR/nodes links to,
# outside DIR (rm -rf DIR leaves it); the nodes must be stopped.
remove_galera() {
  [ -L "$1/nodes" ] || return 0
  rm -rf "$(readlink -f "$1/nodes")"
  rm -f "$1/nodes"
}

# galera_sql PORT SQL runs SQL as root on the node (or HAProxy) on
# 127.0.0.1:PORT and prints the rows, tab-separated, without column names.
galera_sql() {
  local client
  client=$(find_bin mariadb mysql) || die "the mariadb client not found"
  "$client" --no-defaults -uroot -h127.0.0.1 -P"$1" --connect-timeout=2 -N -B -e "$2"
}

# galera_state PORT prints the node's wsrep_local_state,
# wsrep_cluster_status and wsrep_ready, as "4 Primary ON" for a Synced node
# of the Primary component that takes writes; it fails when the node does
# not answer.
galera_state() {
  galera_sql "$1" "SHOW GLOBAL STATUS WHERE Variable_name IN ('wsrep_local_state', 'wsrep_cluster_status', 'wsrep_ready')" 2>/dev/null |
    awk '{ v[$1] = $2 } END { if (!("wsrep_local_state" in v)) exit 1; print v["wsrep_local_state"], v["wsrep_cluster_status"], v["wsrep_ready"] }'
}

# galera_node_port DIR I prints node I's mysql port.
galera_node_port() { cat "$(galera_nodes_dir "$1")/n$2/port"; }

# galera_node_running DIR I tells whether node I's process runs.
galera_node_running() { alive "$(galera_nodes_dir "$1")/n$2"; }

# write_galera_node DIR I GCOMM MYSQL,GCOMM,IST,SST writes node I's command
# line (args) and port, and installs its system tables, unless done
# before; GCOMM is the cluster's address (gcomm://...).
write_galera_node() {
  local nodes dir install user provider p=()
  nodes=$(galera_nodes_dir "$1")
  dir=$nodes/n$2
  IFS=, read -r -a p <<<"$4"
  [ -f "$dir/args" ] && return 0
  provider=$(galera_provider) || die "Galera's library not found (Debian: apt-get install galera-4)"
  install=$(find_bin mariadb-install-db mysql_install_db) || die "mariadb-install-db not found"
  user=$(galera_user)
  mkdir -p "$dir"
  [ -z "$user" ] || chown "$user:" "$dir"
  # Only the node that bootstraps the cluster needs system tables: a
  # joiner's data directory is replaced by its first state transfer, which
  # rsync makes before InnoDB starts.
  if [ "$2" = 0 ]; then
    as_galera_user "$install" --no-defaults --datadir="$dir/data" --auth-root-authentication-method=normal \
      --skip-test-db >"$dir/install.log" 2>&1 || { cat "$dir/install.log" >&2; die "mariadb-install-db failed in $dir"; }
  else
    as_galera_user mkdir "$dir/data"
  fi
  {
    printf '%s\n' --no-defaults --datadir="$dir/data"
    [ -z "$user" ] || echo "--user=$user"
    printf '%s\n' --bind-address=127.0.0.1 --port="${p[0]}" --socket="$dir/mysqld.sock" \
      --pid-file="$dir/mysqld.pid" --log-error="$dir/mysqld.log"
    mariadb_flags
    # Galera replicates rows, and needs interleaved auto-increment locks.
    printf '%s\n' --binlog-format=ROW --innodb-autoinc-lock-mode=2 \
      --wsrep-on=ON --wsrep-provider="$provider" --wsrep-cluster-name=shop \
      --wsrep-cluster-address="$3" --wsrep-node-address=127.0.0.1 --wsrep-node-name="n$2" \
      --wsrep-provider-options="gmcast.listen_addr=tcp://127.0.0.1:${p[1]};ist.recv_addr=127.0.0.1:${p[2]};gcache.size=64M" \
      --wsrep-sst-method=rsync --wsrep-sst-receive-address="127.0.0.1:${p[3]}"
  } >"$dir/args"
  echo "${p[0]}" >"$dir/port"
}

# launch_galera_node DIR I [OPTION...] starts node I with the command line
# in its args file, on its data, plus the options, without waiting.
launch_galera_node() {
  local dir mysqld args=()
  dir=$(galera_nodes_dir "$1")/n$2
  shift 2
  mysqld=$(find_bin mariadbd mysqld) || die "MariaDB server not found"
  [ -f "$dir/args" ] || die "$dir is not a node of start_galera"
  need_free_port "$(cat "$dir/port")" "Galera node in $dir"
  mapfile -t args <"$dir/args"
  if grep -qx 'seqno: *-1' "$dir/data/grastate.dat" 2>/dev/null && [ -f "$dir/data/ibdata1" ]; then
    # A node that did not stop cleanly (killed) left no position in
    # grastate.dat: started so, it would ask for a full state transfer
    # (SST). Its position is in InnoDB; --wsrep-recover reads it, as
    # mysqld_safe and systemd's galera_recovery do, and the node starts
    # from there, fed the rest by IST from a donor's gcache.
    local pos
    "$mysqld" "${args[@]}" --wsrep-recover --log-error="$dir/recover.log" </dev/null >/dev/null 2>&1 || true
    pos=$(sed -n 's/.*WSREP: Recovered position: *\([0-9a-f-]*:-\{0,1\}[0-9]*\).*/\1/p' "$dir/recover.log" | tail -1)
    [ -z "$pos" ] || set -- "$@" --wsrep-start-position="$pos"
  fi
  "$mysqld" "${args[@]}" "$@" </dev/null >>"$dir/stdout.log" 2>&1 &
  echo $! >"$dir/pid"
}

# wait_galera_synced DIR I SECONDS waits until node I is Synced, in the
# Primary component and ready; it gives up early if the node's process
# has died.
wait_galera_synced() {
  local dir port deadline=$((SECONDS + $3))
  dir=$(galera_nodes_dir "$1")/n$2
  port=$(cat "$dir/port")
  until [ "$(galera_state "$port")" = "4 Primary ON" ]; do
    if [ $SECONDS -ge $deadline ] || ! alive "$dir"; then
      tail -20 "$dir/mysqld.log" >&2
      return 1
    fi
    sleep 0.2
  done
}

# galera_bootstrap_node DIR prints the node a cluster that has stopped
# whole must start from: the one Galera marked safe to bootstrap (the last
# to leave, whose data has every transaction), else node 0, then marked so.
galera_bootstrap_node() {
  local nodes i
  nodes=$(galera_nodes_dir "$1")
  for i in 0 1 2; do
    if grep -qx 'safe_to_bootstrap: 1' "$nodes/n$i/data/grastate.dat" 2>/dev/null; then echo "$i"; return 0; fi
  done
  [ ! -f "$nodes/n0/data/grastate.dat" ] || sed -i 's/^safe_to_bootstrap: 0$/safe_to_bootstrap: 1/' "$nodes/n0/data/grastate.dat"
  echo 0
}

# start_galera DIR MYSQL,GCOMM,IST,SST... starts the nodes of the cluster in
# DIR that are not running, one per port set, named n0, n1, ..., and waits
# until every node is Synced. When none runs, the first (or the one
# galera_bootstrap_node names, on existing data) bootstraps a new primary
# component; the others join it, all at once.
start_galera() {
  local dir=$1 gcomm= set p=() i boot= start=$SECONDS
  shift
  for set in "$@"; do
    IFS=, read -r -a p <<<"$set"
    gcomm+="${gcomm:+,}127.0.0.1:${p[1]}"
  done
  i=0
  for set in "$@"; do
    write_galera_node "$dir" "$i" "gcomm://$gcomm" "$set"
    i=$((i + 1))
  done
  for i in $(seq 0 $(($# - 1))); do
    galera_node_running "$dir" "$i" && boot=running
  done
  if [ -z "$boot" ]; then
    boot=$(galera_bootstrap_node "$dir")
    launch_galera_node "$dir" "$boot" --wsrep-new-cluster
    wait_galera_synced "$dir" "$boot" 60 || die "Galera node n$boot did not bootstrap the cluster"
    log "Galera node n$boot bootstrapped the cluster in $((SECONDS - start))s"
  fi
  for i in $(seq 0 $(($# - 1))); do
    galera_node_running "$dir" "$i" || launch_galera_node "$dir" "$i"
  done
  for i in $(seq 0 $(($# - 1))); do
    wait_galera_synced "$dir" "$i" 120 || die "Galera node n$i is not Synced"
  done
  log "Galera cluster of $# nodes Synced in $((SECONDS - start))s (mysql on $(for set in "$@"; do printf '%s ' "${set%%,*}"; done | xargs), data in $(galera_nodes_dir "$dir"))"
}

# stop_galera DIR stops every node of the cluster in DIR (SIGTERM, waits),
# node 0 last, so that it is the one marked safe to bootstrap from.
stop_galera() {
  local nodes i
  [ -e "$1/nodes" ] || return 0
  nodes=$(galera_nodes_dir "$1")
  for i in 2 1 0; do
    stop_pidfile "$nodes/n$i/pid" 60 # InnoDB writes its buffers out
  done
}

# write_haproxy_cfg FILE PORT STATS_PORT NODE_PORT:AGENT_PORT... writes the
# configuration of HAProxy in front of the nodes: one listener on PORT
# sending every connection to one writer, the first node, with the others
# as backups in their order (HAProxy uses the first backup up); a node is
# up while it accepts TCP connections and its agent answers up (Synced, in
# the Primary component, ready: shop db-agent), checked every 500 ms, two
# failures to go down and two successes to come back. A node marked down
# has its connections cut (shutdown-sessions), so that none waits on a
# frozen or isolated node; a node marked up again cuts the backups'
# connections (shutdown-backup-sessions), so that the pools never write
# through two nodes at once. HAProxy's stats, as CSV at /;csv, on
# STATS_PORT.
#
# The client and server timeouts are longer than an hour, the longest a
# pooled connection of shop lives (its pools drop idle connections after a
# minute, the MySQL lock's keeps them idle up to its hour's lifetime):
# HAProxy closes no connection a pool still holds, and a dead node's are cut
# by the checks, not by a timeout.
write_haproxy_cfg() {
  local file=$1 port=$2 stats=$3 i=0 node backup=
  shift 3
  {
    printf '%s\n' global '  maxconn 4000' defaults '  mode tcp' '  timeout connect 2s' '  timeout client 65m' \
      '  timeout server 65m' '  timeout check 2s' 'listen mysql' "  bind 127.0.0.1:$port" \
      '  default-server check inter 500ms fall 2 rise 2 agent-check agent-inter 500ms on-marked-down shutdown-sessions on-marked-up shutdown-backup-sessions'
    for node in "$@"; do
      echo "  server n$i 127.0.0.1:${node%%:*} agent-port ${node#*:}$backup"
      backup=" backup" i=$((i + 1))
    done
    printf '%s\n' 'listen stats' "  bind 127.0.0.1:$stats" '  mode http' '  stats enable' '  stats uri /'
  } >"$file"
}

# start_haproxy DIR PORT STATS_PORT NODE_PORT:AGENT_PORT... writes HAProxy's
# configuration into DIR/haproxy.cfg (write_haproxy_cfg), checks it and
# starts HAProxy in the foreground, in the background, its pid in DIR/pid.
start_haproxy() {
  local dir=$1 port=$2 stats=$3 bin
  shift
  bin=$(find_bin haproxy) || die "haproxy not found (Debian: apt-get install haproxy)"
  mkdir -p "$dir"
  write_haproxy_cfg "$dir/haproxy.cfg" "$@"
  "$bin" -c -q -f "$dir/haproxy.cfg" || die "haproxy rejected $dir/haproxy.cfg"
  need_free_port "$port" "HAProxy in $dir"
  need_free_port "$stats" "HAProxy's stats in $dir"
  "$bin" -db -f "$dir/haproxy.cfg" </dev/null >>"$dir/haproxy.log" 2>&1 &
  echo $! >"$dir/pid"
  wait_port "$port" 10 $! || { tail -5 "$dir/haproxy.log" >&2; die "HAProxy did not start on port $port"; }
  log "HAProxy on 127.0.0.1:$port in front of the Galera nodes, stats on http://127.0.0.1:$stats/"
}

# start_db_agent DIR PORT NODE_PORT SHOP starts `SHOP db-agent` (bin/shop)
# on 127.0.0.1:PORT for the node on NODE_PORT, its pid in DIR/pid.
start_db_agent() {
  local dir=$1 port=$2
  need_free_port "$port" "the db-agent in $dir"
  mkdir -p "$dir"
  "$4" db-agent -listen "127.0.0.1:$port" -dsn "root@tcp(127.0.0.1:$3)/" </dev/null >>"$dir/agent.log" 2>&1 &
  echo $! >"$dir/pid"
  wait_port "$port" 10 $! || { tail -5 "$dir/agent.log" >&2; die "db-agent did not start on port $port"; }
}

# haproxy_servers STATS_PORT prints each Galera node's state as HAProxy
# sees it, "n0 UP", one a line (its stats' CSV).
haproxy_servers() {
  local fd line
  { exec {fd}<>"/dev/tcp/127.0.0.1/$1"; } 2>/dev/null || return 1
  printf 'GET /;csv HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&"$fd"
  while IFS= read -r -t 2 line <&"$fd"; do
    line=${line%$'\r'}
    case $line in mysql,n[0-9]*) awk -F, '{ print $2, $18 }' <<<"$line" ;; esac
  done
  exec {fd}>&-
}

# galera_writer PORT prints the index of the node that a new connection
# through HAProxy on PORT reaches (its wsrep_node_name, nI).
galera_writer() {
  local name
  name=$(galera_sql "$1" "SELECT @@wsrep_node_name" 2>/dev/null) || return 1
  [[ $name == n[0-9]* ]] || return 1
  echo "${name#n}"
}
