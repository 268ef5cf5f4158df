.PHONY: test build clean

GO ?= go

build:
	$(GO) build -o bin/shop ./cmd/shop

## test: the whole suite against private MariaDB and Redis (installed if missing)
test:
	scripts/test.sh

clean:
	rm -rf bin out
