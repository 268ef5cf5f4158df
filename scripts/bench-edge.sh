#!/usr/bin/env bash
# make bench-edge: the ceiling (GET /healthz, a cached product page, the
# hot SKU and the source articles' sellout, each as a share of the /healthz rate),
# then the buyers of a flash sale alone and under floods of public routes,
# and a bot farm behind one address, through nginx with the shipped
# defaults. The same private stack as make demo (scripts/demo.sh: installs
# what is missing, builds, starts it, stops it however the run ends),
# running `bin/demo -edge`. Extra arguments go to bin/demo -edge
# (-rounds, -units, -buyers, -c, -src-n, -flooders, -flood-for,
# -flood-src-n, -warm-up, -bots, -ceiling-for, -sellout-skus,
# -sellout-buyers, -sellout-c, -overload-buyers, -overload-units,
# -overload-c; -only ceiling runs the ceiling's rows alone). The ceiling
# also measures GET /healthz through the orders' own client (bin/loadtest
# -client direct, no proxy hop), sets that client beside hey through the
# load test's tap, each with its own CPU per request, runs an overload
# (60000 buyers of 5000 units, 3000 at once), says where the CPU of each
# process goes and how stale a product page another replica serves may
# be, and prints the goal table with a verdict per row.
#
# Environment: SHOP_STATE (default .state/bench-edge), BENCH_OUT (default
# out/bench-edge).
#
# Before the stack's run, slow clients (loadtest/slowbench): nginx from
# deploy/nginx.conf in front of a stand-in replica, the buyers' rate alone
# and while one address holds 2000 idle, 200 header-trickling and 50
# body-trickling connections, and their ratio (goal: at least 0.9×),
# written to $BENCH_OUT/slow-clients.md. BENCH_SLOW_CLIENTS=0 skips it.
set -euo pipefail
cd "$(dirname "$0")/.."

# slow_clients runs loadtest/slowbench and keeps its table.
slow_clients() {
  . scripts/lib.sh
  ensure_go
  local out=${BENCH_OUT:-out/bench-edge} nginx
  nginx=$(find_bin nginx) || die "nginx not found: make test or make demo installs it"
  mkdir -p "$out"
  go build -o bin/slowbench ./loadtest/slowbench
  log "slow clients: the buyers' rate through nginx alone and while one address holds slow connections"
  bin/slowbench -nginx "$nginx" | tee "$out/slow-clients.md"
}
[ "${BENCH_SLOW_CLIENTS:-1}" = 0 ] || slow_clients

SHOP_STATE=${SHOP_STATE:-.state/bench-edge} DEMO_OUT=${BENCH_OUT:-out/bench-edge} \
  DEMO_MODE=-edge exec scripts/demo.sh "$@"
