#!/usr/bin/env bash
# make bench-orders: the order path side by side in one run. The same private
# stack as make demo (scripts/demo.sh: installs what is missing, builds,
# starts it, stops it however the run ends), running `bin/demo -bench`,
# whose load goes straight to the replicas. Extra arguments go to
# bin/demo -bench (-rounds, -hot-units, -hot-buyers, -skus, -buyers, -c).
#
# Environment: SHOP_STATE (default .state/bench-orders), BENCH_OUT (default
# out/bench-orders).
set -euo pipefail
cd "$(dirname "$0")/.."
SHOP_STATE=${SHOP_STATE:-.state/bench-orders} DEMO_OUT=${BENCH_OUT:-out/bench-orders} \
  DEMO_MODE=-bench exec scripts/demo.sh "$@"
