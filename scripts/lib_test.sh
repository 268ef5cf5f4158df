#!/usr/bin/env bash
# Tests of scripts/lib.sh, scripts/stack.sh's state and ports, the Go version
# check of every entry script, and .ci/run. The commands that act on the
# machine are fakes on PATH that log what they were asked: apt-get (which
# checks the policy-rc.d in place and plays what a package's install does:
# a compiler or make appears, a service is enabled or starts, or the
# install fails), sudo (which, as sudo does, passes no environment but
# keeps PATH, so that the fakes run through it), id (FAKE_UID plays a
# user), systemctl, update-rc.d and service (with the services' state in
# files), and go where its version is tested. So the tests do not depend on
# the machine's init system or user: SHOP_INIT_SYSTEM plays systemd or
# not. Real redis-servers stand in for the services that answer on a port.
# make test runs it; it needs redis-server and a C compiler, as make test
# does. `scripts/lib_test.sh TEST...` runs only the tests named. The Redis topologies of scripts/stack.sh and its failover commands
# run on real servers too, and so does one Galera stack behind HAProxy with
# its writer killed. About three minutes: stop_pidfile's drain, the
# Sentinels' failovers and the Galera cluster's start and failover take most
# of it.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

tmp=$(mktemp -d "${TMPDIR:-/tmp}/shop-libtest.XXXXXX")
redis=$(find_bin redis-server) || die "redis-server not found"
real_id=$(command -v id)
real_make=$(command -v make) || real_make=
# start_time PID prints when process PID started (clock ticks since boot),
# which tells it from a later process that got its pid.
start_time() { sed 's/^.*) //' "/proc/$1/stat" 2>/dev/null | cut -d' ' -f20; }

# own NAME PID records process PID, started by a test, for cleanup to kill.
own() { echo "$2 $(start_time "$2")" >"$tmp/$1.own"; }

# cleanup stops the stacks the tests started and kills the processes they
# recorded (own), unless a process has ended and its pid been given to
# another since.
cleanup() {
  local f pid started
  for f in "$tmp"/stack*/.shop-stack; do
    [ ! -f "$f" ] || SHOP_STATE=${f%/*} scripts/stack.sh down >/dev/null 2>&1 || true
  done
  for f in "$tmp"/*.own; do
    [ -f "$f" ] || continue
    read -r pid started <"$f"
    if [ -n "$started" ] && [ "$(start_time "$pid")" = "$started" ]; then kill -9 "$pid" 2>/dev/null || true; fi
  done
  rm -rf "$tmp"
}
trap cleanup EXIT

passed=0 failed=0
ok() { passed=$((passed + 1)); printf 'ok   %s\n' "$*"; }
fail() { failed=$((failed + 1)); printf 'FAIL %s\n' "$*"; }

mkdir -p "$tmp/bin" "$tmp/systemd" "$tmp/etc/rc2.d" "$tmp/etc/rc3.d"
cat >"$tmp/bin/apt-get" <<EOF
#!/usr/bin/env bash
# The fake apt-get: see the top of scripts/lib_test.sh.
echo "apt-get \$*\${FAKE_VIA_SUDO:+ (sudo)}" >>"$tmp/apt.log"
[ "\$1" = install ] || exit 0
echo "frontend \${DEBIAN_FRONTEND:-unset}" >>"$tmp/apt.log"
if [ -x "$tmp/policy-rc.d" ]; then
  "$tmp/policy-rc.d" redis-server start && echo "policy allows" >>"$tmp/apt.log" ||
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
# What Debian's maintainer scripts do: enable the services (SysV links and
# systemd's), and start them where policy-rc.d lets them or systemd is faked.
for s in \${FAKE_APT_ENABLE:-}; do
  ln -sf ../init.d/\$s "$tmp/etc/rc2.d/S01\$s"
  ln -sf ../init.d/\$s "$tmp/etc/rc3.d/S01\$s"
  touch "$tmp/systemd/\$s.enabled"
done
for s in \${FAKE_APT_START:-}; do touch "$tmp/systemd/\$s.active"; done
if [ -n "\${FAKE_APT_START_PORT:-}" ]; then
  "$redis" --port "\$FAKE_APT_START_PORT" --bind 127.0.0.1 --save '' --daemonize yes \
    --pidfile "$tmp/started.pid" --logfile "$tmp/started.log" >/dev/null
  for _ in \$(seq 1 100); do (exec 3<>"/dev/tcp/127.0.0.1/\$FAKE_APT_START_PORT") 2>/dev/null && break; sleep 0.1; done
  pid=\$(cat "$tmp/started.pid")
  echo "\$pid \$(sed 's/^.*) //' /proc/\$pid/stat | cut -d' ' -f20)" >"$tmp/started.own"
fi
[ -z "\${FAKE_APT_SLEEP:-}" ] || sleep "\$FAKE_APT_SLEEP"
exit \${FAKE_APT_RC:-0}
EOF
cat >"$tmp/bin/sudo" <<EOF
#!/usr/bin/env bash
# The fake sudo: logs, and runs the command without the caller's
# environment, as sudo does, but with its PATH and the fakes' settings.
echo "sudo \$*" >>"$tmp/sudo.log"
mapfile -t keep < <(env | grep '^FAKE_')
exec env -i PATH="\$PATH" FAKE_VIA_SUDO=1 "\${keep[@]}" "\$@"
EOF
cat >"$tmp/bin/id" <<EOF
#!/bin/sh
# The fake id: FAKE_UID is the user's id.
if [ "\$1" = -u ] && [ -n "\${FAKE_UID:-}" ]; then echo "\$FAKE_UID"; else exec "$real_id" "\$@"; fi
EOF
cat >"$tmp/bin/systemctl" <<EOF
#!/usr/bin/env bash
# The fake systemctl: a unit is active or enabled while its file is there.
[ "\$2" != --quiet ] || set -- "\$1" "\$3"
case \$1 in
  is-active) [ -e "$tmp/systemd/\$2.active" ] ;;
  is-enabled) [ -e "$tmp/systemd/\$2.enabled" ] ;;
  stop) echo "systemctl stop \$2\${FAKE_VIA_SUDO:+ (sudo)}" >>"$tmp/services.log"; rm -f "$tmp/systemd/\$2.active" ;;
  disable) echo "systemctl disable \$2\${FAKE_VIA_SUDO:+ (sudo)}" >>"$tmp/services.log"; rm -f "$tmp/systemd/\$2.enabled" ;;
  *) echo "fake systemctl: \$*" >&2; exit 1 ;;
esac
EOF
cat >"$tmp/bin/update-rc.d" <<EOF
#!/usr/bin/env bash
# The fake update-rc.d NAME disable: start links become stop links.
echo "update-rc.d \$*\${FAKE_VIA_SUDO:+ (sudo)}" >>"$tmp/services.log"
[ "\$2" = disable ] || exit 1
for l in "$tmp"/etc/rc[2345].d/S[0-9][0-9]"\$1"; do
  [ -e "\$l" ] || [ -L "\$l" ] || continue
  b=\${l##*/}; mv "\$l" "\${l%/*}/K01\${b:3}"
done
EOF
cat >"$tmp/bin/service" <<EOF
#!/bin/sh
echo "service \$*" >>"$tmp/services.log"
EOF
chmod +x "$tmp"/bin/*
export PATH="$tmp/bin:$PATH" SHOP_POLICY_RC_D="$tmp/policy-rc.d" SHOP_ETC="$tmp/etc" SHOP_INIT_SYSTEM=sysv

# wait_closed PORT: whether PORT stops answering within 10 seconds.
wait_closed() {
  local i
  for i in $(seq 1 100); do port_open "$1" || return 0; sleep 0.1; done
  return 1
}

# boot_state NAME prints how the fake service NAME starts at boot:
# "systemd sysv", "systemd", "sysv" or "no".
boot_state() {
  local st=
  [ ! -e "$tmp/systemd/$1.enabled" ] || st=systemd
  ! compgen -G "$tmp/etc/rc[2345].d/S[0-9][0-9]$1" >/dev/null || st+=${st:+ }sysv
  echo "${st:-no}"
}

# reset_services [NAME...]: no fake service runs or is enabled but NAME...,
# which run and are enabled (in systemd and by SysV links), as a user's own.
reset_services() {
  local name
  rm -f "$tmp"/systemd/* "$tmp"/etc/rc?.d/*
  for name in "$@"; do
    touch "$tmp/systemd/$name.active" "$tmp/systemd/$name.enabled"
    ln -s "../init.d/$name" "$tmp/etc/rc2.d/S01$name"
  done
  : >"$tmp/apt.log"
  : >"$tmp/services.log"
  : >"$tmp/sudo.log"
}

# An install puts a policy-rc.d that forbids every start in place and
# removes it afterwards; a service that the install started is stopped and
# one it enabled is disabled, and the service that ran and was enabled
# before is left running and enabled. Without systemd, a service runs while
# its port answers.
test_install_starts_nothing() {
  local old new
  old=$(free_port) new=$(free_port)
  "$redis" --port "$old" --bind 127.0.0.1 --save '' --daemonize yes --pidfile "$tmp/old.pid" \
    --logfile "$tmp/old.log" >/dev/null
  wait_port "$old" 10 || die "redis on $old did not start"
  own old "$(cat "$tmp/old.pid")"
  reset_services shop-test-old
  SHOP_SERVICES="shop-test-old:$old shop-test-new:$new" FAKE_APT_START_PORT=$new \
    FAKE_APT_ENABLE="shop-test-old shop-test-new" apt_install redis-server 2>/dev/null
  if grep -qx 'policy exit 101' "$tmp/apt.log"; then ok "policy-rc.d forbids starts during the install"
  else fail "policy-rc.d during the install: $(grep policy "$tmp/apt.log")"; fi
  if [ ! -e "$tmp/policy-rc.d" ]; then ok "policy-rc.d removed after the install"
  else fail "policy-rc.d left behind"; fi
  if wait_closed "$new"; then ok "the service the install started is stopped"
  else fail "the service the install started still answers on $new"; fi
  if port_open "$old"; then ok "the service that ran before is left running"
  else fail "the service that ran before the install was stopped"; fi
  if [ "$(boot_state shop-test-new)" = no ]; then ok "without systemd, the service the install enabled is disabled (systemd's unit and SysV links)"
  else fail "without systemd, the service the install enabled still starts at boot: $(boot_state shop-test-new)"; fi
  if [ "$(boot_state shop-test-old)" = "systemd sysv" ] && ! grep -q shop-test-old "$tmp/services.log"; then
    ok "without systemd, the service enabled before the install is left enabled"
  else fail "without systemd, the service enabled before: $(boot_state shop-test-old), $(tr '\n' ';' <"$tmp/services.log")"; fi
}

# With systemd, a service runs when systemctl says so; one the install
# started and enabled is stopped and disabled with systemctl, and one that
# ran and was enabled before is left alone.
test_install_systemd() {
  reset_services shop-test-old
  SHOP_INIT_SYSTEM=systemd SHOP_SERVICES="shop-test-old:1 shop-test-new:1" FAKE_APT_START="shop-test-old shop-test-new" \
    FAKE_APT_ENABLE="shop-test-old shop-test-new" apt_install redis-server 2>/dev/null
  if grep -qx 'systemctl stop shop-test-new' "$tmp/services.log" && [ ! -e "$tmp/systemd/shop-test-new.active" ] &&
    [ "$(boot_state shop-test-new)" = no ]; then
    ok "with systemd, the service the install started and enabled is stopped and disabled"
  else fail "with systemd, the new service: $(boot_state shop-test-new), log: $(tr '\n' ';' <"$tmp/services.log")"; fi
  if [ -e "$tmp/systemd/shop-test-old.active" ] && [ "$(boot_state shop-test-old)" = "systemd sysv" ] &&
    ! grep -q shop-test-old "$tmp/services.log"; then
    ok "with systemd, the service that ran and was enabled before is left alone"
  else fail "with systemd, the old service: $(boot_state shop-test-old), log: $(tr '\n' ';' <"$tmp/services.log")"; fi
}

# As a user (not root), an install runs each step that needs root through
# sudo, which passes no environment: apt-get still sees DEBIAN_FRONTEND, the
# policy-rc.d is in place and removed, and the new service disabled.
# Without sudo it fails, naming what to do, and installs nothing.
test_install_as_user() {
  local rc=0 out
  reset_services
  FAKE_UID=1000 SHOP_SERVICES="shop-test-new:1" FAKE_APT_ENABLE=shop-test-new apt_install redis-server 2>/dev/null || rc=$?
  if [ $rc -eq 0 ] && grep -qx 'apt-get install -y -qq --no-install-recommends redis-server (sudo)' "$tmp/apt.log" &&
    grep -qx 'frontend noninteractive' "$tmp/apt.log" && grep -qx 'policy exit 101' "$tmp/apt.log" &&
    grep -qx "sudo tee $tmp/policy-rc.d" "$tmp/sudo.log" && grep -qx "sudo rm -f $tmp/policy-rc.d" "$tmp/sudo.log" &&
    [ ! -e "$tmp/policy-rc.d" ]; then
    ok "as a user, apt-get runs through sudo with DEBIAN_FRONTEND, the policy-rc.d in place and removed after"
  else fail "as a user: exit $rc, apt-get: $(tr '\n' ';' <"$tmp/apt.log") sudo: $(tr '\n' ';' <"$tmp/sudo.log")"; fi
  if [ "$(boot_state shop-test-new)" = no ] && grep -qx 'systemctl disable shop-test-new (sudo)' "$tmp/services.log"; then
    ok "as a user, the service the install enabled is disabled through sudo"
  else fail "as a user, the new service: $(boot_state shop-test-new), log: $(tr '\n' ';' <"$tmp/services.log")"; fi
  reset_services
  mv "$tmp/bin/sudo" "$tmp/sudo.aside"
  hash -r # bash remembers where it found sudo
  rc=0
  out=$(FAKE_UID=1000 SHOP_SERVICES= apt_install redis-server 2>&1) || rc=$?
  mv "$tmp/sudo.aside" "$tmp/bin/sudo"
  hash -r
  if [ $rc -ne 0 ] && grep -qF 'installing redis-server needs root: run as root, or install sudo' <<<"$out" &&
    [ ! -s "$tmp/apt.log" ]; then
    ok "as a user without sudo, an install fails with a clear message and runs nothing"
  else fail "as a user without sudo: exit $rc, $out, apt-get: $(tr '\n' ';' <"$tmp/apt.log")"; fi
}

# kill_install: an install killed by SIGKILL, process group and all, while
# apt-get runs: no trap runs, and its policy-rc.d stays.
kill_install() {
  local pid i
  : >"$tmp/apt.log"
  SHOP_SERVICES= FAKE_APT_SLEEP=60 setsid bash -c '. scripts/lib.sh; apt_install redis-server' >/dev/null 2>&1 &
  pid=$!
  for i in $(seq 1 100); do grep -q '^apt-get install' "$tmp/apt.log" && break; sleep 0.1; done
  kill -9 -- "-$pid"
  wait "$pid" 2>/dev/null || true
}

# A policy-rc.d that a killed install left behind is removed by the next
# run (ensure_deps, even when nothing is missing), and replaced and removed
# by the next install; one of an install still running is left alone.
test_killed_install() {
  kill_install
  if [ -f "$tmp/policy-rc.d" ] && grep -qF "$policy_marker" "$tmp/policy-rc.d"; then
    ok "an install killed with SIGKILL leaves its policy-rc.d behind (so the next run has to remove it)"
  else fail "an install killed with SIGKILL left no policy-rc.d: the test cannot tell the next run's removal"; fi
  SHOP_SERVICES= ensure_deps 2>/dev/null
  if [ ! -e "$tmp/policy-rc.d" ]; then ok "the next run removes the policy-rc.d of a killed install"
  else fail "the next run kept the policy-rc.d of a killed install: $(cat "$tmp/policy-rc.d")"; fi

  kill_install
  : >"$tmp/apt.log"
  SHOP_SERVICES= apt_install redis-server 2>/dev/null
  if grep -qx 'policy exit 101' "$tmp/apt.log" && [ ! -e "$tmp/policy-rc.d" ]; then
    ok "the next install replaces the policy-rc.d of a killed install and removes it after"
  else fail "the next install after a killed one: $(grep policy "$tmp/apt.log"), left: $([ -e "$tmp/policy-rc.d" ] && echo yes || echo no)"; fi

  printf '#!/bin/sh\n%s (pid %s)\nexit 101\n' "$policy_marker" "$$" >"$tmp/policy-rc.d"
  chmod +x "$tmp/policy-rc.d"
  SHOP_SERVICES= ensure_deps 2>/dev/null
  if [ -e "$tmp/policy-rc.d" ]; then ok "the policy-rc.d of an install still running is left alone"
  else fail "the policy-rc.d of an install still running was removed"; fi
  rm -f "$tmp/policy-rc.d"
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
  own "$1" "$(cat "$tmp/$1.pid")"
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

# The Go version go.mod names, and a fake go that says it is
# FAKE_GO_VERSION and logs what it was asked.
go_want=$(sed -n 's/^go //p' go.mod)
go_refusal="error: shop needs Go >= $go_want (go.mod), found go1.22.1; install a newer Go from https://go.dev/dl"
mkdir -p "$tmp/go"
cat >"$tmp/go/go" <<EOF
#!/usr/bin/env bash
echo "GOTOOLCHAIN=\${GOTOOLCHAIN:-} \$*" >>"$tmp/go.log"
[ "\$1" = version ] || { echo "fake go: \$*" >&2; exit 3; }
echo "go version \${FAKE_GO_VERSION:-go1.22.1} linux/amd64"
EOF
chmod +x "$tmp/go/go"

# ensure_go takes a go at least as new as go.mod's go line and refuses an
# older one, or none, naming both versions.
test_go_version() {
  local v want rc out
  for v in "$go_want:yes" go1.26.10:yes go1.27.0:yes "devel go1.27-0123abc:yes" go1.26.7:no go1.26rc2:no go1.22.1:no; do
    want=${v##*:} v=${v%:*} rc=0
    out=$(PATH="$tmp/go:$PATH" FAKE_GO_VERSION=$v bash -c '. scripts/lib.sh; ensure_go' 2>&1) || rc=$?
    if { [ "$want" = yes ] && [ $rc -eq 0 ]; } ||
      { [ "$want" = no ] && [ $rc -ne 0 ] && [ "$out" = "error: shop needs Go >= $go_want (go.mod), found ${v#go version }; install a newer Go from https://go.dev/dl" ]; }; then
      ok "ensure_go with $v against go $go_want: $([ "$want" = yes ] && echo accepted || echo refused)"
    else fail "ensure_go with $v against go $go_want: exit $rc, $out"; fi
  done
  rc=0
  out=$(GO=$tmp/no-go bash -c '. scripts/lib.sh; ensure_go' 2>&1) || rc=$?
  if [ $rc -ne 0 ] && [ "$out" = "error: shop needs Go >= $go_want (go.mod), found none; install a newer Go from https://go.dev/dl" ]; then
    ok "ensure_go without go says so"
  else fail "ensure_go without go: exit $rc, $out"; fi
}

# Every entry script refuses an older go at once: it asks go its version,
# with GOTOOLCHAIN=local so that no toolchain is downloaded, and nothing
# else; it installs nothing and makes no state.
test_entry_scripts_check_go() {
  local cmd rc out
  for cmd in scripts/test.sh "scripts/stack.sh up" scripts/demo.sh scripts/bench-orders.sh scripts/loadtest.sh \
    "${real_make:-make} build"; do
    : >"$tmp/go.log"
    : >"$tmp/apt.log"
    rc=0
    out=$(PATH="$tmp/go:$PATH" SHOP_STATE="$tmp/go-state" SHOP_SERVICES= SHOP_TEST_FLEET=0 \
      timeout 600 env -u GOTOOLCHAIN $cmd 2>&1 </dev/null) || rc=$?
    if [ $rc -ne 0 ] && grep -qxF "$go_refusal" <<<"$out" && [ "$(sort -u "$tmp/go.log")" = "GOTOOLCHAIN=local version" ] &&
      [ ! -s "$tmp/apt.log" ] && [ ! -e "$tmp/go-state" ]; then
      ok "$cmd refuses go1.22.1 first, naming go.mod's $go_want"
    else fail "$cmd with go1.22.1: exit $rc, go asked: $(tr '\n' ';' <"$tmp/go.log") state: $([ -e "$tmp/go-state" ] && echo made || echo none), said: $(tail -3 <<<"$out" | tr '\n' ';')"; fi
    rm -rf "$tmp/go-state"
  done
}

# stack.sh uses and removes only a state directory it made: a SHOP_STATE
# that exists without its marker (here with a ports.env, as a stack's has)
# is refused by every command, through make demo and bench-orders too, and
# left as it was; down and status make no directory.
test_state_marker() {
  local dir=$tmp/precious cmd rc out listing
  mkdir -p "$dir/sub"
  echo keep >"$dir/file"
  echo MYSQL_PORT=1 >"$dir/ports.env"
  listing=$(ls -AR "$dir")
  for cmd in "scripts/stack.sh down" "scripts/stack.sh status" "scripts/stack.sh redis-up" "scripts/stack.sh shop verify" \
    scripts/demo.sh scripts/bench-orders.sh; do
    rc=0
    out=$(SHOP_STATE=$dir NGINX_PORT=0 $cmd 2>&1 </dev/null) || rc=$?
    if [ $rc -ne 0 ] && grep -qF "SHOP_STATE=$dir was not made by scripts/stack.sh (no .shop-stack in it)" <<<"$out" &&
      [ "$(ls -AR "$dir")" = "$listing" ] && [ "$(cat "$dir/file")" = keep ]; then
      ok "$cmd refuses a SHOP_STATE it did not make and leaves it as it was"
    else fail "$cmd on a SHOP_STATE it did not make: exit $rc, $([ -d "$dir" ] && echo "left: $(ls -A "$dir" | xargs)" || echo removed), said: $(tail -2 <<<"$out" | tr '\n' ';')"; fi
    [ -d "$dir" ] || { mkdir -p "$dir/sub"; echo keep >"$dir/file"; echo MYSQL_PORT=1 >"$dir/ports.env"; }
  done
  rc=0
  SHOP_STATE=$tmp/none scripts/stack.sh down 2>/dev/null || rc=$?
  SHOP_STATE=$tmp/none scripts/stack.sh status >/dev/null || rc=$?
  if [ $rc -eq 0 ] && [ ! -e "$tmp/none" ]; then ok "stack.sh down and status on no stack succeed and make no directory"
  else fail "stack.sh down and status on no stack: exit $rc, made: $([ -e "$tmp/none" ] && echo yes || echo no)"; fi
}

# start_foreign PORT NAME starts a redis-server on PORT that no script of
# ours started (pid in $tmp/NAME.pid, recorded for cleanup) and prints its
# pid.
start_foreign() {
  local i
  "$redis" --port "$1" --bind 127.0.0.1 --save '' --daemonize yes --pidfile "$tmp/$2.pid" \
    --logfile "$tmp/$2.log" >/dev/null
  for i in $(seq 1 100); do [ -s "$tmp/$2.pid" ] && port_open "$1" && break; sleep 0.1; done
  own "$2" "$(cat "$tmp/$2.pid")"
  cat "$tmp/$2.pid"
}

# start_sleeper NAME starts a process that listens nowhere (pid in
# $tmp/NAME.pid, recorded for cleanup) and prints its pid.
start_sleeper() {
  (sleep 60 </dev/null >/dev/null 2>&1 & echo $! >"$tmp/$1.pid")
  own "$1" "$(cat "$tmp/$1.pid")"
  cat "$tmp/$1.pid"
}

# kill_pidfile FILE PORT kills the process of FILE (SIGKILL) and waits until
# PORT is closed.
kill_pidfile() {
  kill -9 "$(cat "$1")" 2>/dev/null || true
  wait_closed "$2" || die "port $2 still answers after SIGKILL"
}

# wait_port with a pid waits for that process's own listener: another
# process on the port does not do. start_redis refuses a port another
# process holds, naming it.
test_foreign_listener() {
  local port fpid other rc=0 out
  port=$(free_port)
  fpid=$(start_foreign "$port" foreign1)
  other=$(start_sleeper sleeper)
  if wait_port "$port" 1 "$other"; then fail "wait_port PORT 1 PID took another process's listener on $port for PID's"
  else ok "wait_port PORT SECONDS PID does not take another process's listener for PID's"; fi
  if wait_port "$port" 1 "$fpid"; then ok "wait_port PORT SECONDS PID takes PID's own listener"
  else fail "wait_port PORT 1 PID did not find PID $fpid listening on $port"; fi
  out=$(start_redis "$tmp/mine" "$port" 2>&1) || rc=$?
  if [ $rc -ne 0 ] && grep -qF "port $port, for Redis in $tmp/mine, is held by pid $fpid (redis-server)" <<<"$out" &&
    pid_alive "$fpid"; then
    ok "start_redis on a port another redis-server holds fails, naming that process"
  else fail "start_redis on a port another redis-server holds: exit $rc, $out"; fi
}

# stack.sh does not take a foreign server on a saved port for its own.
# redis-up (whose caller reads the ports after it) moves a Redis master
# whose port another redis-server took to a new port; a live process that
# got a server's pid is not taken for the server; restart-redis, which must
# keep the ports, fails naming the port and the process.
test_stack_foreign_listener() {
  local st=$tmp/stack-ports out p0 p1 n0 n1 fpid reused rc=0 before
  export SHOP_STATE=$st NGINX_PORT=0
  scripts/stack.sh redis-up >/dev/null 2>"$tmp/stack.log" || cat "$tmp/stack.log"
  . "$st/ports.env"
  read -r p0 p1 _ <<<"$REDIS_PORTS"
  kill_pidfile "$st/redis0/pid" "$p0"
  fpid=$(start_foreign "$p0" foreign2)
  kill_pidfile "$st/redis1/pid" "$p1"
  reused=$(start_sleeper reused)
  echo "$reused" >"$st/redis1/pid"
  out=$(scripts/stack.sh redis-up 2>"$tmp/stack.log") || cat "$tmp/stack.log"
  . "$st/ports.env"
  read -r n0 n1 _ <<<"$REDIS_PORTS"
  if [ "$out" = "SHOP_REDIS_ADDR=127.0.0.1:$n0" ] && [ "$n0" != "$p0" ] && pid_listens "$(cat "$st/redis0/pid")" "$n0" &&
    grep -qF "port $p0 of Redis master 0 is held by pid $fpid (redis-server)" "$tmp/stack.log" && pid_alive "$fpid"; then
    ok "stack.sh redis-up moves a Redis master whose saved port another redis-server took to a new port, and names it"
  else fail "stack.sh redis-up with a foreign redis-server on :$p0: $out, ports $REDIS_PORTS, $(tr '\n' ';' <"$tmp/stack.log")"; fi
  if [ "$n1" = "$p1" ] && [ "$(cat "$st/redis1/pid")" != "$reused" ] && pid_listens "$(cat "$st/redis1/pid")" "$p1" &&
    pid_alive "$reused"; then
    ok "stack.sh redis-up starts a server again whose pid another live process has, on its port, leaving that process be"
  else fail "stack.sh redis-up with redis1's pid taken: port $n1 (was $p1), pid $(cat "$st/redis1/pid") (taken: $reused)"; fi

  kill_pidfile "$st/redis0/pid" "$n0"
  fpid=$(start_foreign "$n0" foreign3)
  before=$(cat "$st/ports.env")
  scripts/stack.sh restart-redis 2>"$tmp/stack.log" || rc=$?
  if [ $rc -ne 0 ] && grep -qF "port $n0 of Redis master 0 (saved in $st/ports.env) is held by pid $fpid (redis-server), not by this stack" "$tmp/stack.log" &&
    pid_alive "$fpid" && [ "$(cat "$st/ports.env")" = "$before" ]; then
    ok "stack.sh restart-redis fails, naming the port and the process, when another redis-server holds the master's port"
  else fail "stack.sh restart-redis with a foreign redis-server on :$n0: exit $rc, $(tr '\n' ';' <"$tmp/stack.log")"; fi
  scripts/stack.sh down >/dev/null 2>&1
  unset SHOP_STATE NGINX_PORT
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
  # Read whole: grep -q stops reading at its match, and status, writing
  # the lines after it, would die of SIGPIPE (a failed pipeline, pipefail).
  out=$(scripts/stack.sh status)
  if grep -q "^Redis topology: cluster (SHOP_REDIS_ADDR=127.0.0.1:$first," <<<"$out"; then
    ok "the topology is kept in the state: stack.sh status, without REDIS_TOPOLOGY, names the Cluster"
  else fail "the topology was not kept: $(grep topology <<<"$out")"; fi

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

# stripe_get BASE PATH prints the status of GET PATH at BASE
# (http://127.0.0.1:PORT) with stripe-mock's test key, or 000 when nothing
# answers.
stripe_get() {
  local port=${1##*:} code=000 fd
  if { exec {fd}<>"/dev/tcp/127.0.0.1/$port"; } 2>/dev/null; then
    printf 'GET %s HTTP/1.0\r\nHost: 127.0.0.1\r\nAuthorization: Bearer sk_test_123\r\n\r\n' "$2" >&"$fd"
    read -r -t 5 _ code _ <&"$fd" || code=000
    exec {fd}>&-
  fi
  echo "$code"
}

# webhook_secret_ok SECRET tells whether SECRET is whsec_ and 32 bytes in
# standard base64.
webhook_secret_ok() {
  [[ $1 =~ ^whsec_[A-Za-z0-9+/]{43}=$ ]] && [ "$(printf '%s' "${1#whsec_}" | base64 -d | wc -c)" -eq 32 ]
}

# ensure_stripe_mock installs stripe-mock of the scripts' version once,
# replaces another build, and leaves its own alone. start_stripe runs it on
# the ports given, its HTTPS on a loopback port of the kernel's choice (not
# its fixed 12112 on every interface), with the recording proxy in front
# of it where the tree has one; stop_stripe stops them.
test_stripe_mock() {
  local dir=$tmp/tools out bin before port rport base pid
  out=$(SHOP_TOOLS_DIR=$dir ensure_stripe_mock 2>"$tmp/install.log") || cat "$tmp/install.log"
  bin=$dir/stripe-mock
  if [ "$out" = "$bin" ] && [ "$(module_version "$bin")" = "$stripe_mock_version" ] &&
    grep -qF "installing stripe-mock $stripe_mock_version into $dir" "$tmp/install.log"; then
    ok "ensure_stripe_mock installs stripe-mock $stripe_mock_version with go install"
  else fail "ensure_stripe_mock: printed $out, version $(module_version "$bin"), said $(tr '\n' ';' <"$tmp/install.log")"; fi
  before=$(ls -i "$bin")
  out=$(SHOP_TOOLS_DIR=$dir ensure_stripe_mock 2>"$tmp/install.log")
  if [ "$out" = "$bin" ] && [ ! -s "$tmp/install.log" ] && [ "$(ls -i "$bin")" = "$before" ]; then
    ok "ensure_stripe_mock leaves an installed stripe-mock of its version alone"
  else fail "ensure_stripe_mock installed again: $(tr '\n' ';' <"$tmp/install.log")"; fi
  printf '#!/bin/sh\necho another build\n' >"$bin"
  out=$(SHOP_TOOLS_DIR=$dir ensure_stripe_mock 2>"$tmp/install.log")
  if [ "$(module_version "$bin")" = "$stripe_mock_version" ] && grep -qF installing "$tmp/install.log"; then
    ok "ensure_stripe_mock replaces a stripe-mock of another build"
  else fail "ensure_stripe_mock kept another build: version $(module_version "$bin"), said $(tr '\n' ';' <"$tmp/install.log")"; fi

  port=$(free_port)
  rport=$(free_port_except " $port ")
  SHOP_TOOLS_DIR=$dir start_stripe "$tmp/stripe" "$port" "$rport" 2>"$tmp/stripe.log" || cat "$tmp/stripe.log"
  pid=$(cat "$tmp/stripe/mock/pid")
  base=$(stripe_api_base "$port" "$rport")
  if [ "$(stripe_get "http://127.0.0.1:$port" /v1/charges)" = 200 ] && [ "$(stripe_get "$base" /v1/charges)" = 200 ] &&
    stripe_running "$tmp/stripe" "$port" "$rport" && ! pid_listens "$pid" 12112; then
    ok "start_stripe runs stripe-mock on the port given, answering Stripe's API at stripe_api_base, and not on the fixed 12112"
  else fail "start_stripe: stripe-mock answers $(stripe_get "http://127.0.0.1:$port" /v1/charges), $base answers $(stripe_get "$base" /v1/charges), on 12112: $(pid_listens "$pid" 12112 && echo yes || echo no); $(tr '\n' ';' <"$tmp/stripe.log")"; fi
  if has_stripe_recorder; then
    if [ "$base" = "http://127.0.0.1:$rport" ] && [ "$(grep -c '/v1/charges' "$tmp/stripe/calls.jsonl" 2>/dev/null)" = 1 ]; then
      ok "the recording proxy in front of stripe-mock logs the call made through it, once"
    else fail "the recording proxy: base $base, log: $(cat "$tmp/stripe/calls.jsonl" 2>/dev/null | tr '\n' ';')"; fi
  elif [ "$base" = "http://127.0.0.1:$port" ]; then
    ok "without $stripe_recorder_src in the tree, Stripe's API is stripe-mock's own URL"
  else fail "without a recorder, stripe_api_base is $base; want stripe-mock's http://127.0.0.1:$port"; fi
  stop_stripe "$tmp/stripe"
  if wait_closed "$port" && wait_closed "$rport" && ! pid_alive "$pid"; then ok "stop_stripe stops stripe-mock and the recording proxy"
  else fail "stop_stripe left stripe-mock (pid $pid) or the proxy running"; fi
}

# fake_shop prints the path of a stand-in for bin/shop, built once: it
# answers 200 to every request on SHOP_HTTP_ADDR, as a ready replica's
# /readyz.
fake_shop() {
  if [ ! -x "$tmp/fakeshop/fakeshop" ]; then
    mkdir -p "$tmp/fakeshop"
    printf 'module fakeshop\n\ngo 1.22\n' >"$tmp/fakeshop/go.mod"
    cat >"$tmp/fakeshop/main.go" <<'EOF'
package main

import (
	"net/http"
	"os"
)

func main() {
	http.ListenAndServe(os.Getenv("SHOP_HTTP_ADDR"), http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
}
EOF
    (cd "$tmp/fakeshop" && go build -o fakeshop .) || die "cannot build the stand-in for bin/shop"
  fi
  echo "$tmp/fakeshop/fakeshop"
}

# replica_env I prints the environment of replica I of the stack in
# $SHOP_STATE, as the process has it.
replica_env() { tr '\0' '\n' <"/proc/$(cat "$SHOP_STATE/replica$1/pid")/environ"; }

# replica_var I NAME prints NAME's value in replica I's environment.
replica_var() { replica_env "$1" | sed -n "s/^$2=//p"; }

# scripts/stack.sh makes the payment providers' secrets once and keeps them
# in the state, a stack from before them included; every replica is given
# SHOP_PAYMENT_WEBHOOK_SECRET, and replicas given SHOP_PAYMENTS=stripe the
# Stripe settings, with stripe-mock started for them and answering at
# SHOP_STRIPE_API_BASE; down stops stripe-mock.
test_stack_payments() {
  local st=$tmp/stack-payments fake first i good=1 base mock rec
  export SHOP_STATE=$st NGINX_PORT=0
  fake=$(fake_shop)
  scripts/stack.sh redis-up >/dev/null 2>"$tmp/stack.log" || cat "$tmp/stack.log"
  . "$st/ports.env"
  first="$PAYMENT_WEBHOOK_SECRET $STRIPE_WEBHOOK_SECRET"
  scripts/stack.sh redis-up >/dev/null 2>"$tmp/stack.log" || cat "$tmp/stack.log"
  . "$st/ports.env"
  if webhook_secret_ok "$PAYMENT_WEBHOOK_SECRET" && webhook_secret_ok "$STRIPE_WEBHOOK_SECRET" &&
    [ "$PAYMENT_WEBHOOK_SECRET" != "$STRIPE_WEBHOOK_SECRET" ] && [ "$first" = "$PAYMENT_WEBHOOK_SECRET $STRIPE_WEBHOOK_SECRET" ]; then
    ok "stack.sh makes whsec_ secrets of 32 random bytes, one per provider, once, and keeps them in ports.env"
  else fail "stack.sh's secrets: first $first, then $PAYMENT_WEBHOOK_SECRET $STRIPE_WEBHOOK_SECRET"; fi

  grep -v -e _SECRET= -e ^STRIPE_ "$st/ports.env" >"$st/ports.old"
  mv "$st/ports.old" "$st/ports.env"
  scripts/stack.sh redis-up >/dev/null 2>"$tmp/stack.log" || cat "$tmp/stack.log"
  PAYMENT_WEBHOOK_SECRET= STRIPE_MOCK_PORT=
  . "$st/ports.env"
  first=$PAYMENT_WEBHOOK_SECRET
  scripts/stack.sh status >/dev/null
  . "$st/ports.env"
  if webhook_secret_ok "$PAYMENT_WEBHOOK_SECRET" && [ "$PAYMENT_WEBHOOK_SECRET" = "$first" ] && [ -n "$STRIPE_MOCK_PORT" ] &&
    [ -n "$STRIPE_RECORDER_PORT" ] && [ "$STRIPE_MOCK_PORT" != "$STRIPE_RECORDER_PORT" ]; then
    ok "a stack from before the secrets gets them, and stripe-mock's ports, once"
  else fail "a stack from before the secrets: secret $PAYMENT_WEBHOOK_SECRET (then $first), stripe-mock ports $STRIPE_MOCK_PORT $STRIPE_RECORDER_PORT"; fi

  scripts/stack.sh replicas 2 SHOP_BINARY="$fake" SHOP_PAYMENTS=stripe >/dev/null 2>"$tmp/stack.log" || cat "$tmp/stack.log"
  base=$(replica_var 1 SHOP_STRIPE_API_BASE)
  for i in 1 2; do
    [ "$(replica_var "$i" SHOP_PAYMENT_WEBHOOK_SECRET)" = "$PAYMENT_WEBHOOK_SECRET" ] &&
      [ "$(replica_var "$i" SHOP_PAYMENTS)" = stripe ] && [ "$(replica_var "$i" SHOP_STRIPE_API_BASE)" = "$base" ] &&
      [ "$(replica_var "$i" SHOP_STRIPE_SECRET_KEY)" = sk_test_123 ] &&
      [ "$(replica_var "$i" SHOP_STRIPE_WEBHOOK_SECRET)" = "$STRIPE_WEBHOOK_SECRET" ] || good=
  done
  if [ -n "$good" ] && [ "$base" = "$(stripe_api_base "$STRIPE_MOCK_PORT" "$STRIPE_RECORDER_PORT")" ] &&
    [ "$(stripe_get "$base" /v1/charges)" = 200 ] && serving "$st/stripe/mock" "$STRIPE_MOCK_PORT"; then
    ok "stack.sh replicas N SHOP_PAYMENTS=stripe starts stripe-mock and gives every replica the secrets and its URL"
  else fail "replicas with SHOP_PAYMENTS=stripe: $base answers $(stripe_get "$base" /v1/charges); replica 1: $(replica_env 1 | grep -e PAYMENT -e STRIPE | tr '\n' ' ')"; fi

  scripts/stack.sh replicas 1 SHOP_BINARY="$fake" >/dev/null 2>"$tmp/stack.log" || cat "$tmp/stack.log"
  if [ "$(replica_var 1 SHOP_PAYMENT_WEBHOOK_SECRET)" = "$PAYMENT_WEBHOOK_SECRET" ] && [ -z "$(replica_var 1 SHOP_PAYMENTS)" ] &&
    ! replica_env 1 | grep -q '^SHOP_STRIPE_'; then
    ok "replicas without SHOP_PAYMENTS get the webhook secret and no Stripe settings"
  else fail "replicas without SHOP_PAYMENTS: $(replica_env 1 | grep -e PAYMENT -e STRIPE | tr '\n' ' ')"; fi

  cp "$fake" "$fake.two"
  scripts/stack.sh replicas 2 SHOP_BINARY="$fake" 2:SHOP_BINARY="$fake.two" 2:SHOP_ONLY_TWO=yes >/dev/null 2>"$tmp/stack.log" ||
    cat "$tmp/stack.log"
  if [ "$(readlink "/proc/$(cat "$st/replica1/pid")/exe")" = "$fake" ] && [ "$(readlink "/proc/$(cat "$st/replica2/pid")/exe")" = "$fake.two" ] &&
    [ "$(replica_var 2 SHOP_ONLY_TWO)" = yes ] && [ -z "$(replica_var 1 SHOP_ONLY_TWO)" ] && ! replica_env 1 | grep -q '^2:'; then
    ok "a replica setting written I:VAR=VALUE is replica I's alone, SHOP_BINARY included"
  else fail "I:VAR=VALUE: replica 1 runs $(readlink "/proc/$(cat "$st/replica1/pid")/exe") with $(replica_env 1 | grep -e ONLY -e '^2:' | tr '\n' ' '), replica 2 $(readlink "/proc/$(cat "$st/replica2/pid")/exe") with SHOP_ONLY_TWO=$(replica_var 2 SHOP_ONLY_TWO)"; fi

  mock=$STRIPE_MOCK_PORT rec=$STRIPE_RECORDER_PORT
  scripts/stack.sh down >/dev/null 2>&1
  if [ ! -e "$st" ] && wait_closed "$mock" && wait_closed "$rec"; then ok "stack.sh down stops stripe-mock and its recording proxy"
  else fail "stack.sh down left stripe-mock (:$mock) or its proxy (:$rec) running, or the state behind"; fi
  unset SHOP_STATE NGINX_PORT
}

# HAProxy accepts the configuration the stack writes for the Galera
# cluster, and it names one writer, the others backups, each with its agent.
test_haproxy_cfg() {
  local cfg=$tmp/haproxy.cfg out
  write_haproxy_cfg "$cfg" 10001 10002 10011:10021 10012:10022 10013:10023
  if out=$("$(find_bin haproxy)" -c -q -f "$cfg" 2>&1) &&
    grep -qx '  server n0 127.0.0.1:10011 agent-port 10021' "$cfg" &&
    grep -qx '  server n1 127.0.0.1:10012 agent-port 10022 backup' "$cfg" &&
    grep -qx '  server n2 127.0.0.1:10013 agent-port 10023 backup' "$cfg" &&
    grep -q 'agent-check .*on-marked-down shutdown-sessions on-marked-up shutdown-backup-sessions' "$cfg"; then
    ok "haproxy -c accepts the Galera cluster's configuration: n0 the writer, n1 and n2 backups, each with its agent"
  else fail "the HAProxy configuration: $out; $(tr '\n' ';' <"$cfg")"; fi
}

# galera_pids DIR prints the pids the stack recorded for the Galera nodes,
# their agents and HAProxy, one a line.
galera_pids() { cat "$1"/galera/nodes/n?/pid "$1"/galera/agent?/pid "$1"/galera/haproxy/pid 2>/dev/null || true; }

# One Galera stack for its cases, in a directory mysql cannot traverse (the
# test's mktemp directory, 0700), as make test's would be: db-up brings up
# three Synced nodes behind HAProxy, which sends to n0, and points MYSQL_PORT
# at HAProxy; kill-db-writer moves the writer and brings the node back
# Synced through IST; down leaves nothing running.
test_stack_galera() {
  local st=$tmp/stack-galera out i ok_nodes=0 old_pid pids nodes stand_in
  export SHOP_STATE=$st
  out=$(DB_TOPOLOGY=galera scripts/stack.sh db-up 2>"$tmp/galera.log") || cat "$tmp/galera.log"
  . "$st/ports.env"
  read -r -a dbp <<<"$DB_NODE_PORTS"
  for i in 0 1 2; do [ "$(galera_state "${dbp[$i]}")" = "4 Primary ON" ] && ok_nodes=$((ok_nodes + 1)); done
  if [ "$ok_nodes" = 3 ] && [ "$MYSQL_PORT" = "$HAPROXY_PORT" ] && [ "$out" = "SHOP_MYSQL_DSN=root@tcp(127.0.0.1:$HAPROXY_PORT)/shop?parseTime=true" ] &&
    [ "$(scripts/stack.sh db-writer)" = 0 ] && [ "$(scripts/stack.sh shop verify 2>&1 | tail -1)" = "verdict: all invariants hold" ]; then
    ok "DB_TOPOLOGY=galera stack.sh db-up: three Synced nodes behind HAProxy on MYSQL_PORT, new connections reach n0, shop verify passes through it"
  else fail "galera db-up: $out, $ok_nodes nodes Synced, MYSQL_PORT $MYSQL_PORT, HAProxy $HAPROXY_PORT; $(tail -5 "$tmp/galera.log" | tr '\n' ';')"; fi

  nodes=$(readlink -f "$st/galera/nodes")
  old_pid=$(cat "$nodes/n0/pid")
  scripts/stack.sh kill-db-writer 2>"$tmp/galera.log" || cat "$tmp/galera.log"
  # Fed by the node that did not take the writes: a donor is desynced
  # while it sends, and HAProxy would move the writes away from it.
  stand_in=$(sed -n 's/^==> the writer n0 killed; new connections reach \(n[12]\) after [0-9.]* s$/\1/p' "$tmp/galera.log")
  if [ -n "$stand_in" ] &&
    grep -q "^==> n0 started again on its data: Synced after [0-9.]* s (IST from n[12])$" "$tmp/galera.log" &&
    ! grep -q "(IST from $stand_in)$" "$tmp/galera.log" &&
    [ "$(cat "$nodes/n0/pid")" != "$old_pid" ] && ! pid_alive "$old_pid" && [ "$(galera_state "${dbp[0]}")" = "4 Primary ON" ] &&
    [ "$(scripts/stack.sh db-writer)" = 0 ]; then
    ok "stack.sh kill-db-writer: another node takes the writes, the killed one comes back Synced through IST from the third node and HAProxy sends to it again"
  else fail "kill-db-writer: $(tr '\n' ';' <"$tmp/galera.log") n0 is $(galera_state "${dbp[0]}")"; fi

  pids=$(galera_pids "$st")
  scripts/stack.sh down >/dev/null 2>&1
  local left=
  for i in $pids; do pid_alive "$i" && left+=" $i"; done
  if [ -z "$left" ] && [ ! -e "$st" ] && [ ! -e "$nodes" ]; then ok "stack.sh down stops the Galera nodes, their agents and HAProxy, and removes the nodes' directory"
  else fail "stack.sh down left pids$left running, or $st or $nodes behind"; fi
  unset SHOP_STATE
}

# scripts/lib_test.sh [TEST...] runs the tests named, or all.
tests=(
  test_go_version
  test_entry_scripts_check_go
  test_state_marker
  test_foreign_listener
  test_stack_foreign_listener
  test_install_starts_nothing
  test_install_systemd
  test_install_as_user
  test_killed_install
  test_failed_install
  test_existing_policy_kept
  test_race_installs_a_compiler
  test_ci_run_without_make
  test_stop_pidfile
  test_pid_alive_gone
  test_stack_topologies
  test_stripe_mock
  test_stack_payments
  test_haproxy_cfg
  test_stack_galera
)
[ $# -eq 0 ] || tests=("$@")
for t in "${tests[@]}"; do "$t"; done

echo "scripts/lib_test.sh: $passed passed, $failed failed"
[ $failed -eq 0 ]
