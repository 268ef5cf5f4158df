package lock_test

import (
	"context"
	"errors"
	"net"
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
// starting three JVMs costs seconds, so the cases share it, the ones that
// kill servers last, and each restores it.
func TestZooKeeper(t *testing.T) {
	ens := testenv.StartZooKeeper(t)
	t.Run("UncontendedObtainRelease", func(t *testing.T) { testZooKeeperUncontended(t, ens) })
	t.Run("Exclusion", func(t *testing.T) { testZooKeeperExclusion(t, ens) })
	t.Run("BoundedWait", func(t *testing.T) { testZooKeeperBoundedWait(t, ens) })
	t.Run("StillEndsWait", func(t *testing.T) { testZooKeeperStill(t, ens) })
	t.Run("CrashedHolderExpires", func(t *testing.T) { testZooKeeperCrashedHolder(t, ens) })
	t.Run("PausedHolderStaleWriteRefused", func(t *testing.T) { testZooKeeperPausedHolder(t, ens) })
	t.Run("LeaderFailoverMidHold", func(t *testing.T) { testZooKeeperFailover(t, ens) })
	t.Run("TokensAcrossRestart", func(t *testing.T) { testZooKeeperRestart(t, ens) })
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
	for try := 0; ; try++ {
		children, _, err := in.c.Children(dir)
		if errors.Is(err, zk.ErrNoNode) {
			return 0, 0
		}
		if err != nil && try < 50 {
			time.Sleep(100 * time.Millisecond) // reconnecting after a failover
			continue
		}
		if err != nil {
			t.Fatalf("children of %s: %v", dir, err)
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
			return 0, 0
		}
		ok, stat, err := in.c.Exists(dir + "/" + low)
		if err != nil || !ok {
			continue // deleted meanwhile
		}
		return stat.Czxid, len(children)
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

	// The first obtain of a key creates its znode (and Root's).
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

func testZooKeeperExclusion(t *testing.T, ens *testenv.ZooKeeperEnsemble) {
	const workers, rounds = 6, 8
	ctx := context.Background()
	root := zkRoot()
	opt := lock.ZooKeeperOptions{Root: root, Wait: 20 * time.Second}
	// Two locks, two sessions: two processes, three waiters each.
	locks := []*lock.ZooKeeper{newZooKeeper(t, ens, opt), newZooKeeper(t, ens, opt)}
	in := newInspector(t, ens)
	var (
		inside, overlaps atomic.Int32
		mu               sync.Mutex
		fences           []int64
		wrong            []string
		wg               sync.WaitGroup
	)
	for w := range workers {
		z := locks[w%2]
		wg.Go(func() {
			for range rounds {
				l, err := z.Obtain(ctx, "hot")
				if err != nil {
					t.Error(err)
					return
				}
				if inside.Add(1) != 1 {
					overlaps.Add(1)
				}
				czxid, _ := in.holder(t, root+"/hot")
				mu.Lock()
				fences = append(fences, l.Fence())
				if czxid != l.Fence() {
					wrong = append(wrong, "holder on the server "+strconv.FormatInt(czxid, 16)+", lease "+strconv.FormatInt(l.Fence(), 16))
				}
				mu.Unlock()
				time.Sleep(time.Millisecond)
				inside.Add(-1)
				if err := l.Release(ctx); err != nil {
					t.Error(err)
				}
			}
		})
	}
	wg.Wait()
	if n := overlaps.Load(); n != 0 {
		t.Errorf("%d overlapping holds", n)
	}
	if len(wrong) > 0 {
		t.Errorf("the server's holder was not the lease's: %v", wrong)
	}
	if len(fences) != workers*rounds {
		t.Fatalf("%d holds, want %d", len(fences), workers*rounds)
	}
	for i := 1; i < len(fences); i++ {
		if fences[i] <= fences[i-1] {
			t.Fatalf("fence %d (%d) not above the one before (%d)", i, fences[i], fences[i-1])
		}
	}
	s0, s1 := locks[0].Stats(), locks[1].Stats()
	t.Logf("stats: %+v %+v", s0, s1)
	if s0.Wakeups+s1.Wakeups == 0 {
		t.Error("no waiter was woken by a watch")
	}
}

func testZooKeeperBoundedWait(t *testing.T, ens *testenv.ZooKeeperEnsemble) {
	ctx := context.Background()
	root := zkRoot()
	const wait = 300 * time.Millisecond
	a := newZooKeeper(t, ens, lock.ZooKeeperOptions{Root: root, Wait: wait})
	b := newZooKeeper(t, ens, lock.ZooKeeperOptions{Root: root, Wait: wait})
	in := newInspector(t, ens)
	l, err := a.Obtain(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Release(ctx)

	check := func(what string, want time.Duration, obtain func() (*lock.Lease, error)) {
		t.Helper()
		start := time.Now()
		_, err := obtain()
		took := time.Since(start)
		if !errors.Is(err, lock.ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s: %v, want ErrNotObtained joined with DeadlineExceeded", what, err)
		}
		if took < want || took > want+time.Second {
			t.Errorf("%s gave up after %v, want about %v", what, took, want)
		}
		in.settles(t, root+"/k", 1)
		if czxid, _ := in.holder(t, root+"/k"); czxid != l.Fence() {
			t.Errorf("%s: the holder changed on the server", what)
		}
	}
	check("another process", wait, func() (*lock.Lease, error) { return b.Obtain(ctx, "k") })
	check("the same process", wait, func() (*lock.Lease, error) { return a.Obtain(ctx, "k") })
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	check("a shorter context", 100*time.Millisecond, func() (*lock.Lease, error) { return b.Obtain(short, "k") })
}

func testZooKeeperStill(t *testing.T, ens *testenv.ZooKeeperEnsemble) {
	ctx := context.Background()
	root := zkRoot()
	opt := lock.ZooKeeperOptions{Root: root, Wait: 10 * time.Second}
	a, b := newZooKeeper(t, ens, opt), newZooKeeper(t, ens, opt)
	in := newInspector(t, ens)
	errSoldOut := errors.New("sold out")
	still := func(context.Context) error { return errSoldOut }
	for _, waiter := range []struct {
		name string
		z    *lock.ZooKeeper
	}{{"another process", b}, {"the same process", a}} {
		l, err := a.Obtain(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		done := make(chan error, 1)
		start := time.Now()
		go func() {
			l, err := waiter.z.ObtainWhile(ctx, "k", still)
			if err == nil {
				l.Release(ctx)
			}
			done <- err
		}()
		time.Sleep(200 * time.Millisecond)
		if err := l.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := <-done; !errors.Is(err, errSoldOut) {
			t.Errorf("%s: ObtainWhile: %v, want the still error", waiter.name, err)
		}
		if took := time.Since(start); took > 2*time.Second {
			t.Errorf("%s: ObtainWhile took %v after the release", waiter.name, took)
		}
		in.settles(t, root+"/k", 0)
	}
}

func testZooKeeperCrashedHolder(t *testing.T, ens *testenv.ZooKeeperEnsemble) {
	ctx := context.Background()
	root := zkRoot()
	const ttl = 2 * time.Second
	var g gate
	a := newZooKeeper(t, ens, lock.ZooKeeperOptions{Root: root, TTL: ttl}, zk.WithDialer(g.dial))
	b := newZooKeeper(t, ens, lock.ZooKeeperOptions{Root: root, Wait: 15 * time.Second})
	in := newInspector(t, ens)
	la, err := a.Obtain(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	g.cut() // the holder's connection is gone, its session is not closed
	start := time.Now()
	lb, err := b.Obtain(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	defer lb.Release(ctx)
	took := time.Since(start)
	// The server expires the session a TTL after it last heard from it,
	// which was at most a ping interval (TTL/3) before the cut.
	if took < ttl*2/3-100*time.Millisecond || took > ttl+3*time.Second {
		t.Errorf("the second holder obtained after %v, want about the TTL %v", took, ttl)
	}
	if lb.Fence() <= la.Fence() {
		t.Errorf("second fence %d not above the crashed holder's %d", lb.Fence(), la.Fence())
	}
	if czxid, n := in.holder(t, root+"/k"); czxid != lb.Fence() || n != 1 {
		t.Errorf("server: holder's czxid %d of %d contenders, want %d alone", czxid, n, lb.Fence())
	}
	select {
	case <-la.Context().Done():
		if !errors.Is(context.Cause(la.Context()), lock.ErrNotHeld) {
			t.Errorf("lost lease's cause %v, want ErrNotHeld", context.Cause(la.Context()))
		}
	default:
		t.Error("the crashed holder's lease was not cancelled before the key went to another")
	}
	if err := la.Release(ctx); !errors.Is(err, lock.ErrNotHeld) {
		t.Errorf("release after loss: %v, want ErrNotHeld", err)
	}
}

func testZooKeeperPausedHolder(t *testing.T, ens *testenv.ZooKeeperEnsemble) {
	ctx := context.Background()
	db := testenv.MySQL(t)
	if err := db.Gorm.Exec("CREATE TABLE fenced (id INT PRIMARY KEY, v VARCHAR(32) NOT NULL, fence BIGINT NOT NULL)").Error; err != nil {
		t.Fatal(err)
	}
	if err := db.Gorm.Exec("INSERT INTO fenced VALUES (1, 'init', 0)").Error; err != nil {
		t.Fatal(err)
	}
	write := func(v string, token int64) int64 {
		t.Helper()
		res := db.Gorm.Exec("UPDATE fenced SET v = ?, fence = ? WHERE id = 1 AND fence < ?", v, token, token)
		if res.Error != nil {
			t.Fatal(res.Error)
		}
		return res.RowsAffected
	}
	root := zkRoot()
	const ttl = 2 * time.Second
	var g gate
	a := newZooKeeper(t, ens, lock.ZooKeeperOptions{Root: root, TTL: ttl}, zk.WithDialer(g.dial))
	b := newZooKeeper(t, ens, lock.ZooKeeperOptions{Root: root, Wait: 15 * time.Second})
	la, err := a.Obtain(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	if n := write("A before the pause", la.Fence()); n != 1 {
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
	if n := write("B", lb.Fence()); n != 1 {
		t.Fatalf("B's fenced write changed %d rows", n)
	}
	// A resumes and writes, as a holder paused past its lease would.
	if n := write("A after the pause", la.Fence()); n != 0 {
		t.Errorf("A's stale fenced write changed %d rows, want 0", n)
	}
	var row struct {
		V     string
		Fence int64
	}
	if err := db.Gorm.Raw("SELECT v, fence FROM fenced WHERE id = 1").Scan(&row).Error; err != nil {
		t.Fatal(err)
	}
	if row.V != "B" || row.Fence != lb.Fence() {
		t.Errorf("row is (%q, %d), want (\"B\", %d)", row.V, row.Fence, lb.Fence())
	}
}

func testZooKeeperFailover(t *testing.T, ens *testenv.ZooKeeperEnsemble) {
	ctx := context.Background()
	root := zkRoot()
	// A session of 8s outlives the election (about a second here) and the
	// client's reconnection.
	a := newZooKeeper(t, ens, lock.ZooKeeperOptions{Root: root, TTL: 8 * time.Second})
	b := newZooKeeper(t, ens, lock.ZooKeeperOptions{Root: root, TTL: 8 * time.Second, Wait: 300 * time.Millisecond})
	in := newInspector(t, ens)
	la, err := a.Obtain(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	leader := ens.Leader(t)
	ens.Kill(leader)
	t.Cleanup(func() {
		if t.Failed() {
			ens.StartAll() // for the tests after this one
		}
	})
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
	ens.Start(leader)
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
