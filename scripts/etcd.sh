# shellcheck shell=bash
# Helpers to run a private etcd cluster on loopback, for SHOP_LOCK_MODE=etcd.
# Sourced by scripts/lib.sh, whose log, die, find_bin, free_port,
# need_free_port, wait_port, stop_pidfile and pid_alive they use. Each member
# lives in DIR/PORT (PORT its client port): its data in data/, its log in
# etcd.log, its pid in pid and its command line in args, so that it can be
# killed and started again on its data with the same flags.

# etcd_http PORT METHOD PATH [BODY] prints the body of the answer of the
# etcd member on 127.0.0.1:PORT to an HTTP request (no curl needed), and
# fails when it does not answer within 2 s.
etcd_http() {
  local port=$1 method=$2 path=$3 body=${4:-} line out= head=1 fd
  { exec {fd}<>"/dev/tcp/127.0.0.1/$port"; } 2>/dev/null || return 1
  printf '%s %s HTTP/1.0\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s' \
    "$method" "$path" "${#body}" "$body" >&"$fd"
  while IFS= read -r -t 2 line <&"$fd" || [ -n "$line" ]; do
    line=${line%$'\r'}
    if [ $head = 1 ]; then
      [ -n "$line" ] || head=0
    else
      out+=$line
    fi
    line=
  done
  exec {fd}>&-
  [ $head = 0 ] && printf '%s\n' "$out"
}

# etcd_healthy PORT tells whether the member on PORT serves and sees a
# leader (its /health says true).
etcd_healthy() { etcd_http "$1" GET /health 2>/dev/null | grep -q '"health":"true"'; }

# etcd_member_dirs DIR prints the member directories of the cluster in DIR.
etcd_member_dirs() {
  local d
  for d in "$1"/*/; do
    [ -f "$d/args" ] && echo "${d%/}"
  done
}

# etcd_endpoints DIR prints the client addresses of the cluster in DIR,
# comma-separated: SHOP_ETCD_ENDPOINTS.
etcd_endpoints() {
  local d eps=()
  for d in $(etcd_member_dirs "$1"); do eps+=("127.0.0.1:${d##*/}"); done
  (IFS=,; echo "${eps[*]}")
}

# launch_etcd_member DIR PORT starts the member DIR/PORT with the command
# line in its args file, on its data, and waits until it listens. It does
# not wait until it serves, which a member does only with a quorum.
launch_etcd_member() {
  local dir=$1/$2 port=$2 etcd args=()
  etcd=$(find_bin etcd) || die "etcd not found (Debian: apt-get install etcd-server)"
  [ -f "$dir/args" ] || die "$dir is not an etcd member of start_etcd_cluster"
  need_free_port "$port" "etcd member in $dir"
  mapfile -t args <"$dir/args"
  "$etcd" "${args[@]}" </dev/null >>"$dir/stdout.log" 2>&1 &
  echo $! >"$dir/pid"
  wait_port "$port" 20 $! || { tail -20 "$dir/etcd.log" >&2; die "etcd did not start on port $port"; }
}

# wait_etcd_member DIR PORT SECONDS waits until the member DIR/PORT serves,
# giving up early if it has died.
wait_etcd_member() {
  local dir=$1/$2 deadline=$(( SECONDS + $3 ))
  until etcd_healthy "$2"; do
    [ $SECONDS -lt $deadline ] && pid_alive "$(cat "$dir/pid" 2>/dev/null)" || return 1
    sleep 0.1
  done
}

# start_etcd_member DIR PORT starts the member DIR/PORT again on its data
# (after kill_pidfile DIR/PORT/pid, say: its data stay) and waits until it serves again.
start_etcd_member() {
  launch_etcd_member "$1" "$2"
  wait_etcd_member "$1" "$2" 30 || { tail -20 "$1/$2/etcd.log" >&2; die "etcd member on $2 does not serve"; }
  log "etcd member on 127.0.0.1:$2 serves again"
}

# start_etcd_cluster DIR CLIENT_PORT... starts an etcd cluster of one member
# per port, each in DIR/PORT with peer ports picked by free_port, and waits
# until every member serves; it logs the endpoints. Heartbeats every 100 ms
# and a 1 s election timeout (etcd's defaults) make the smallest lease TTL
# 2 s. A DIR that holds a cluster already (stop_etcd_cluster keeps it)
# starts again on its data, with its own ports: the PORTs may be left out.
start_etcd_cluster() {
  local dir=$1 port peer taken initial= token d
  shift
  find_bin etcd >/dev/null || die "etcd not found (Debian: apt-get install etcd-server)"
  if [ -z "$(etcd_member_dirs "$dir")" ]; then
    [ $# -gt 0 ] || die "start_etcd_cluster DIR PORT...: no port"
    taken=" $* "
    for port in "$@"; do
      need_free_port "$port" "etcd member in $dir/$port"
      # A peer port must be none of the client ports, which are still free.
      peer=$(free_port_except "$taken")
      taken+="$peer "
      mkdir -p "$dir/$port"
      echo "$peer" >"$dir/$port/peer_port"
      initial+="${initial:+,}m$port=http://127.0.0.1:$peer"
    done
    token="shop-etcd-$$-$RANDOM"
    for port in "$@"; do
      d=$dir/$port
      peer=$(cat "$d/peer_port")
      # No metrics or pprof listener of their own: --listen-metrics-urls
      # stays empty and pprof off.
      printf '%s\n' --name "m$port" --data-dir "$d/data" \
        --listen-client-urls "http://127.0.0.1:$port" --advertise-client-urls "http://127.0.0.1:$port" \
        --listen-peer-urls "http://127.0.0.1:$peer" --initial-advertise-peer-urls "http://127.0.0.1:$peer" \
        --initial-cluster "$initial" --initial-cluster-state new --initial-cluster-token "$token" \
        --logger zap --log-outputs "$d/etcd.log" >"$d/args"
    done
  else
    # shellcheck disable=SC2046 # ports: digits alone
    set -- $(for d in $(etcd_member_dirs "$dir"); do echo "${d##*/}"; done)
  fi
  # Every member is started before any is waited for: none serves until a
  # quorum runs.
  for port in "$@"; do
    [ -f "$dir/$port/pid" ] && pid_alive "$(cat "$dir/$port/pid")" || launch_etcd_member "$dir" "$port"
  done
  for port in "$@"; do
    wait_etcd_member "$dir" "$port" 30 || { tail -20 "$dir/$port/etcd.log" >&2; die "etcd member on $port does not serve"; }
  done
  log "etcd cluster of $# members: SHOP_ETCD_ENDPOINTS=$(etcd_endpoints "$dir") (data in $dir)"
}

# stop_etcd_cluster DIR stops every member of the cluster in DIR, keeping
# their data: start_etcd_cluster DIR starts it again.
stop_etcd_cluster() {
  local d
  for d in $(etcd_member_dirs "$1"); do
    stop_pidfile "$d/pid"
  done
}

# etcd_leader_dir DIR prints the member directory of the cluster's leader
# now, as the running members report it, waiting up to 10 s for one to be
# elected; it fails when none is.
etcd_leader_dir() {
  local d status id leader deadline=$(( SECONDS + 10 ))
  while :; do
    for d in $(etcd_member_dirs "$1"); do
      [ -f "$d/pid" ] && pid_alive "$(cat "$d/pid")" || continue
      status=$(etcd_http "${d##*/}" POST /v3/maintenance/status '{}') || continue
      id=$(sed -n 's/.*"member_id":"\([0-9]*\)".*/\1/p' <<<"$status")
      leader=$(sed -n 's/.*"leader":"\([0-9]*\)".*/\1/p' <<<"$status")
      if [ -n "$id" ] && [ "$id" = "$leader" ]; then
        echo "$d"
        return 0
      fi
    done
    [ $SECONDS -lt $deadline ] || return 1
    sleep 0.2
  done
}
