.PHONY: test bench build clean

GO ?= go

build:
	$(GO) build -o bin/shop ./cmd/shop

## test: the whole suite against private MariaDB and Redis (installed if missing)
test:
	scripts/test.sh

## bench: the benchmarks (GET product from the cache vs MySQL), same servers
bench:
	scripts/test.sh bench

clean:
	rm -rf bin out
