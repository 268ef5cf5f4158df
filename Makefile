.PHONY: build test bench bench-lock bench-sweep bench-orders bench-edge demo up down loadtest clean

GO ?= go

## build: bin/shop, bin/loadtest, bin/eventsink and bin/demo
build:
	@GO='$(GO)' bash -c '. scripts/lib.sh && ensure_go'
	$(GO) build -o bin/shop ./cmd/shop
	$(GO) build -o bin/loadtest ./loadtest
	$(GO) build -o bin/eventsink ./cmd/eventsink
	$(GO) build -o bin/demo ./cmd/demo

## test: the whole suite against private MariaDB and Redis, then a small fleet behind nginx (installed if missing)
test:
	scripts/test.sh

## bench: the benchmarks (GET product from the cache vs MySQL), same servers
bench:
	scripts/test.sh bench

## bench-lock: our Redis lock side by side with redsync and bsm/redislock on a private Redis; prints one table
bench-lock:
	scripts/test.sh bench-lock

## bench-sweep: the seeds' sellout lapsing unpaid (5000 one-unit reservations, pay_by at one instant) swept by three replicas' sweepers; how long until every unit is back, on private servers
bench-sweep:
	scripts/test.sh bench-sweep

## bench-orders: the order path side by side (hot SKU, sellout; lock-free, Redis lock, default batch, default with SHOP_AUTH=jwt, default with events on, grouped commits) on a private stack; one table
bench-orders:
	scripts/bench-orders.sh

## bench-edge: the ceiling (GET /healthz, a cached page, the hot SKU, the sellout, the overload; rates as shares of /healthz, the orders through bin/loadtest's own client and beside hey), the goal table with verdicts, with the CPU per request of each process and how stale a page may be, then hot-SKU buyers through nginx alone and under floods of public routes, and a bot farm behind one address, on a private stack
bench-edge:
	scripts/bench-edge.sh

## demo: the lock experiment on a private stack; prints the table, writes out/demo/report.{md,png}
demo:
	scripts/demo.sh

## up: the private stack (MariaDB, Redis, 3 replicas, nginx on http://127.0.0.1:8080), left running
up:
	scripts/stack.sh up

## down: stop the stack of make up
down:
	scripts/stack.sh down

## loadtest: sell-out scenario against BASE_URL (default http://127.0.0.1:8080), then shop verify
loadtest:
	scripts/loadtest.sh

clean:
	rm -rf bin out
