package testenv

import (
	"os"
	"testing"
)

// Option changes how a private server is started.
type Option func(*options)

type options struct {
	tmpfs bool
}

// OnTmpfs puts a private server's data on tmpfs (/dev/shm), where an fsync
// costs nothing: a benchmark's control for what writing to disk costs a
// server that syncs every write, as etcd and ZooKeeper do. Where there is no
// /dev/shm the data stay in the test's temporary directory.
func OnTmpfs() Option { return func(o *options) { o.tmpfs = true } }

// dataDir returns the directory a private server keeps its data in, removed
// when the test ends.
func dataDir(tb testing.TB, opts []Option) string {
	tb.Helper()
	var o options
	for _, opt := range opts {
		opt(&o)
	}
	if !o.tmpfs {
		return tb.TempDir()
	}
	if st, err := os.Stat("/dev/shm"); err != nil || !st.IsDir() {
		return tb.TempDir()
	}
	dir, err := os.MkdirTemp("/dev/shm", "shop-test-")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	return dir
}
