package lock_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-zookeeper/zk"

	"shop/internal/lock"
	"shop/internal/testenv"
)

// TestZooKeeper runs the ZooKeeper lock's tests on one private ensemble:
// starting three JVMs costs seconds of both cores. The cases that leave it
// be run first, at once — the conformance suite among them — and those
// that kill its servers last: the leader killed under a holder, then the
// whole ensemble (what is left of it) stopped and its three servers
// started again.
func TestZooKeeper(t *testing.T) {
	t.Parallel()
	ens := testenv.StartZooKeeper(t)
	t.Run("Shared", func(t *testing.T) {
		t.Run("Conformance", func(t *testing.T) {
			t.Parallel()
			conformance(t, zooKeeperFamily(ens))
		})
		t.Run("UncontendedObtainRelease", func(t *testing.T) {
			t.Parallel()
			testZooKeeperUncontended(t, ens)
		})
		t.Run("PausedHolderStaleWriteRefused", func(t *testing.T) {
			t.Parallel()
			testZooKeeperPausedHolder(t, ens)
		})
	})
	t.Run("LeaderFailoverMidHold", func(t *testing.T) { testZooKeeperFailover(t, ens) })
	t.Run("TokensAcrossRestart", func(t *testing.T) { testZooKeeperRestart(t, ens) })
}

// zooKeeperFamily is the ZooKeeper lock on ens as the conformance suite
// runs it. Each process has a session of its own, on connections the test
// can cut.
func zooKeeperFamily(ens *testenv.ZooKeeperEnsemble) family {
	return family{name: "zookeeper", claims: everything, woken: true, ttl: 2 * time.Second,
		servers: func(t *testing.T) func(*testing.T, settings) world {
			root := zkRoot()
			in := newInspector(t, ens)
			return func(t *testing.T, opt settings) world {
				return func() *handle {
					var g gate
					z := newZooKeeper(t, ens, lock.ZooKeeperOptions{Root: root, TTL: opt.TTL, Wait: opt.Wait}, zk.WithDialer(g.dial))
					return &handle{locker: z,
						crash: g.cut,
						// The process is cut off from the ensemble until the
						// server has expired its session (and deleted its
						// znode), and it has noticed.
						lose: func(t *testing.T, lease *lock.Lease) {
							g.cut()
							waitForLoss(t, lease)
							waitFor(t, "the server expires the session", func() bool {
								czxid, _, err := in.holderOf(root + "/" + url.PathEscape(lease.Key()))
								return err == nil && czxid != lease.Fence()
							})
							g.reopen()
						},
						holds: func(lease *lock.Lease) error {
							czxid, n, err := in.holderOf(root + "/" + url.PathEscape(lease.Key()))
							switch {
							case err != nil:
								return err
							case czxid != lease.Fence():
								return errHolds(lease, "the lowest of its %d contenders was created at %#x", n, czxid)
							}
							return nil
						},
					}
				}
			}
		}}
}

// zkRoot returns a root znode of the test's own.
func zkRoot() string { return "/test/" + testenv.Name() }

// newZooKeeper returns a ZooKeeper lock on ens, closed when the test ends.
func newZooKeeper(t *testing.T, ens *testenv.ZooKeeperEnsemble, opt lock.ZooKeeperOptions, connOpts ...func(*zk.Conn)) *lock.ZooKeeper {
	t.Helper()
	z, err := lock.DialZooKeeper(ens.Servers(), opt, connOpts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { z.Close() })
	return z
}

type quiet struct{}

func (quiet) Printf(string, ...any) {}

// inspector is a client of ens of the test's own, to look at the server's
// side of a lock.
type inspector struct{ c *zk.Conn }

func newInspector(t *testing.T, ens *testenv.ZooKeeperEnsemble) inspector {
	t.Helper()
	c, _, err := zk.Connect(ens.Servers(), 10*time.Second, zk.WithLogger(quiet{}))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(c.Close)
	return inspector{c}
}

// holder returns the czxid of the lowest contender under dir — the
// holder's fencing token — and how many contenders there are.
func (in inspector) holder(t *testing.T, dir string) (czxid int64, n int) {
	t.Helper()
	czxid, n, err := in.holderOf(dir)
	if err != nil {
		t.Fatal(err)
	}
	return czxid, n
}

// holderOf is holder, returning the error. It syncs its server with the
// leader first: a follower may not yet have applied a delete that the
// holder's server has (the holder's predecessor released the key).
func (in inspector) holderOf(dir string) (czxid int64, n int, err error) {
	for try := 0; ; try++ {
		_, err := in.c.Sync(dir)
		var children []string
		if err == nil || errors.Is(err, zk.ErrNoNode) {
			children, _, err = in.c.Children(dir)
		}
		if errors.Is(err, zk.ErrNoNode) {
			return 0, 0, nil
		}
		if err != nil && try < 50 {
			time.Sleep(100 * time.Millisecond) // reconnecting after a failover
			continue
		}
		if err != nil {
			return 0, 0, fmt.Errorf("children of %s: %w", dir, err)
		}
		low, lowSeq := "", int64(-1)
		for _, c := range children {
			i := strings.LastIndexByte(c, '-')
			seq, err := strconv.ParseInt(c[i+1:], 10, 64)
			if err == nil && (lowSeq < 0 || seq < lowSeq) {
				low, lowSeq = c, seq
			}
		}
		if low == "" {
			return 0, 0, nil
		}
		ok, stat, err := in.c.Exists(dir + "/" + low)
		if err != nil || !ok {
			continue // deleted meanwhile
		}
		return stat.Czxid, len(children), nil
	}
}

// settles waits up to 3s until dir has n contenders: a waiter that gave up
// deletes its znode in the background.
func (in inspector) settles(t *testing.T, dir string, n int) {
	t.Helper()
	got := -1
	for deadline := time.Now().Add(3 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		if _, got = in.holder(t, dir); got == n {
			return
		}
	}
	t.Fatalf("%s has %d contenders, want %d", dir, got, n)
}

// gate is a dialer whose connections a test can cut (closed, and no new
// ones: a crashed holder, or one behind a partition) or freeze (what the
// client sends is dropped, so the server hears nothing, as from a process
// that is stopped; new connections are frozen too).
type gate struct {
	state atomic.Int32 // gateOpen, gateFrozen or gateCut
	mu    sync.Mutex
	conns []net.Conn
}

const (
	gateOpen = iota
	gateFrozen
	gateCut
)

func (g *gate) dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	if g.state.Load() == gateCut {
		return nil, errors.New("gate: cut")
	}
	c, err := net.DialTimeout(network, addr, timeout)
	if err != nil {
		return nil, err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	g.conns = append(g.conns, c)
	return gatedConn{c, g}, nil
}

func (g *gate) freeze() { g.state.Store(gateFrozen) }

// reopen lets the client connect again, after cut.
func (g *gate) reopen() { g.state.Store(gateOpen) }

func (g *gate) cut() {
	g.state.Store(gateCut)
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, c := range g.conns {
		c.Close()
	}
}

type gatedConn struct {
	net.Conn
	g *gate
}

func (c gatedConn) Write(p []byte) (int, error) {
	if c.g.state.Load() != gateOpen {
		return len(p), nil
	}
	return c.Conn.Write(p)
}

// requests is a dialer that counts the requests a client sends, pings
// left out: the client writes each request whole, in one Write.
type requests struct{ n atomic.Int64 }

func (r *requests) dial(network, addr string, timeout time.Duration) (net.Conn, error) {
	c, err := net.DialTimeout(network, addr, timeout)
	return countingConn{c, r}, err
}

type countingConn struct {
	net.Conn
	r *requests
}

func (c countingConn) Write(p []byte) (int, error) {
	// A request is its length, xid and opcode; a ping's xid is -2.
	if len(p) >= 8 && !(p[4] == 0xff && p[5] == 0xff && p[6] == 0xff && p[7] == 0xfe) {
		c.r.n.Add(1)
	}
	return c.Conn.Write(p)
}

func testZooKeeperUncontended(t *testing.T, ens *testenv.ZooKeeperEnsemble) {
	ctx := context.Background()
	root := zkRoot()
	var count requests
	z := newZooKeeper(t, ens, lock.ZooKeeperOptions{Root: root}, zk.WithDialer(count.dial))
	in := newInspector(t, ens)
	dir := root + "/sku1"

	// The first obtain of a key creates its znode (and Root's), once the
	// client has a session: on a loaded machine, the server may not grant
	// it within one wait.
	if err := warm(z); err != nil {
		t.Fatal(err)
	}
	l0, err := z.Obtain(ctx, "sku1")
	if err != nil {
		t.Fatal(err)
	}
	if err := l0.Release(ctx); err != nil {
		t.Fatal(err)
	}
	before := count.n.Load()
	l, err := z.Obtain(ctx, "sku1")
	if err != nil {
		t.Fatal(err)
	}
	// A create, then the listing and the Exists that reads the czxid.
	if n := count.n.Load() - before; n != 3 {
		t.Errorf("an uncontended obtain sent %d requests, want 3", n)
	}
	if l.Fence() <= l0.Fence() {
		t.Errorf("fence %d not above the one before, %d", l.Fence(), l0.Fence())
	}
	if czxid, n := in.holder(t, dir); czxid != l.Fence() || n != 1 || l.Fence() <= 0 {
		t.Fatalf("server: holder's czxid %d of %d contenders, lease's fence %d", czxid, n, l.Fence())
	}
	if l.Context().Err() != nil || !l.Until().After(time.Now()) {
		t.Fatalf("fresh lease: context %v, until %v", context.Cause(l.Context()), l.Until())
	}
	if _, err := z.TryObtain(ctx, "sku1"); !errors.Is(err, lock.ErrNotObtained) {
		t.Fatalf("TryObtain of a held key: %v, want ErrNotObtained", err)
	}
	before = count.n.Load()
	if err := l.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := count.n.Load() - before; n != 1 {
		t.Errorf("a release sent %d requests, want 1 (a delete)", n)
	}
	if l.Context().Err() == nil {
		t.Fatal("a released lease's context is not done")
	}
	if err := l.Release(ctx); err != nil {
		t.Errorf("a second release: %v, want the first's result", err)
	}
	if _, n := in.holder(t, dir); n != 0 {
		t.Fatalf("after release the key has %d contenders", n)
	}
	l2, err := z.TryObtain(ctx, "sku1")
	if err != nil {
		t.Fatal(err)
	}
	if l2.Fence() <= l.Fence() {
		t.Fatalf("second fence %d not above first %d", l2.Fence(), l.Fence())
	}
	if s := z.Stats(); s.Attempts < 3 {
		t.Fatalf("stats %+v: want at least 3 attempts", s)
	}
	z.Close()
	if l2.Context().Err() == nil || !errors.Is(context.Cause(l2.Context()), lock.ErrNotHeld) {
		t.Errorf("a lease of a closed lock: %v, want lost", context.Cause(l2.Context()))
	}
	if _, err := z.Obtain(ctx, "sku1"); err == nil || errors.Is(err, lock.ErrNotObtained) {
		t.Errorf("obtain on a closed lock: %v, want it closed", err)
	}
	in.settles(t, dir, 0) // closing the session deleted its znode
}

func testZooKeeperPausedHolder(t *testing.T, ens *testenv.ZooKeeperEnsemble) {
	ctx := context.Background()
	row := newFencedRow(t)
	root := zkRoot()
	const ttl = 2 * time.Second
	var g gate
	a := newZooKeeper(t, ens, lock.ZooKeeperOptions{Root: root, TTL: ttl}, zk.WithDialer(g.dial))
	b := newZooKeeper(t, ens, lock.ZooKeeperOptions{Root: root, Wait: 15 * time.Second})
	if err := warm(a); err != nil {
		t.Fatal(err)
	}
	la, err := a.Obtain(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if n := row.write("A before the pause", la.Fence()); n != 1 {
		t.Fatalf("the holder's fenced write changed %d rows", n)
	}
	g.freeze() // A stops: the server hears nothing from it any more
	lb, err := b.Obtain(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer lb.Release(ctx)
	if lb.Fence() <= la.Fence() {
		t.Fatalf("B's fence %d not above A's %d", lb.Fence(), la.Fence())
	}
	if la.Context().Err() == nil {
		t.Error("A's lease was not cancelled before B obtained the key")
	}
	if n := row.write("B", lb.Fence()); n != 1 {
		t.Fatalf("B's fenced write changed %d rows", n)
	}
	// A resumes and writes, as a holder paused past its lease would.
	if n := row.write("A after the pause", la.Fence()); n != 0 {
		t.Errorf("A's stale fenced write changed %d rows, want 0", n)
	}
	row.holds("B", lb.Fence())
}

func testZooKeeperFailover(t *testing.T, ens *testenv.ZooKeeperEnsemble) {
	ctx := context.Background()
	root := zkRoot()
	// A session of 8s outlives the election (about a second here) and the
	// client's reconnection.
	a := newZooKeeper(t, ens, lock.ZooKeeperOptions{Root: root, TTL: 8 * time.Second})
	b := newZooKeeper(t, ens, lock.ZooKeeperOptions{Root: root, TTL: 8 * time.Second, Wait: 300 * time.Millisecond})
	in := newInspector(t, ens)
	for _, z := range []*lock.ZooKeeper{a, b} {
		if err := warm(z); err != nil {
			t.Fatal(err)
		}
	}
	la, err := a.Obtain(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	leader := ens.Leader(t)
	ens.Kill(leader) // started again by the restart, with the others
	// Until the ensemble serves again, and after, the contender must not
	// get the key.
	for start := time.Now(); time.Since(start) < 1500*time.Millisecond; {
		if lb, err := b.TryObtain(ctx, "k"); err == nil {
			lb.Release(ctx)
			t.Fatal("a contender obtained the key during the election")
		}
		time.Sleep(100 * time.Millisecond)
	}
	newLeader := ens.Leader(t)
	if _, err := b.Obtain(ctx, "k"); !errors.Is(err, lock.ErrNotObtained) {
		t.Fatalf("contender after the election: %v, want ErrNotObtained", err)
	}
	if czxid, _ := in.holder(t, root+"/k"); czxid != la.Fence() {
		t.Fatalf("server: holder's czxid %d after the election, want A's %d", czxid, la.Fence())
	}
	if err := la.Context().Err(); err != nil {
		t.Fatalf("A's lease did not survive the election: %v", context.Cause(la.Context()))
	}
	if err := la.Release(ctx); err != nil {
		t.Fatalf("A's release after the election: %v", err)
	}
	lb, err := b.TryObtain(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer lb.Release(ctx)
	if lb.Fence() <= la.Fence() || lb.Fence()>>32 <= la.Fence()>>32 {
		t.Errorf("fence after the failover %#x, want a later epoch than %#x", lb.Fence(), la.Fence())
	}
	t.Logf("leader %d killed, %d elected; fences %#x then %#x", leader, newLeader, la.Fence(), lb.Fence())
}

func testZooKeeperRestart(t *testing.T, ens *testenv.ZooKeeperEnsemble) {
	ctx := context.Background()
	root := zkRoot()
	opt := lock.ZooKeeperOptions{Root: root, Wait: 30 * time.Second}
	a := newZooKeeper(t, ens, opt)
	l1, err := a.Obtain(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if err := l1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	ens.StopAll()
	ens.StartAll()
	l2, err := a.Obtain(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if err := l2.Release(ctx); err != nil {
		t.Fatal(err)
	}
	l3, err := newZooKeeper(t, ens, opt).Obtain(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer l3.Release(ctx)
	if l2.Fence() <= l1.Fence() || l2.Fence()>>32 <= l1.Fence()>>32 || l3.Fence() <= l2.Fence() {
		t.Errorf("fences across the restart %#x, %#x, %#x: want increasing, the epoch too", l1.Fence(), l2.Fence(), l3.Fence())
	}
}
