#!/usr/bin/env bash
# make demo: from nothing to a verdict. Installs what is missing, builds,
# starts a private stack (MariaDB, Redis, 3 replicas, nginx on a free port),
# runs the lock experiment (bin/demo), and stops the stack however it ends.
# The Sentinel rows start a Redis master, its replica and three Sentinels
# when they come (REDIS_TOPOLOGY=sentinel scripts/stack.sh replicas ...):
# about 10 seconds that the other rows do not need; the etcd and ZooKeeper
# rows start a cluster of three of their own (seconds, once each); the
# Galera rows, the last, start three MariaDB nodes with Galera behind
# HAProxy (DB_TOPOLOGY=galera scripts/stack.sh replicas ...: about 20
# seconds, once) and leave the single MariaDB as it was.
# Extra arguments go to bin/demo (-skus, -buyers, -c, -ttl, -pause, ...).
# bin/demo signs its payment events with the stack's secrets
# (SHOP_PAYMENT_WEBHOOK_SECRET, and SHOP_STRIPE_WEBHOOK_SECRET for the
# Stripe rows), which scripts/stack.sh keeps in the state.
#
# Environment: SHOP_STATE (default .state/demo), DEMO_OUT (default out/demo),
# DEMO_MODE (-bench: make bench-orders, see scripts/bench-orders.sh; -edge:
# make bench-edge, see scripts/bench-edge.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/lib.sh

ensure_go
export SHOP_STATE=${SHOP_STATE:-.state/demo}
export NGINX_PORT=${NGINX_PORT:-0}
out=${DEMO_OUT:-out/demo}

cleanup() { scripts/stack.sh down || true; }
trap cleanup EXIT
trap 'exit 130' INT TERM

scripts/stack.sh down >/dev/null 2>&1 || true # a stack left by an interrupted run
scripts/stack.sh up >/dev/null
go build -o bin/demo ./cmd/demo
# The events row (and bench-orders' events configuration) deliver to it.
go build -o bin/eventsink ./cmd/eventsink
# The pause rows stop a lock holder at a failpoint: a binary of their own.
go build -tags failpoints -o bin/shop-failpoints ./cmd/shop
SHOP_PAYMENT_WEBHOOK_SECRET=$(stack_value "$SHOP_STATE" PAYMENT_WEBHOOK_SECRET)
SHOP_STRIPE_WEBHOOK_SECRET=$(stack_value "$SHOP_STATE" STRIPE_WEBHOOK_SECRET)
export SHOP_PAYMENT_WEBHOOK_SECRET SHOP_STRIPE_WEBHOOK_SECRET
bin/demo ${DEMO_MODE:-} -state "$SHOP_STATE" -out "$out" "$@"
