package testenv

import (
	"os"
	"sync"
	"testing"
)

// Shared is a server (an etcd cluster, a ZooKeeper ensemble) that the tests
// of one package share, rather than each starting its own: the first test
// that asks for it starts it, and the package's TestMain ends it after
// m.Run, with Close. The tests that share it keep to keys of their own, and
// a test that kills, pauses or restarts a server starts one of its own —
// except on a Galera cluster (StartGalera), whose For gives a test the
// cluster to fault and brings it back whole when the test ends: there the
// tests that fault it run one at a time (not in parallel with the others
// that share it). The zero value is ready to use.
type Shared[T any] struct {
	once    sync.Once
	v       T
	ok      bool // start returned
	skipped bool // start skipped the test that ran it
	cleanups
}

// Get returns the value that start returned for the first test that asked,
// calling start now if this is that test. start runs under tb, except that
// what it registers with Cleanup runs at Close, and what TempDir makes
// lasts until Close. It must not keep tb for later (a cluster's Kill or
// Restart reports to the test it was started by, which may have ended). A
// start that failed fails every test that asks, and one that skipped its
// test (a -short run without the server's binary) skips them.
func (s *Shared[T]) Get(tb testing.TB, start func(testing.TB) T) T {
	tb.Helper()
	s.once.Do(func() {
		defer func() { s.skipped = !s.ok && tb.Skipped() }()
		s.v = start(sharedTB{tb, &s.cleanups})
		s.ok = true
	})
	switch {
	case s.ok:
		return s.v
	case s.skipped:
		tb.Skip("the shared server was skipped: see the first test that asked for it")
	default:
		tb.Fatal("the shared server did not start: see the first test that asked for it")
	}
	return s.v
}

// cleanups are what the starts of a Shared registered, run by Close.
type cleanups struct {
	mu  sync.Mutex
	fns []func()
}

func (c *cleanups) add(f func()) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.fns = append(c.fns, f)
}

// Close ends what was started, last first, as a test's cleanups run. It
// does nothing if nothing was, and nothing the second time.
func (c *cleanups) Close() {
	c.mu.Lock()
	fns := c.fns
	c.fns = nil
	c.mu.Unlock()
	for i := len(fns) - 1; i >= 0; i-- {
		fns[i]()
	}
}

// sharedTB is the test that starts a Shared, with its cleanups and its
// temporary directories kept for Close.
type sharedTB struct {
	testing.TB
	c *cleanups
}

func (t sharedTB) Cleanup(f func()) { t.c.add(f) }

func (t sharedTB) TempDir() string {
	t.Helper()
	dir, err := os.MkdirTemp("", "shop-shared-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}
