#!/usr/bin/env bash
# make test: refuse a Go older than go.mod's go line at once, start private
# MariaDB and Redis on free loopback ports, run the whole suite with the
# race detector against them, then the lock experiment on a small fleet
# behind nginx (scripts/demo.sh), and stop every server however the tests
# end. TEST_PKGS narrows `go test` to some packages
# (default ./...); without it the tests of the scripts themselves
# (scripts/lib_test.sh) run first. `scripts/test.sh bench` (make bench)
# runs the benchmarks instead, `scripts/test.sh bench-lock` (make
# bench-lock) the lock comparison, and `scripts/test.sh bench-sweep` (make
# bench-sweep) the sweep of a sellout's lapsed reservations.
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

ensure_go
case ${1:-} in
  bench | bench-lock | bench-sweep) ensure_deps ;;
  *) ensure_deps race ;; # go test -race needs cgo, so a C compiler
esac
tmp=$(mktemp -d "${TMPDIR:-/tmp}/shop-test.XXXXXX")
cleanup() {
  if [ -n "${libtest:-}" ]; then kill "$libtest" 2>/dev/null || true; wait "$libtest" 2>/dev/null || true; fi
  stop_pidfile "$tmp/redis/pid"
  stop_redis_set "$tmp/redis-cluster"
  stop_redis_set "$tmp/redis-sentinel"
  stop_pidfile "$tmp/mariadb/pid" 30
  stop_pidfile "$tmp/mariadb-autoinc2/pid" 30
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# The tests of the scripts themselves spend most of their minute and a half
# waiting (drains, Sentinel failovers): they run beside the servers' start,
# the vets and the builds, on ports and in directories of their own, and
# are waited for before the Go tests.
if [ -z "${1:-}" ] && [ -z "${TEST_PKGS:-}" ]; then
  scripts/lib_test.sh >"$tmp/lib_test.log" 2>&1 &
  libtest=$!
fi

mysql_port=$(free_port)
# The main test server refuses a locking read of a row changed since the
# transaction's snapshot (error 1020), as MariaDB does by default from
# 11.6.2 on; `loose-` leaves a server without the variable (MySQL) as it is.
SHOP_INNODB_FLUSH=2 start_mariadb "$tmp/mariadb" "$mysql_port" --loose-innodb-snapshot-isolation=ON
redis_port=$(free_port)
start_redis "$tmp/redis" "$redis_port"
# Redis beyond one server, for the suites that run on every topology: a
# Cluster of three masters, and a master with a replica watched by three
# Sentinels. The benchmarks need the Cluster only (the Bloom filter's
# shards, BenchmarkBloomShards); the lock comparison and the sweep neither.
if [ "${1:-}" != bench-lock ] && [ "${1:-}" != bench-sweep ]; then
  mapfile -t ports < <(free_ports 8)
  start_redis_cluster "$tmp/redis-cluster" "${ports[@]:0:3}"
  export SHOP_TEST_REDIS_CLUSTER_ADDRS=127.0.0.1:${ports[0]},127.0.0.1:${ports[1]},127.0.0.1:${ports[2]}
fi
if [ "${1:-}" != bench ] && [ "${1:-}" != bench-lock ] && [ "${1:-}" != bench-sweep ]; then
  start_redis_sentinel "$tmp/redis-sentinel" shop "${ports[@]:3:5}"
  export SHOP_TEST_REDIS_SENTINEL_ADDRS=127.0.0.1:${ports[5]},127.0.0.1:${ports[6]},127.0.0.1:${ports[7]}
  export SHOP_TEST_REDIS_MASTER_NAME=shop
fi
# A second, small server with MySQL 8's default innodb_autoinc_lock_mode=2,
# where one multi-row INSERT's ids may interleave with another's.
autoinc2_port=$(free_port)
SHOP_INNODB_FLUSH=2 start_mariadb "$tmp/mariadb-autoinc2" "$autoinc2_port" \
  --innodb-autoinc-lock-mode=2 --innodb-buffer-pool-size=64M

export SHOP_TEST_MYSQL_DSN="root@tcp(127.0.0.1:$mysql_port)/?parseTime=true"
export SHOP_TEST_REDIS_ADDR="127.0.0.1:$redis_port"
export SHOP_TEST_MYSQL_AUTOINC2_DSN="root@tcp(127.0.0.1:$autoinc2_port)/?parseTime=true"
SHOP_TEST_REDIS_SERVER=$(find_bin redis-server)
export SHOP_TEST_REDIS_SERVER
# stripe-mock, which the payment tests start on ports of their own (with
# -https-addr 127.0.0.1:0, or each one's HTTPS takes the fixed port 12112),
# and the recording proxy that stands in front of it where the tree has it.
if [ "${1:-}" != bench-lock ] && [ "${1:-}" != bench-sweep ]; then
  SHOP_TEST_STRIPE_MOCK=$(ensure_stripe_mock)
  export SHOP_TEST_STRIPE_MOCK
  if has_stripe_recorder; then
    SHOP_TEST_STRIPE_RECORDER=$(build_stripe_recorder)
    export SHOP_TEST_STRIPE_RECORDER
  fi
fi

if [ "${1:-}" = bench ]; then
  # Not lockbench: its one benchmark is run once, by `make bench-lock`.
  go test -run '^$' -bench . -benchtime "${BENCHTIME:-30000x}" $(go list ./... | grep -v /lockbench)
  exit
fi
if [ "${1:-}" = bench-sweep ]; then
  SHOP_SWEEP_SELLOUT=1 go test -count=1 -v -run '^TestSweepSellout$' ./internal/stock
  exit
fi
if [ "${1:-}" = bench-lock ]; then
  go test -run '^$' -bench '^BenchmarkCompare$' -benchtime 1x -timeout 30m ./internal/lock/lockbench
  exit
fi
unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
[ -z "$unformatted" ] || die "not gofmt-ed: $unformatted"
go vet ./...
go vet -tags failpoints ./...
# The deployment files (deploy/k8s, docker-compose.yml), checked by the
# nested module deploy/ with kustomize, the Kubernetes API types and
# compose-go, which the service's own module does not carry. No servers.
[ -n "${TEST_PKGS:-}" ] || (cd deploy && go vet ./... && go test -count=1 ./...)
if [ -n "${libtest:-}" ]; then
  rc=0
  wait "$libtest" || rc=$?
  libtest=
  cat "$tmp/lib_test.log" >&2
  [ "$rc" = 0 ] || die "scripts/lib_test.sh failed (exit $rc)"
fi
# The packages whose tests take longest go first, so that the last minute
# is not one of them running alone on a core while the other waits.
pkgs=${TEST_PKGS:-}
if [ -z "$pkgs" ]; then
  slow="shop/cmd/shop shop/internal/stock shop/internal/cache shop/internal/handler shop/internal/lock shop/internal/verify shop/internal/testenv shop/internal/galeratest shop/internal/dbagent"
  pkgs="$slow $(go list ./... | grep -vxF -f <(printf '%s\n' $slow) | tr '\n' ' ')"
fi
go test -race -count=1 -timeout 15m ${GOTESTFLAGS:-} $pkgs
# The failpoints build (make demo's bin/shop-failpoints) has tests of its own.
[ -n "${TEST_PKGS:-}" ] || go test -race -count=1 -tags failpoints ./internal/failpoint/

# The fleet: nginx → three replicas → MariaDB and Redis, driven by hey and
# judged by shop verify, on a small catalog. SHOP_TEST_FLEET=0 skips it.
# The other lock families' rows, the Stripe rows (stripe-mock, and a
# killed refunder's lease waited out), the events row (a receiver down
# for 10 s, a killed relay's lease and the outbox's drain waited out; the
# relay's tests cover it here) and the Galera rows (a cluster of three
# started, and each row's failover and resync waited out; testenv's
# cluster covers them here) are left to make demo.
if [ "${SHOP_TEST_FLEET:-1}" != 0 ]; then
  log "the lock experiment on a small fleet behind nginx"
  SHOP_STATE="$tmp/stack" DEMO_OUT=out/test-fleet scripts/demo.sh -skus 200 -c 200 -ttl 300ms -pause 1s -hot-units 300 -hot-buyers 400 \
    -fault-after 1s -fault-span 6s -life-units 100 -life-buyers 200 -resale-buyers 150 -life-c 50 -pay-window 6s -stall 2s -families=false -stripe=false -events=false -galera=false
fi
