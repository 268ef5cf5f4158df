#!/usr/bin/env bash
# Tests of scripts/lib.sh and .ci/run, with apt-get replaced by a fake that
# logs what it was asked, checks the policy-rc.d in place, and plays what a
# package's install does (a compiler or make appears, a service starts, or
# the install fails). Real redis-servers stand in for the services.
# make test runs it; it needs redis-server and a C compiler, as make test
# does. The Redis topologies of scripts/stack.sh and its failover commands
# run on real servers too. About a minute: stop_pidfile's drain and the
# Sentinels' failovers take most of it.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

tmp=$(mktemp -d "${TMPDIR:-/tmp}/shop-libtest.XXXXXX")
redis=$(find_bin redis-server) || die "redis-server not found"
cleanup() {
  local f
  for f in "$tmp"/*.pid; do
    [ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null
  done
  rm -rf "$tmp"
}
trap cleanup EXIT

passed=0 failed=0
ok() { passed=$((passed + 1)); printf 'ok   %s\n' "$*"; }
fail() { failed=$((failed + 1)); printf 'FAIL %s\n' "$*"; }

mkdir -p "$tmp/bin"
cat >"$tmp/bin/apt-get" <<EOF
#!/usr/bin/env bash
# The fake apt-get: see the top of scripts/lib_test.sh.
echo "apt-get \$*" >>"$tmp/apt.log"
[ "\$1" = install ] || exit 0
if [ -x "\$SHOP_POLICY_RC_D" ]; then
  "\$SHOP_POLICY_RC_D" redis-server start && echo "policy allows" >>"$tmp/apt.log" ||
    echo "policy exit \$?" >>"$tmp/apt.log"
else
  echo "policy none" >>"$tmp/apt.log"
fi
for p in "\$@"; do
  case \$p in
    gcc) ln -sf "\$(command -v gcc)" "$tmp/bin/fakecc" ;;
    make) printf '#!/bin/sh\necho "make \$*" >>"$tmp/apt.log"\nexit \${FAKE_MAKE_RC:-0}\n' >"$tmp/bin/make"
          chmod +x "$tmp/bin/make" ;;
  esac
done
if [ -n "\${FAKE_APT_START_PORT:-}" ]; then
  "$redis" --port "\$FAKE_APT_START_PORT" --bind 127.0.0.1 --save '' --daemonize yes \
    --pidfile "$tmp/started.pid" --logfile "$tmp/started.log" >/dev/null
  for _ in \$(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/\$FAKE_APT_START_PORT") 2>/dev/null && break; sleep 0.1; done
fi
exit \${FAKE_APT_RC:-0}
EOF
chmod +x "$tmp/bin/apt-get"
export PATH="$tmp/bin:$PATH" SHOP_POLICY_RC_D="$tmp/policy-rc.d"

port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# wait_closed PORT: whether PORT stops answering within 10 seconds.
wait_closed() {
  local i
  for i in $(seq 1 100); do port_open "$1" || return 0; sleep 0.1; done
  return 1
}

# An install puts a policy-rc.d that forbids every start in place and
# removes it afterwards; a service that the install started is stopped, and
# the one that ran before is left running.
test_install_starts_nothing() {
  local old new
  old=$(free_port) new=$(free_port)
  "$redis" --port "$old" --bind 127.0.0.1 --save '' --daemonize yes --pidfile "$tmp/old.pid" \
    --logfile "$tmp/old.log" >/dev/null
  wait_port "$old" 10 || die "redis on $old did not start"
  : >"$tmp/apt.log"
  SHOP_SERVICES="shop-test-old:$old shop-test-new:$new" FAKE_APT_START_PORT=$new apt_install redis-server 2>/dev/null
  if grep -qx 'policy exit 101' "$tmp/apt.log"; then ok "policy-rc.d forbids starts during the install"
  else fail "policy-rc.d during the install: $(grep policy "$tmp/apt.log")"; fi
  if [ ! -e "$tmp/policy-rc.d" ]; then ok "policy-rc.d removed after the install"
  else fail "policy-rc.d left behind"; fi
  if wait_closed "$new"; then ok "the service the install started is stopped"
  else fail "the service the install started still answers on $new"; fi
  if port_open "$old"; then ok "the service that ran before is left running"
  else fail "the service that ran before the install was stopped"; fi
}

# A failed install removes the policy-rc.d too and fails.
test_failed_install() {
  : >"$tmp/apt.log"
  if SHOP_SERVICES= FAKE_APT_RC=100 apt_install redis-server 2>/dev/null; then fail "a failed install succeeded"
  else ok "a failed install fails"; fi
  if [ ! -e "$tmp/policy-rc.d" ] && grep -qx 'policy exit 101' "$tmp/apt.log"; then
    ok "policy-rc.d in place during a failed install and removed after it"
  else fail "policy-rc.d and a failed install: $(grep policy "$tmp/apt.log"), exists: $([ -e "$tmp/policy-rc.d" ] && echo yes || echo no)"; fi
}

# A policy-rc.d of the machine's own is used as it is and kept.
test_existing_policy_kept() {
  printf '#!/bin/sh\nexit 0\n' >"$tmp/policy-rc.d"
  chmod +x "$tmp/policy-rc.d"
  : >"$tmp/apt.log"
  SHOP_SERVICES= apt_install redis-server 2>/dev/null
  if [ "$(cat "$tmp/policy-rc.d")" = "$(printf '#!/bin/sh\nexit 0')" ] && grep -qx 'policy allows' "$tmp/apt.log"; then
    ok "an existing policy-rc.d is neither replaced nor removed"
  else fail "an existing policy-rc.d was changed: $(grep policy "$tmp/apt.log")"; fi
  rm -f "$tmp/policy-rc.d"
}

# ensure_deps race installs gcc and libc6-dev when go's C compiler is
# missing, and nothing when it works.
test_race_installs_a_compiler() {
  : >"$tmp/apt.log"
  CC=$tmp/bin/fakecc SHOP_SERVICES= ensure_deps race 2>/dev/null
  if grep -q '^apt-get install .* gcc libc6-dev$' "$tmp/apt.log"; then ok "ensure_deps race installs gcc and libc6-dev without a compiler"
  else fail "ensure_deps race without a compiler asked apt-get: $(grep install "$tmp/apt.log" || echo nothing)"; fi
  : >"$tmp/apt.log"
  CC=$tmp/bin/fakecc SHOP_SERVICES= ensure_deps race 2>/dev/null
  if ! grep -q install "$tmp/apt.log"; then ok "ensure_deps race installs nothing when the compiler works"
  else fail "ensure_deps race installed with a working compiler: $(cat "$tmp/apt.log")"; fi
}

# .ci/run installs make where it is missing, runs make test and fails when
# make test fails.
test_ci_run_without_make() {
  local nomake=$tmp/nomake dir f rc
  mkdir -p "$nomake"
  for dir in ${PATH//:/ }; do
    [ "$dir" = "$tmp/bin" ] && continue
    for f in "$dir"/*; do
      [ "${f##*/}" = make ] || [ -e "$nomake/${f##*/}" ] || ln -s "$f" "$nomake/${f##*/}" 2>/dev/null || true
    done
  done
  rm -f "$tmp/bin/make"
  : >"$tmp/apt.log"
  rc=0
  PATH="$tmp/bin:$nomake" SHOP_SERVICES= bash .ci/run >/dev/null 2>&1 || rc=$?
  if [ $rc -eq 0 ] && grep -q '^apt-get install .* make$' "$tmp/apt.log" && grep -qx 'make test' "$tmp/apt.log"; then
    ok ".ci/run installs make and runs make test"
  else fail ".ci/run without make: exit $rc, $(tr '\n' ';' <"$tmp/apt.log")"; fi
  rc=0
  PATH="$tmp/bin:$nomake" FAKE_MAKE_RC=3 bash .ci/run >/dev/null 2>&1 || rc=$?
  if [ $rc -ne 0 ]; then ok ".ci/run fails when make test fails"
  else fail ".ci/run exited 0 although make test failed"; fi
}

# start_orphan NAME TRAP starts a process that runs TRAP on SIGTERM, from a
# subshell that ends at once, as scripts/stack.sh's servers outlive it.
start_orphan() {
  (bash -c "trap '$2' TERM; while :; do sleep 0.1; done" </dev/null >/dev/null 2>&1 & echo $! >"$tmp/$1.pid")
  sleep 0.5 # the trap is set
}

# stop_pidfile waits as long as it is told for a process that drains, kills
# one that takes longer, and does not wait for one that has exited.
test_stop_pidfile() {
  local start took
  start_orphan drain "sleep 12; touch $tmp/drained; exit 0"
  stop_pidfile "$tmp/drain.pid" 30
  if [ -e "$tmp/drained" ]; then ok "stop_pidfile FILE 30 lets a 12-second drain finish"
  else fail "stop_pidfile FILE 30 killed a process 12 seconds into its drain"; fi

  start_orphan slow "sleep 20; touch $tmp/slow-drained; exit 0"
  local pid
  pid=$(cat "$tmp/slow.pid")
  start=$SECONDS
  stop_pidfile "$tmp/slow.pid" 1 2>/dev/null
  took=$((SECONDS - start))
  if ! pid_alive "$pid" && [ ! -e "$tmp/slow-drained" ] && [ $took -lt 15 ]; then
    ok "stop_pidfile FILE 1 kills a process that drains for 20 seconds (after ${took}s)"
  else fail "stop_pidfile FILE 1: alive $(pid_alive "$pid" && echo yes || echo no), after ${took}s"; fi

  start_orphan quick "exit 0"
  start=$SECONDS
  stop_pidfile "$tmp/quick.pid" 30
  took=$((SECONDS - start))
  if [ $took -lt 5 ]; then ok "stop_pidfile returns once the process has exited (${took}s)"
  else fail "stop_pidfile waited ${took}s for a process that exited at once"; fi
}

# pid_alive says no, and returns, for a process that ends between its kill -0
# and its look at the process's state — in a set -e script, as stack.sh is,
# where bash 5.2 exits on a $(<…) that finds no file. kill -0 is made to
# succeed for a pid that runs no process.
test_pid_alive_gone() {
  local out
  out=$(bash -c 'set -euo pipefail; . scripts/lib.sh; kill() { return 0; }
    if pid_alive 2147483647; then echo alive; else echo "not alive"; fi' 2>&1) || true
  if [ "$out" = "not alive" ]; then ok "pid_alive says not alive for a process gone after kill -0, under set -e"
  else fail "pid_alive on a process gone after kill -0, under set -e: ${out:-the script exited}"; fi
}

# sentinel_says PORT NAME prints the port of the master the Sentinel on
# PORT names.
sentinel_says() { redis_cli "$1" SENTINEL get-master-addr-by-name "$2" | tr -d '\r' | sed -n 2p; }

# role PORT prints "master", or "slave of MASTER_PORT" once in sync.
role() {
  local info
  info=$(redis_cli "$1" INFO replication | tr -d '\r')
  case $info in
    *role:master*) echo master ;;
    *master_link_status:up*) echo "slave of $(sed -n 's/^master_port://p' <<<"$info")" ;;
    *) echo "slave, not in sync" ;;
  esac
}

# scripts/stack.sh starts the Redis of each topology (redis-up), points shop
# at it (its SHOP_REDIS_* settings), and on Sentinel fails the master over:
# on request (failover-redis) and by a crash (kill-redis-master), each
# returning once the Sentinels name the new master and the old one follows
# it. Only the Redis servers start, no MariaDB or replica.
test_stack_topologies() {
  local st=$tmp/stack out master replica sentinels master2 rc=0 port want
  export SHOP_STATE=$st NGINX_PORT=0
  out=$(REDIS_TOPOLOGY=cluster scripts/stack.sh redis-up 2>"$tmp/stack.log") || cat "$tmp/stack.log"
  local first=${out#SHOP_REDIS_ADDR=127.0.0.1:}
  first=${first%%,*}
  if [[ $out =~ ^SHOP_REDIS_ADDR=127\.0\.0\.1:[0-9]+,127\.0\.0\.1:[0-9]+,127\.0\.0\.1:[0-9]+$ ]] &&
    redis_cli "$first" CLUSTER INFO | tr -d '\r' | grep -qx cluster_state:ok; then
    ok "stack.sh redis-up starts a Cluster of three masters and names them in SHOP_REDIS_ADDR"
  else fail "stack.sh redis-up on a Cluster: $out"; fi
  if scripts/stack.sh status | grep -q "^Redis topology: cluster (SHOP_REDIS_ADDR=127.0.0.1:$first,"; then
    ok "the topology is kept in the state: stack.sh status, without REDIS_TOPOLOGY, names the Cluster"
  else fail "the topology was not kept: $(scripts/stack.sh status | grep topology)"; fi

  out=$(REDIS_TOPOLOGY=sentinel scripts/stack.sh redis-up 2>"$tmp/stack.log") || cat "$tmp/stack.log"
  . "$st/ports.env"
  read -r master replica <<<"$SENTINEL_REDIS_PORTS"
  read -r -a sentinels <<<"$SENTINEL_PORTS"
  want=
  for port in "${sentinels[@]}"; do want+=${want:+,}127.0.0.1:$port; done
  if [ "$out" = "$(printf 'SHOP_REDIS_ADDR=%s\nSHOP_REDIS_MASTER_NAME=shop' "$want")" ] &&
    [ "$(sentinel_says "${sentinels[0]}" shop)" = "$master" ]; then
    ok "stack.sh redis-up starts a Sentinel set-up and names its Sentinels and master in the settings"
  else fail "stack.sh redis-up on Sentinel: $out; master $(sentinel_says "${sentinels[0]}" shop), want $master"; fi

  scripts/stack.sh failover-redis 2>"$tmp/stack.log" || { rc=$?; cat "$tmp/stack.log"; }
  if [ $rc -eq 0 ] && [ "$(sentinel_says "${sentinels[2]}" shop)" = "$replica" ] && [ "$(role "$master")" = "slave of $replica" ]; then
    ok "stack.sh failover-redis returns once the replica is master and the old master follows it"
  else fail "stack.sh failover-redis: exit $rc, Sentinels name $(sentinel_says "${sentinels[2]}" shop), :$master is $(role "$master")"; fi

  local pid
  pid=$(cat "$st/redis-sentinel/$replica/pid")
  rc=0
  scripts/stack.sh kill-redis-master 2>"$tmp/stack.log" || { rc=$?; cat "$tmp/stack.log"; }
  master2=$(sentinel_says "${sentinels[1]}" shop)
  if [ $rc -eq 0 ] && ! pid_alive "$pid" && [ "$master2" = "$master" ] && [ "$(role "$replica")" = "slave of $master" ]; then
    ok "stack.sh kill-redis-master kills the master, and returns once the replica is master and the killed one is back as its replica"
  else fail "stack.sh kill-redis-master: exit $rc, Sentinels name $master2, :$replica is $(role "$replica")"; fi

  scripts/stack.sh down >/dev/null 2>&1
  if [ ! -e "$st" ] && ! port_open "$master" && ! port_open "$replica" && ! port_open "${sentinels[0]}" && ! port_open "$first"; then
    ok "stack.sh down stops the Cluster and the Sentinel set-up"
  else fail "stack.sh down left a Redis of a topology running or the state behind"; fi
  unset SHOP_STATE NGINX_PORT
}

test_install_starts_nothing
test_failed_install
test_existing_policy_kept
test_race_installs_a_compiler
test_ci_run_without_make
test_stop_pidfile
test_pid_alive_gone
test_stack_topologies

echo "scripts/lib_test.sh: $passed passed, $failed failed"
[ $failed -eq 0 ]
