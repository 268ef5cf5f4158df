# shellcheck shell=bash
# Helpers to run a private ZooKeeper ensemble on loopback, for the lock's
# zookeeper mode (SHOP_LOCK_MODE=zookeeper, SHOP_ZK_SERVERS). Sourced by
# scripts/lib.sh, whose log, die, find_bin, free_port, need_free_port,
# wait_port, stop_pidfile and pid_alive they use.
#
# An ensemble lives in one directory, a server per client port in
# DIR/PORT: its zoo.cfg, data (with myid), zookeeper.log and pid. Everything
# a server needs to start again is in its directory, so a script restarts
# one (a failover drill) with kill_pidfile or zk_stop_server and then
# zk_start_server, then zk_wait_serving.
#
#   start_zk_ensemble DIR PORT...   start one server per client port, wait for a leader
#   stop_zk_ensemble DIR            stop every server of DIR
#   zk_leader_dir DIR               print the directory of the leader's server
#   zk_start_server SERVER_DIR      start (again) the server of that directory
#   zk_stop_server SERVER_DIR       stop it (SIGTERM, then SIGKILL)
#   kill_pidfile SERVER_DIR/pid     (lib.sh) kill it at once (SIGKILL), as a crash does;
#                                   its data stay: ZooKeeper logs a transaction before it
#                                   acknowledges it
#   zk_wait_serving SERVER_DIR [SECONDS]
#                                   wait until it serves (leader or follower)
#   zk_servers DIR                  print SHOP_ZK_SERVERS's value for DIR
#
# ZK_HOME (default /usr/share/zookeeper) is where ZooKeeper is installed;
# Debian's package keeps its jars in /usr/share/java. Sessions and elections
# are fast on loopback: tickTime is 200ms (a silent leader is given up
# within a second) and sessions may last from 400ms to 30s.

# zk_classpath prints the class path of a ZooKeeper server: an Apache
# release's lib directory, or Debian's jar (whose manifest names the jars it
# needs) with a logging binding.
zk_classpath() {
  local home=${ZK_HOME:-/usr/share/zookeeper} jar
  for jar in "$home"/lib/zookeeper-3*.jar; do
    [ -f "$jar" ] && { echo "$home/lib/*"; return 0; }
  done
  if [ -f /usr/share/java/zookeeper.jar ] && [ -f /usr/share/java/slf4j-simple.jar ]; then
    echo /usr/share/java/zookeeper.jar:/usr/share/java/slf4j-simple.jar
    return 0
  fi
  return 1
}

# zk_port SERVER_DIR prints the client port of the server in SERVER_DIR.
zk_port() { sed -n 's/^clientPort=//p' "$1/zoo.cfg"; }

# zk_mode PORT prints the mode the server on 127.0.0.1:PORT reports (srvr):
# leader, follower or standalone; nothing while it does not serve.
zk_mode() {
  # shellcheck disable=SC2016 # expanded by the inner shell
  timeout 3 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1" && printf srvr >&3 && cat <&3' _ "$1" 2>/dev/null |
    sed -n 's/^Mode: //p' || true
}

# zk_start_server SERVER_DIR starts the server whose zoo.cfg is in
# SERVER_DIR, with its pid in SERVER_DIR/pid, and waits until it listens
# (not until it serves: a server waits for a quorum; see zk_wait_serving).
zk_start_server() {
  local dir=$1 java cp port
  java=$(find_bin java) || die "java not found: ZooKeeper needs a JRE"
  cp=$(zk_classpath) || die "ZooKeeper not found (ZK_HOME=${ZK_HOME:-/usr/share/zookeeper}, /usr/share/java)"
  port=$(zk_port "$dir")
  [ -n "$port" ] || die "no clientPort in $dir/zoo.cfg"
  if [ -f "$dir/pid" ] && pid_alive "$(cat "$dir/pid")"; then
    log "ZooKeeper in $dir runs already (pid $(cat "$dir/pid"))"
    return 0
  fi
  need_free_port "$port" "ZooKeeper in $dir"
  # A small heap, the serial collector and the client compiler: three
  # servers on a small machine start in a few seconds.
  "$java" -Xmx128m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 \
    -Dorg.slf4j.simpleLogger.logFile="$dir/zookeeper.log" -Dzookeeper.log.dir="$dir" \
    -cp "$cp" org.apache.zookeeper.server.quorum.QuorumPeerMain "$dir/zoo.cfg" \
    </dev/null >>"$dir/zookeeper.out" 2>&1 &
  echo $! >"$dir/pid"
  wait_port "$port" 60 $! || { tail -20 "$dir/zookeeper.log" >&2; die "ZooKeeper did not start on port $port"; }
}

# zk_wait_serving SERVER_DIR [SECONDS] waits (default 60s) until the server
# in SERVER_DIR serves: it leads or follows a quorum.
zk_wait_serving() {
  local dir=$1 deadline=$(( SECONDS + ${2:-60} )) port mode
  port=$(zk_port "$dir")
  while :; do
    mode=$(zk_mode "$port")
    [ "$mode" = leader ] || [ "$mode" = follower ] && return 0
    [ $SECONDS -lt $deadline ] || return 1
    sleep 0.2
  done
}

# zk_stop_server SERVER_DIR stops the server in SERVER_DIR; its data stays.
zk_stop_server() { stop_pidfile "$1/pid" 10; }

# start_zk_ensemble DIR PORT... starts one ZooKeeper server per client
# PORT, each in DIR/PORT, with quorum and election ports picked with
# free_port, all at once (a JVM takes seconds to start), and waits until
# one leads and every other follows. A server that has a directory already
# starts on its data and configuration.
start_zk_ensemble() {
  local dir=$1 port i=0 taken servers=() quorum ep
  shift
  [ $# -ge 1 ] || die "start_zk_ensemble: no client ports"
  taken=" $* "
  for port in "$@"; do
    i=$((i + 1))
    if [ -f "$dir/$port/zoo.cfg" ]; then
      servers+=("$(grep "^server\.$i=" "$dir/$port/zoo.cfg")")
    else
      quorum=$(free_port_except "$taken")
      taken+="$quorum "
      ep=$(free_port_except "$taken")
      taken+="$ep "
      servers+=("server.$i=127.0.0.1:$quorum:$ep")
    fi
  done
  i=0
  for port in "$@"; do
    i=$((i + 1))
    mkdir -p "$dir/$port/data"
    [ -f "$dir/$port/data/myid" ] || echo "$i" >"$dir/$port/data/myid"
    if [ ! -f "$dir/$port/zoo.cfg" ]; then
      printf '%s\n' "tickTime=200" "initLimit=10" "syncLimit=5" "dataDir=$dir/$port/data" \
        "clientPort=$port" "clientPortAddress=127.0.0.1" "maxSessionTimeout=30000" \
        "4lw.commands.whitelist=srvr,mntr,ruok" "admin.enableServer=false" "preAllocSize=1024" \
        "${servers[@]}" >"$dir/$port/zoo.cfg"
    fi
    zk_start_server "$dir/$port"
  done
  for port in "$@"; do
    zk_wait_serving "$dir/$port" 60 || { tail -20 "$dir/$port/zookeeper.log" >&2; die "ZooKeeper on $port does not serve"; }
  done
  zk_leader_dir "$dir" >/dev/null || die "the ZooKeeper ensemble in $dir has no leader"
  log "ZooKeeper ensemble on $(zk_servers "$dir") (leader in $(zk_leader_dir "$dir"))"
}

# stop_zk_ensemble DIR stops every server of the ensemble in DIR; the
# data stays, for start_zk_ensemble to start it again.
stop_zk_ensemble() {
  local cfg
  for cfg in "$1"/*/zoo.cfg; do
    [ -f "$cfg" ] && zk_stop_server "$(dirname "$cfg")"
  done
  return 0
}

# zk_leader_dir DIR prints the directory of the server of DIR's ensemble
# that leads now; it fails when none does.
zk_leader_dir() {
  local cfg
  for cfg in "$1"/*/zoo.cfg; do
    [ -f "$cfg" ] || continue
    if [ "$(zk_mode "$(zk_port "$(dirname "$cfg")")")" = leader ]; then
      dirname "$cfg"
      return 0
    fi
  done
  return 1
}

# zk_servers DIR prints the client addresses of DIR's ensemble, comma
# separated: SHOP_ZK_SERVERS.
zk_servers() {
  local cfg out=()
  for cfg in "$1"/*/zoo.cfg; do
    [ -f "$cfg" ] && out+=("127.0.0.1:$(zk_port "$(dirname "$cfg")")")
  done
  (IFS=,; echo "${out[*]}")
}
