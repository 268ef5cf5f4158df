package main

import (
	"flag"
	"os"
	"strconv"
	"testing"
)

// How the package's tests share the machine. Most of them wait far more
// than they compute: on replicas and nginx, on servers they start and stop,
// on the service's own timers (readiness grace, drains, retries, TTLs).
// They run in parallel, but for the few whose outcome depends on how fast
// the machine answers (rate limits, tight timeouts; each says so), which
// run first, one at a time. The tests that send crowds of orders through
// replicas, bound by the CPU (the race detector's most of all), take turns
// on top of that (crowded).

// testParallel is how many tests run at once unless -parallel says
// otherwise: its default, GOMAXPROCS, would run two at once on the two
// cores the suite runs on, and a test waiting for its turn in a crowd holds
// its place.
const testParallel = 8

// crowds admits one crowd of orders at a time. Two at once, on two cores
// shared with the other packages, made Redis round trips outlast their
// timeouts: lock leases ran out unrenewed and orders their budget (503
// busy), and the tests that count every answer failed.
var crowds = make(chan struct{}, 1)

// crowded waits for t's turn to send a crowd of orders, and holds it until
// t ends.
func crowded(t *testing.T) {
	t.Helper()
	crowds <- struct{}{}
	t.Cleanup(func() { <-crowds })
}

func TestMain(m *testing.M) {
	if os.Getenv(asShopEnv) == "1" {
		main()
	}
	flag.Parse()
	given := false
	flag.Visit(func(f *flag.Flag) { given = given || f.Name == "test.parallel" })
	if !given {
		flag.Set("test.parallel", strconv.Itoa(testParallel))
	}
	os.Exit(m.Run())
}
