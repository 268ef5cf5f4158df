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
# -sellout-buyers, -sellout-c, -tap-n; -only ceiling runs the ceiling's
# rows alone). The ceiling also measures GET /healthz through the orders'
# own client (hey and the load test's tap), where the CPU of each process
# goes, and how stale a product page another replica serves may be.
#
# Environment: SHOP_STATE (default .state/bench-edge), BENCH_OUT (default
# out/bench-edge).
set -euo pipefail
cd "$(dirname "$0")/.."
SHOP_STATE=${SHOP_STATE:-.state/bench-edge} DEMO_OUT=${BENCH_OUT:-out/bench-edge} \
  DEMO_MODE=-edge exec scripts/demo.sh "$@"
