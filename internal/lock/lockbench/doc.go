// Package lockbench holds only the side-by-side comparison of our Redis lock
// (shop/internal/lock) with two peer libraries, github.com/go-redsync/redsync
// and github.com/bsm/redislock, that `make bench-lock` runs.
//
// The comparison is one benchmark, BenchmarkCompare in compare_test.go, run
// once against a private redis-server. It measures, for every lock under the
// same lease length and wait budget: uncontended obtain+release (ns/op,
// allocs/op); 64 goroutines on one key (acquisitions/s, p50/p99 wait,
// timeouts); 64 goroutines over 5000 keys; and, for each, the Redis commands
// per acquisition (INFO commandstats, Lua-internal calls included) and client
// round trips per acquisition. It prints one table with an "ours ÷ best peer"
// line per scenario.
//
// The peers are imported by the test file only, so they are never linked
// into the shipped binary; this file exists so the directory is a package.
package lockbench
