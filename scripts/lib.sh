# shellcheck shell=bash
# Helpers to install and run private MariaDB, Redis and nginx instances on
# loopback. Sourced by the other scripts; every server they start lives in a
# directory of its own and listens only on 127.0.0.1.

log() { printf '==> %s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

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

# ensure_deps installs MariaDB, Redis and nginx when they are missing.
ensure_deps() {
  local apt=() brew=()
  find_bin mariadbd mysqld >/dev/null || { apt+=(mariadb-server); brew+=(mariadb); }
  find_bin redis-server >/dev/null || { apt+=(redis-server); brew+=(redis); }
  find_bin nginx >/dev/null || { apt+=(nginx); brew+=(nginx); }
  [ ${#apt[@]} -eq 0 ] && return 0
  log "installing ${apt[*]}"
  if command -v apt-get >/dev/null 2>&1; then
    local sudo=()
    [ "$(id -u)" -eq 0 ] || sudo=(sudo)
    "${sudo[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends "${apt[@]}" >/dev/null
  elif command -v brew >/dev/null 2>&1; then
    brew install "${brew[@]}"
  else
    die "please install ${apt[*]} (MariaDB or MySQL server, Redis, nginx): no apt-get or brew here"
  fi
}

# free_port prints a TCP port on 127.0.0.1 that nothing listens on, below
# the kernel's ephemeral range so no outgoing connection can be holding it.
free_port() {
  local port i low=32768
  [ -r /proc/sys/net/ipv4/ip_local_port_range ] && read -r low _ </proc/sys/net/ipv4/ip_local_port_range
  [ "$low" -gt 11000 ] || low=32768
  for i in $(seq 1 200); do
    port=$(( 10000 + RANDOM % (low - 10000) ))
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      echo "$port"; return 0
    fi
  done
  die "no free port found"
}

# wait_port PORT SECONDS [PID] waits until something accepts on
# 127.0.0.1:PORT; it gives up early if process PID has died.
wait_port() {
  local port=$1 deadline=$(( SECONDS + $2 )) pid=${3:-}
  while ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; do
    [ $SECONDS -lt $deadline ] || return 1
    [ -z "$pid" ] || kill -0 "$pid" 2>/dev/null || return 1
    sleep 0.1
  done
}

# start_mariadb DIR PORT [OPTION...] starts a private MariaDB with its data
# in DIR; the options go to mariadbd.
start_mariadb() {
  local dir=$1 port=$2 mysqld install user=()
  shift 2
  mysqld=$(find_bin mariadbd mysqld) || die "MariaDB server not found"
  install=$(find_bin mariadb-install-db mysql_install_db) || die "mariadb-install-db not found"
  [ "$(id -u)" -eq 0 ] && user=(--user=root)
  mkdir -p "$dir"
  if [ ! -d "$dir/data/mysql" ]; then
    "$install" --no-defaults --datadir="$dir/data" "${user[@]}" --auth-root-authentication-method=normal \
      --skip-test-db >"$dir/install.log" 2>&1 || { cat "$dir/install.log" >&2; die "mariadb-install-db failed"; }
  fi
  "$mysqld" --no-defaults --datadir="$dir/data" "${user[@]}" --bind-address=127.0.0.1 --port="$port" \
    --socket="$dir/mysqld.sock" --pid-file="$dir/mysqld.pid" --log-error="$dir/mysqld.log" \
    --skip-log-bin --max-connections=1000 --innodb-buffer-pool-size=256M \
    --innodb-flush-log-at-trx-commit="${SHOP_INNODB_FLUSH:-1}" "$@" </dev/null >"$dir/stdout.log" 2>&1 &
  echo $! >"$dir/pid"
  wait_port "$port" 60 $! || { tail -20 "$dir/mysqld.log" >&2; die "MariaDB did not start on port $port"; }
  log "MariaDB on 127.0.0.1:$port (data in $dir)"
}

# start_redis DIR PORT starts a private, non-persistent Redis.
start_redis() {
  local dir=$1 port=$2 redis
  redis=$(find_bin redis-server) || die "redis-server not found"
  mkdir -p "$dir"
  "$redis" --port "$port" --bind 127.0.0.1 --save '' --appendonly no --dir "$dir" \
    --logfile "$dir/redis.log" --maxclients 10000 </dev/null >/dev/null 2>&1 &
  echo $! >"$dir/pid"
  wait_port "$port" 20 $! || { tail -20 "$dir/redis.log" >&2; die "Redis did not start on port $port"; }
  log "Redis on 127.0.0.1:$port"
}

# stop_pidfile FILE stops the process whose pid FILE holds and waits for it.
stop_pidfile() {
  local file=$1 pid i
  [ -f "$file" ] || return 0
  pid=$(cat "$file")
  if kill "$pid" 2>/dev/null; then
    for i in $(seq 1 100); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null || true
  fi
  rm -f "$file"
}
