# shellcheck shell=bash
# Helpers to install and run private MariaDB, Redis and nginx instances on
# loopback. Sourced by the other scripts; every server they start lives in a
# directory of its own and listens only on 127.0.0.1.

log() { printf '==> %s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# go_version_key VERSION prints a number that orders Go versions as Go
# does: 1.26 < 1.26rc1 < 1.26.0 < 1.26.8 < 1.27 (a go line's bare version
# is the language, before its first release candidate).
go_version_key() {
  local major minor rest p=0
  [[ ${1#go} =~ ^([0-9]+)\.([0-9]+)(.*)$ ]] || return 1
  major=${BASH_REMATCH[1]} minor=${BASH_REMATCH[2]} rest=${BASH_REMATCH[3]}
  if [[ $rest =~ ^\.([0-9]+) ]]; then p=$((100 + 10#${BASH_REMATCH[1]}))
  elif [[ $rest =~ ^(beta|rc)[0-9] ]]; then p=1; fi
  echo $(((10#$major * 1000 + 10#$minor) * 1000 + p))
}

# ensure_go fails, before anything is installed or built, unless the go on
# PATH (or $GO) is at least the version go.mod's go line names. GOTOOLCHAIN
# defaults to local, so that no go command downloads another toolchain
# unasked; a GOTOOLCHAIN the caller set is left as it is.
ensure_go() {
  local want found=none key
  want=$(sed -n 's/^go \([0-9][^ ]*\)$/\1/p' go.mod | head -1)
  [ -n "$want" ] || die "go.mod names no go version"
  export GOTOOLCHAIN=${GOTOOLCHAIN:-local}
  if command -v "${GO:-go}" >/dev/null 2>&1; then
    found=$("${GO:-go}" version 2>/dev/null | awk '{ print ($3 == "devel" ? $4 : $3) }')
  fi
  key=$(go_version_key "$found") && [ "$key" -ge "$(go_version_key "$want")" ] ||
    die "shop needs Go >= $want (go.mod), found ${found:-an unknown version}; install a newer Go from https://go.dev/dl"
}

# as_root COMMAND... runs COMMAND as root: as it is when the scripts run as
# root, else through sudo (which resets the environment: pass variables as
# `env NAME=VALUE COMMAND`).
as_root() {
  if [ "$(id -u)" -eq 0 ]; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo "$@"
  else
    die "$* needs root: run as root, or install sudo"
  fi
}

# find_bin NAME... prints the path of the first NAME found on PATH or in the
# sbin directories, which are not on every user's PATH.
find_bin() {
  local name dir
  for name in "$@"; do
    if command -v "$name" >/dev/null 2>&1; then command -v "$name"; return 0; fi
    for dir in /usr/sbin /usr/local/sbin /sbin /opt/homebrew/bin /opt/homebrew/sbin; do
      if [ -x "$dir/$name" ]; then echo "$dir/$name"; return 0; fi
    done
  done
  return 1
}

# ensure_deps [race] installs MariaDB, Redis (server and redis-cli), nginx,
# etcd and ZooKeeper (the other lock families' servers), Galera and HAProxy
# when they are missing;
# with "race", also a C compiler and the C library's headers when the one
# `go test -race` would use (go env CC) cannot build a program: the race
# detector needs cgo, and a bare Debian has neither gcc nor libc6-dev.
ensure_deps() {
  local apt=() brew=()
  remove_stale_policy
  find_bin mariadbd mysqld >/dev/null || { apt+=(mariadb-server); brew+=(mariadb); }
  # redis-cli (Debian's redis-tools) builds the test Cluster and asks the Sentinels.
  { find_bin redis-server && find_bin redis-cli; } >/dev/null || { apt+=(redis-server redis-tools); brew+=(redis); }
  find_bin nginx >/dev/null || { apt+=(nginx); brew+=(nginx); }
  find_bin etcd >/dev/null || { apt+=(etcd-server); brew+=(etcd); }
  { zk_classpath && find_bin java; } >/dev/null || { apt+=(zookeeper); brew+=(zookeeper); }
  # The Galera cluster behind HAProxy (DB_TOPOLOGY=galera, and the one the
  # tests start): Galera's library, HAProxy, and what MariaDB's rsync state
  # transfer (wsrep_sst_rsync) runs: rsync, ps, and ss or lsof to find its
  # rsync daemon's port. Debian's mariadb-server depends on all of them but
  # HAProxy; a MariaDB from elsewhere may not have brought them.
  galera_provider >/dev/null || apt+=(galera-4)
  find_bin haproxy >/dev/null || { apt+=(haproxy); brew+=(haproxy); }
  find_bin rsync >/dev/null || apt+=(rsync)
  find_bin ps >/dev/null || apt+=(procps)
  find_bin ss lsof >/dev/null || apt+=(iproute2)
  if [ "${1:-}" = race ] && ! cc_works; then apt+=(gcc libc6-dev); fi
  [ ${#apt[@]} -eq 0 ] && return 0
  log "installing ${apt[*]}"
  if command -v apt-get >/dev/null 2>&1; then
    apt_install "${apt[@]}"
  elif command -v brew >/dev/null 2>&1; then
    [ ${#brew[@]} -eq 0 ] || brew install "${brew[@]}"
  else
    die "please install ${apt[*]} (MariaDB or MySQL server, Redis, nginx, etcd, ZooKeeper, Galera, HAProxy, rsync, a C compiler): no apt-get or brew here"
  fi
  if [ "${1:-}" = race ] && ! cc_works; then
    die "no working C compiler ($(go_cc)), which go test -race needs: install one (Xcode's command line tools on macOS)"
  fi
}

# go_cc prints the C compiler cgo uses: $CC, or go's default.
go_cc() { go env CC 2>/dev/null || echo "${CC:-gcc}"; }

# cc_works tells whether go_cc compiles and links a C program that includes
# the C library's headers, as runtime/cgo does.
cc_works() {
  local cc out
  cc=$(go_cc)
  command -v "${cc%% *}" >/dev/null 2>&1 || return 1
  out=$(mktemp "${TMPDIR:-/tmp}/shop-cc.XXXXXX")
  # shellcheck disable=SC2086 # CC may carry flags, as cgo allows
  printf '#include <stdlib.h>\n#include <pthread.h>\nint main(void) { return 0; }\n' |
    $cc -x c -o "$out" - -lpthread >/dev/null 2>&1
  local ok=$?
  rm -f "$out"
  return $ok
}

# The system services that the Debian packages of the servers start and
# enable on install, with the port each listens on by default: NAME:PORT.
# SHOP_SERVICES replaces the list (the tests of these scripts use it).
#
# Debian's haproxy starts with a configuration that listens on no port: it
# is told running by systemd alone (port 0 never answers).
system_services() { echo "${SHOP_SERVICES-mariadb:3306 redis-server:6379 nginx:80 etcd:2379 zookeeper:2181 haproxy:0}"; }

# init_system prints systemd when systemd runs this machine, else sysv (SysV
# init, or a container without an init). SHOP_INIT_SYSTEM sets it (the
# tests of these scripts play both, with fakes of the commands).
init_system() {
  if [ -n "${SHOP_INIT_SYSTEM:-}" ]; then echo "$SHOP_INIT_SYSTEM"
  elif [ -d /run/systemd/system ]; then echo systemd
  else echo sysv; fi
}

# The policy-rc.d that apt_install puts in place carries this line, with the
# pid of the shell that removes it again: "(pid N)".
policy_marker='# shop scripts/lib.sh: no service starts while apt-get installs the servers'

policy_file() { echo "${SHOP_POLICY_RC_D:-/usr/sbin/policy-rc.d}"; }

# remove_stale_policy removes the policy-rc.d of an install of these scripts
# that was killed before its trap could remove it (SIGKILL): left in place,
# it forbids every service start on the machine. Only one with our marker
# whose shell is gone; another's, or that of an install still running, is
# left as it is.
remove_stale_policy() {
  local policy pid
  policy=$(policy_file)
  [ -f "$policy" ] && grep -qF "$policy_marker (pid " "$policy" 2>/dev/null || return 0
  pid=$(sed -n 's/.*(pid \([0-9]*\)).*/\1/p' "$policy")
  if kill -0 "$pid" 2>/dev/null || [ -d "/proc/$pid" ]; then return 0; fi
  log "removing $policy, left behind by an install of these scripts that was killed (pid $pid)"
  as_root rm -f "$policy"
}

# apt_install PACKAGE... installs Debian packages with apt-get (as root, or
# with sudo) without leaving their services running or enabled. Debian's
# maintainer scripts start a package's service through invoke-rc.d or
# deb-systemd-invoke, and both ask /usr/sbin/policy-rc.d first: while apt
# runs, one that exits 101 ("action forbidden") is in place, unless the
# machine already has one, which is then left as it is. It is removed
# afterwards however apt ends (and by the next run if apt was killed). A
# service that runs after the install and did not run before it is
# stopped, and one that starts at boot after it and did not before is
# disabled; the others are left alone.
apt_install() {
  local before enabled rc=0
  [ "$(id -u)" -eq 0 ] || command -v sudo >/dev/null 2>&1 ||
    die "installing $* needs root: run as root, or install sudo, or install $* yourself"
  remove_stale_policy
  before=$(running_services)
  enabled=$(enabled_services)
  (
    policy=$(policy_file)
    if [ ! -e "$policy" ] && [ ! -L "$policy" ]; then
      trap 'as_root rm -f "$policy"' EXIT
      trap 'exit 130' INT TERM HUP
      # Each step checked: errexit does not hold inside a subshell that
      # is the left side of ||.
      printf '#!/bin/sh\n%s (pid %s)\nexit 101\n' "$policy_marker" "$BASHPID" |
        as_root tee "$policy" >/dev/null || exit $?
      as_root chmod 755 "$policy" || exit $?
    fi
    as_root apt-get update -qq || exit $?
    # sudo passes no environment: env sets it for apt-get.
    as_root env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "$@" >/dev/null
  ) || rc=$?
  stop_new_services "$before"
  disable_new_services "$enabled"
  return $rc
}

# running_services prints the names of system_services that run now: by
# systemd when it is the init system, else by their port answering.
running_services() {
  local svc
  for svc in $(system_services); do
    if service_running "${svc%%:*}" "${svc#*:}"; then echo "${svc%%:*}"; fi
  done
}

service_running() {
  if [ "$(init_system)" = systemd ]; then
    systemctl is-active --quiet "$1"
  else
    port_open "$2"
  fi
}

# enabled_services prints the names of system_services that start at boot:
# enabled in systemd (systemctl answers that without systemd running too)
# or by a SysV start link (under SHOP_ETC, default /etc). Debian's packages
# make both.
enabled_services() {
  local svc
  for svc in $(system_services); do
    if systemd_enabled "${svc%%:*}" || sysv_enabled "${svc%%:*}"; then echo "${svc%%:*}"; fi
  done
}

systemd_enabled() { command -v systemctl >/dev/null 2>&1 && systemctl is-enabled --quiet "$1" 2>/dev/null; }
sysv_enabled() { compgen -G "${SHOP_ETC:-/etc}/rc[2345].d/S[0-9][0-9]$1" >/dev/null; }

# new_services BEFORE prints the NAME:PORT of each of system_services not
# named in BEFORE (a list of names).
new_services() {
  local before=" $(echo $1) " svc
  for svc in $(system_services); do
    case $before in *" ${svc%%:*} "*) ;; *) echo "$svc" ;; esac
  done
}

# stop_new_services BEFORE stops each of system_services that runs now and
# is not named in BEFORE (running_services' output from before an install).
stop_new_services() {
  local svc name port pid
  for svc in $(new_services "$1"); do
    name=${svc%%:*} port=${svc#*:}
    service_running "$name" "$port" || continue
    log "stopping the $name service that the install started (the scripts run private servers)"
    if [ "$(init_system)" = systemd ]; then
      as_root systemctl stop "$name" || true
      continue
    fi
    as_root service "$name" stop >/dev/null 2>&1 || true
    for pid in $(port_pids "$port"); do
      as_root kill "$pid" 2>/dev/null || true
    done
  done
}

# disable_new_services BEFORE disables each of system_services that starts
# at boot now and is not named in BEFORE (enabled_services' output from
# before an install): Debian enables a server's service on install even
# while policy-rc.d forbids starting it, and after the next boot it would
# listen on its port (3306, 6379, 80).
disable_new_services() {
  local svc name
  for svc in $(new_services "$1"); do
    name=${svc%%:*}
    if systemd_enabled "$name"; then
      log "disabling the $name service that the install enabled (systemctl)"
      as_root systemctl disable "$name" >/dev/null 2>&1 || log "systemctl disable $name failed"
    fi
    # systemctl disable on Debian removes the SysV links too; without
    # systemd, update-rc.d does.
    if sysv_enabled "$name"; then
      log "disabling the $name service that the install enabled (update-rc.d)"
      as_root update-rc.d "$name" disable >/dev/null 2>&1 || log "update-rc.d $name disable failed"
    fi
  done
}

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# listen_inodes PORT prints the inodes of the sockets listening on TCP PORT
# (Linux: /proc/net/tcp and tcp6).
listen_inodes() {
  awk -v p="$(printf ':%04X' "$1")" '$4 == "0A" && substr($2, length($2) - 4) == p { print $10 }' \
    /proc/net/tcp /proc/net/tcp6 2>/dev/null || true
}

# socket_patterns PORT prints grep arguments that match the fd links of
# the sockets listening on TCP PORT ("-e socket:[INODE]").
socket_patterns() {
  local inode
  for inode in $(listen_inodes "$1"); do printf '%s\n' -e "socket:[$inode]"; done
}

# port_pids PORT prints the pids of the processes listening on TCP PORT
# (Linux: from /proc, so that neither ss nor fuser is needed; elsewhere
# lsof).
port_pids() {
  local pats=()
  if [ ! -r /proc/net/tcp ]; then
    lsof -nP -iTCP:"$1" -sTCP:LISTEN -t 2>/dev/null | sort -u || true
    return 0
  fi
  mapfile -t pats < <(socket_patterns "$1")
  [ ${#pats[@]} -gt 0 ] || return 0
  find /proc/[0-9]*/fd -maxdepth 1 -type l -printf '%h %l\n' 2>/dev/null | grep -F "${pats[@]}" |
    sed 's|^/proc/\([0-9]*\)/.*|\1|' | sort -u || true
}

# pid_listens PID PORT tells whether process PID listens on TCP PORT: that
# the server answering on the port is that process, and not another that
# took the port meanwhile.
pid_listens() {
  local pats=()
  if [ ! -r /proc/net/tcp ]; then
    command -v lsof >/dev/null 2>&1 || die "cannot tell which process listens on port $2: no /proc/net/tcp, no lsof"
    lsof -nP -a -p "$1" -iTCP:"$2" -sTCP:LISTEN >/dev/null 2>&1
    return
  fi
  mapfile -t pats < <(socket_patterns "$2")
  [ ${#pats[@]} -gt 0 ] && grep -qF "${pats[@]}" < <(ls -l "/proc/$1/fd" 2>/dev/null)
}

# port_holder PORT prints who listens on TCP PORT, such as "pid 123
# (redis-server)", and fails when nothing does.
port_holder() {
  local pid who=
  [ -n "$(listen_inodes "$1")" ] || port_open "$1" || return 1
  for pid in $(port_pids "$1"); do
    who+="${who:+, }pid $pid ($(cat "/proc/$pid/comm" 2>/dev/null || ps -o comm= -p "$pid" 2>/dev/null || echo '?'))"
  done
  echo "${who:-a process this user cannot see}"
}

# need_free_port PORT WHAT fails, naming the process, when something
# listens on PORT, where WHAT is about to start.
need_free_port() {
  local holder
  holder=$(port_holder "$1") || return 0
  die "port $1, for $2, is held by $holder"
}

# ensure_make installs make when it is missing (apt-get, as ensure_deps
# installs the servers).
ensure_make() {
  command -v make >/dev/null 2>&1 && return 0
  command -v apt-get >/dev/null 2>&1 || die "please install make: no apt-get here"
  log "installing make"
  apt_install make
}

# free_port prints a TCP port on 127.0.0.1 that nothing listens on, below
# the kernel's ephemeral range so no outgoing connection can be holding it.
free_port() {
  local port i low=32768
  [ -r /proc/sys/net/ipv4/ip_local_port_range ] && read -r low _ </proc/sys/net/ipv4/ip_local_port_range
  [ "$low" -gt 11000 ] || low=32768
  for i in $(seq 1 200); do
    port=$(( 10000 + RANDOM % (low - 10000) ))
    if ! port_open "$port"; then
      echo "$port"; return 0
    fi
  done
  die "no free port found"
}

# free_port_except TAKEN prints a free port that is not in TAKEN, a list of
# ports between spaces (" 1 2 "): the ports a server set has picked, still
# free until its servers start.
free_port_except() {
  local p
  while :; do
    p=$(free_port)
    case $1 in *" $p "*) continue ;; esac
    echo "$p"
    return 0
  done
}

# free_ports N prints N distinct free ports (see free_port), one a line.
free_ports() {
  local ports=() port
  while [ ${#ports[@]} -lt "$1" ]; do
    port=$(free_port)
    case " ${ports[*]} " in *" $port "*) continue ;; esac
    ports+=("$port")
  done
  printf '%s\n' "${ports[@]}"
}

# wait_port PORT SECONDS [PID] waits until something accepts on
# 127.0.0.1:PORT; with PID, until process PID listens on PORT (another
# process that took the port does not count), giving up early if PID has
# died.
wait_port() {
  local port=$1 deadline=$(( SECONDS + $2 )) pid=${3:-}
  while :; do
    if [ -n "$pid" ]; then pid_listens "$pid" "$port" && return 0
    else port_open "$port" && return 0; fi
    [ $SECONDS -lt $deadline ] || return 1
    [ -z "$pid" ] || pid_alive "$pid" || return 1
    sleep 0.1
  done
}

# mariadb_flags prints, one a line, the mariadbd options every private
# MariaDB of the scripts runs with, a Galera node's too: no binary log,
# connections enough for the replicas' pools, and InnoDB's buffer pool and
# flushing (SHOP_INNODB_FLUSH, innodb_flush_log_at_trx_commit, default 1).
mariadb_flags() {
  printf '%s\n' --skip-log-bin --max-connections=1000 --innodb-buffer-pool-size=256M \
    --innodb-flush-log-at-trx-commit="${SHOP_INNODB_FLUSH:-1}"
}

# start_mariadb DIR PORT [OPTION...] starts a private MariaDB with its data
# in DIR; the options go to mariadbd.
start_mariadb() {
  local dir=$1 port=$2 mysqld install user=() flags=()
  shift 2
  mapfile -t flags < <(mariadb_flags)
  mysqld=$(find_bin mariadbd mysqld) || die "MariaDB server not found"
  install=$(find_bin mariadb-install-db mysql_install_db) || die "mariadb-install-db not found"
  [ "$(id -u)" -eq 0 ] && user=(--user=root)
  need_free_port "$port" "MariaDB in $dir"
  mkdir -p "$dir"
  if [ ! -d "$dir/data/mysql" ]; then
    "$install" --no-defaults --datadir="$dir/data" "${user[@]}" --auth-root-authentication-method=normal \
      --skip-test-db >"$dir/install.log" 2>&1 || { cat "$dir/install.log" >&2; die "mariadb-install-db failed"; }
  fi
  "$mysqld" --no-defaults --datadir="$dir/data" "${user[@]}" --bind-address=127.0.0.1 --port="$port" \
    --socket="$dir/mysqld.sock" --pid-file="$dir/mysqld.pid" --log-error="$dir/mysqld.log" \
    "${flags[@]}" "$@" </dev/null >"$dir/stdout.log" 2>&1 &
  echo $! >"$dir/pid"
  wait_port "$port" 60 $! || { tail -20 "$dir/mysqld.log" >&2; die "MariaDB did not start on port $port"; }
  log "MariaDB on 127.0.0.1:$port (data in $dir)"
}

# start_redis DIR PORT [OPTION...] starts a private, non-persistent Redis;
# the options go to redis-server.
start_redis() {
  local dir=$1 port=$2 redis
  shift 2
  redis=$(find_bin redis-server) || die "redis-server not found"
  need_free_port "$port" "Redis in $dir"
  mkdir -p "$dir"
  "$redis" --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" \
    --logfile "$dir/redis.log" --maxclients 10000 "$@" </dev/null >/dev/null 2>&1 &
  echo $! >"$dir/pid"
  wait_port "$port" 20 $! || { tail -20 "$dir/redis.log" >&2; die "Redis did not start on port $port"; }
  log "Redis on 127.0.0.1:$port${*:+ ($*)}"
}

# redis_cli PORT COMMAND... runs one command on the Redis (or Sentinel) on
# 127.0.0.1:PORT and prints its reply.
redis_cli() {
  local port=$1 cli
  shift
  cli=$(find_bin redis-cli) || die "redis-cli not found"
  "$cli" -h 127.0.0.1 -p "$port" "$@"
}

# wait_redis PORT LINE SECONDS COMMAND... waits until the reply of COMMAND
# on 127.0.0.1:PORT has LINE (such as cluster_state:ok).
wait_redis() {
  local port=$1 line=$2 deadline=$(( SECONDS + $3 ))
  shift 3
  until redis_cli "$port" "$@" 2>/dev/null | tr -d '\r' | grep -qx "$line"; do
    [ $SECONDS -lt $deadline ] || return 1
    sleep 0.1
  done
}

# start_redis_cluster DIR PORT... starts a Redis Cluster of one master per
# PORT, without replicas (a test and a demo need the slots spread over
# masters, not their failover), each node in DIR/PORT, and waits until
# every node reports the cluster ok. Its node timeout is Redis's default,
# 15 s, as nothing fails over: a node drops its bus link to a peer it has
# not heard from for half the timeout, and a PUBLISH (a lock's release
# announced) sent while the link is down reaches none of that peer's
# subscribers. With a timeout of 2 s, one announcement was lost on a loaded
# machine (a waiter whose backoff was an hour waited on), and 1 s of silence
# is the likely way.
start_redis_cluster() {
  local dir=$1 port nodes=()
  shift
  for port in "$@"; do
    # The bus port is chosen too: the default, PORT+10000, may be taken.
    start_redis "$dir/$port" "$port" --cluster-enabled yes --cluster-config-file nodes.conf \
      --cluster-node-timeout 15000 --cluster-port "$(free_port)"
    nodes+=("127.0.0.1:$port")
  done
  redis_cli "$1" --cluster create "${nodes[@]}" --cluster-yes >"$dir/create.log" 2>&1 ||
    { cat "$dir/create.log" >&2; die "redis-cli --cluster create failed"; }
  for port in "$@"; do
    wait_redis "$port" cluster_state:ok 30 CLUSTER INFO || die "the Redis Cluster on $port is not ok"
  done
  log "Redis Cluster of $# masters on $(IFS=,; echo "${nodes[*]}")"
}

# start_redis_sentinel DIR NAME MASTER_PORT REPLICA_PORT SENTINEL_PORT...
# starts a Redis master, one replica of it and a Sentinel per
# SENTINEL_PORT watching them as NAME (quorum 2, a master down after 3 s),
# each in DIR/PORT, and waits until the replica is in sync and every
# Sentinel knows it. Not 1 s: right after a switch a Sentinel gives the new
# master that long to answer its first PING on a new link, and on a loaded
# machine a second can pass; the other Sentinels' "down" votes about the old
# master still count, so it fails over at once, to the old master just
# started empty as a replica, and the data is lost.
start_redis_sentinel() {
  local dir=$1 name=$2 master=$3 replica=$4 port redis
  shift 4
  redis=$(find_bin redis-server) || die "redis-server not found"
  start_redis "$dir/$master" "$master"
  start_redis "$dir/$replica" "$replica" --replicaof 127.0.0.1 "$master"
  wait_redis "$replica" master_link_status:up 30 INFO replication || die "the Redis replica on $replica is not in sync"
  for port in "$@"; do
    need_free_port "$port" "a Sentinel in $dir/$port"
    mkdir -p "$dir/$port"
    # Sentinel rewrites its file as it learns the set-up.
    printf '%s\n' "port $port" "bind 127.0.0.1" "dir $dir/$port" "logfile $dir/$port/redis.log" \
      "sentinel monitor $name 127.0.0.1 $master 2" \
      "sentinel down-after-milliseconds $name 3000" \
      "sentinel failover-timeout $name 5000" >"$dir/$port/sentinel.conf"
    "$redis" "$dir/$port/sentinel.conf" --sentinel </dev/null >/dev/null 2>&1 &
    echo $! >"$dir/$port/pid"
    wait_port "$port" 20 $! || { tail -20 "$dir/$port/redis.log" >&2; die "Sentinel did not start on port $port"; }
  done
  for port in "$@"; do
    local deadline=$(( SECONDS + 30 ))
    until [ "$(redis_cli "$port" SENTINEL REPLICAS "$name" 2>/dev/null | grep -c "^127.0.0.1$")" -ge 1 ] &&
      [ "$(redis_cli "$port" SENTINEL SENTINELS "$name" 2>/dev/null | grep -c "^127.0.0.1$")" -ge $(( $# - 1 )) ]; do
      [ $SECONDS -lt $deadline ] || die "Sentinel on $port does not know the replica and the other Sentinels"
      sleep 0.2
    done
  done
  log "Redis master $name on 127.0.0.1:$master, its replica on :$replica, Sentinels on $(IFS=,; echo "$*")"
}

# stop_redis_set DIR stops every server that start_redis_cluster or
# start_redis_sentinel started in DIR.
stop_redis_set() {
  local pidfile
  for pidfile in "$1"/*/pid; do
    stop_pidfile "$pidfile"
  done
}

# pid_alive PID tells whether process PID runs. A zombie does not: a
# server started by an earlier script is an orphan once that script ends,
# and where the init process does not reap orphans (some containers) it
# stays a zombie after it exits, which kill -0 still finds.
pid_alive() {
  local stat state
  kill -0 "$1" 2>/dev/null || return 1
  if [ -d /proc/self ]; then
    # The process may end after kill -0: no file then, and not alive. read,
    # not $(<…): bash 5.2 exits a set -e script when $(<…) finds no file,
    # whatever follows it.
    { read -r stat <"/proc/$1/stat"; } 2>/dev/null || return 1
    state=${stat##*) }
    state=${state%% *}
  else
    state=$(ps -o stat= -p "$1" 2>/dev/null) || return 1
  fi
  [ "${state:0:1}" != Z ]
}

# alive DIR tells whether the process of DIR/pid runs.
alive() { [ -f "$1/pid" ] && pid_alive "$(cat "$1/pid")"; }

# serving DIR PORT tells whether the process of DIR/pid runs and listens on
# PORT: a server the scripts started, not another process that took its
# port, or its pid, meanwhile.
serving() { alive "$1" && pid_listens "$(cat "$1/pid")" "$2"; }

# kill_pidfile FILE kills the process whose pid FILE holds at once
# (SIGKILL), as a crash would, waits until it has exited, and removes FILE.
kill_pidfile() {
  local pid
  [ -f "$1" ] || return 0
  pid=$(cat "$1")
  if pid_alive "$pid"; then
    kill -9 "$pid" 2>/dev/null || true
    # Reaps it, quietly, when this shell started it.
    wait "$pid" 2>/dev/null || true
    for _ in $(seq 1 50); do pid_alive "$pid" || break; sleep 0.1; done
  fi
  rm -f "$1"
}

# stop_pidfile FILE [SECONDS] stops the process whose pid FILE holds
# (SIGTERM) and waits for it to exit, at least SECONDS (default 10), then
# kills it (SIGKILL). Give a process that drains on SIGTERM longer than its
# drain.
stop_pidfile() {
  local file=$1 timeout=${2:-10} pid deadline
  [ -f "$file" ] || return 0
  pid=$(cat "$file")
  if pid_alive "$pid" && kill "$pid" 2>/dev/null; then
    deadline=$(( SECONDS + timeout + 1 )) # SECONDS counts whole seconds
    while pid_alive "$pid" && [ $SECONDS -lt $deadline ]; do
      sleep 0.1
    done
    if pid_alive "$pid"; then
      log "pid $pid did not exit within ${timeout}s of SIGTERM: killing it"
      kill -9 "$pid" 2>/dev/null || true
      for _ in $(seq 1 50); do pid_alive "$pid" || break; sleep 0.1; done
    fi
  fi
  rm -f "$file"
}

# new_webhook_secret prints a new secret for signing payment events, in
# the form Standard Webhooks and Stripe give them: whsec_ and 32 random
# bytes in standard base64 (shop wants at least 24).
new_webhook_secret() { printf 'whsec_%s\n' "$(head -c 32 /dev/urandom | base64 | tr -d '\n')"; }

# stack_value STATE NAME prints NAME's value in the ports.env of the stack
# in STATE (scripts/stack.sh): a port, the admin token, a secret.
stack_value() {
  [ -f "$1/ports.env" ] || die "no stack in $1: scripts/stack.sh up first"
  sed -n "s/^$2=//p" "$1/ports.env" | tail -1 | tr -d "'"
}

# stripe-mock, Stripe's own stateless imitation of its API, stands in for
# Stripe in the tests, the demo and the load test (SHOP_PAYMENTS=stripe).
# This version is the one they are written against: its fixtures (a
# retrieve answers 1099 usd) and its API version.
stripe_mock_module=github.com/stripe/stripe-mock
stripe_mock_version=v0.203.0

# tools_dir prints where the scripts install the Go programs they run that
# are not this module's: bin/tools (SHOP_TOOLS_DIR replaces it; the tests
# of these scripts use it).
tools_dir() { echo "${SHOP_TOOLS_DIR:-$PWD/bin/tools}"; }

# module_version BINARY prints the version of the module a Go program was
# built from, as go install records it (empty for anything else).
module_version() { go version -m "$1" 2>/dev/null | awk '$1 == "mod" { print $3; exit }'; }

# ensure_stripe_mock prints the path of stripe-mock $stripe_mock_version in
# tools_dir, installing it first with go install (from the module proxy, as
# go fetches the module's own dependencies) when it is missing or another
# build.
ensure_stripe_mock() {
  local dir bin
  dir=$(tools_dir)
  bin=$dir/stripe-mock
  if [ "$(module_version "$bin")" != "$stripe_mock_version" ]; then
    log "installing stripe-mock $stripe_mock_version into $dir"
    mkdir -p "$dir"
    # go install overwrites only a Go program of its own making.
    rm -f "$bin"
    GOBIN=$dir go install "$stripe_mock_module@$stripe_mock_version" >&2 ||
      die "go install $stripe_mock_module@$stripe_mock_version failed"
  fi
  echo "$bin"
}

# The recording proxy that stands in front of stripe-mock: it logs every
# call (method, path, Idempotency-Key), one JSON line each, which the demo
# and the refunder's tests count. A tree without its source runs
# stripe-mock alone.
stripe_recorder_src=scripts/stripe-recorder

# has_stripe_recorder tells whether the tree has the recording proxy.
has_stripe_recorder() { [ -d "$stripe_recorder_src" ]; }

# build_stripe_recorder builds the recording proxy into bin/ and prints
# its path.
build_stripe_recorder() {
  go build -o bin/stripe-recorder "./$stripe_recorder_src" || die "go build ./$stripe_recorder_src failed"
  echo "$PWD/bin/stripe-recorder"
}

# start_stripe DIR MOCK_PORT RECORDER_PORT starts stripe-mock on
# 127.0.0.1:MOCK_PORT (in DIR/mock) and, where the tree has it, the
# recording proxy in front of it on 127.0.0.1:RECORDER_PORT (in
# DIR/recorder), logging the calls to DIR/calls.jsonl. Clients use
# stripe_api_base's URL.
start_stripe() {
  local dir=$1 port=$2 rport=$3 bin
  bin=$(ensure_stripe_mock)
  need_free_port "$port" "stripe-mock in $dir"
  mkdir -p "$dir/mock"
  # stripe-mock serves HTTPS beside HTTP unless told otherwise, on its
  # fixed port 12112 on every interface: here on a loopback port the
  # kernel picks, so that two of them never collide.
  "$bin" -http-addr "127.0.0.1:$port" -https-addr 127.0.0.1:0 </dev/null >>"$dir/mock/stripe-mock.log" 2>&1 &
  echo $! >"$dir/mock/pid"
  wait_port "$port" 30 $! || { tail -20 "$dir/mock/stripe-mock.log" >&2; die "stripe-mock did not start on port $port"; }
  log "stripe-mock $stripe_mock_version on 127.0.0.1:$port"
  if ! has_stripe_recorder; then
    log "no $stripe_recorder_src in this tree: stripe-mock's calls are not recorded"
    return 0
  fi
  bin=$(build_stripe_recorder)
  need_free_port "$rport" "the recording proxy in $dir"
  mkdir -p "$dir/recorder"
  "$bin" -listen "127.0.0.1:$rport" -target "http://127.0.0.1:$port" -log "$dir/calls.jsonl" \
    </dev/null >>"$dir/recorder/recorder.log" 2>&1 &
  echo $! >"$dir/recorder/pid"
  wait_port "$rport" 30 $! || { tail -20 "$dir/recorder/recorder.log" >&2; die "the recording proxy did not start on port $rport"; }
  log "stripe-mock's calls recorded on 127.0.0.1:$rport in $dir/calls.jsonl"
}

# stripe_api_base MOCK_PORT RECORDER_PORT prints the URL of Stripe's API
# for shop (SHOP_STRIPE_API_BASE): the recording proxy's, or stripe-mock's
# where the tree has no recorder.
stripe_api_base() {
  if has_stripe_recorder; then echo "http://127.0.0.1:$2"; else echo "http://127.0.0.1:$1"; fi
}

# stripe_running DIR MOCK_PORT RECORDER_PORT tells whether what start_stripe
# starts runs, each process on its port.
stripe_running() {
  serving "$1/mock" "$2" || return 1
  ! has_stripe_recorder || serving "$1/recorder" "$3"
}

# stop_stripe DIR stops what start_stripe started in DIR, the recorder
# first.
stop_stripe() {
  stop_pidfile "$1/recorder/pid"
  stop_pidfile "$1/mock/pid"
}

# The private servers of the other lock families: an etcd cluster and a
# ZooKeeper ensemble (SHOP_LOCK_MODE=etcd, zookeeper).
. "$(dirname "${BASH_SOURCE[0]}")/etcd.sh"
. "$(dirname "${BASH_SOURCE[0]}")/zookeeper.sh"
# The Galera cluster behind HAProxy (DB_TOPOLOGY=galera).
. "$(dirname "${BASH_SOURCE[0]}")/galera.sh"
