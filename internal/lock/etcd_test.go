package lock_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"shop/internal/lock"
	"shop/internal/testenv"
)

// Each test starts its own three-member cluster (about 0.4 s): the tests
// that kill members or restart the cluster need one of their own, and the
// others gain little from sharing one without a TestMain to stop it.

// etcdLock returns an etcd lock on cl with a key prefix of the test's own,
// closed when the test ends.
func etcdLock(t *testing.T, cl *clientv3.Client, prefix string, opt lock.EtcdOptions) *lock.Etcd {
	t.Helper()
	opt.Prefix = prefix
	l := lock.NewEtcd(cl, opt)
	t.Cleanup(func() { l.Close() })
	return l
}

// etcdPrefix is a key prefix of the test's own.
func etcdPrefix() string { return "/test/" + testenv.Name() + "/" }

// etcdQueue returns the keys queued for key in etcd, holder first: the
// mutex keys under l.Key(key), oldest create revision first.
func etcdQueue(t *testing.T, cl *clientv3.Client, l *lock.Etcd, key string) []*mvccpb.KeyValue {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cl.Get(ctx, l.Key(key)+"/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		t.Fatalf("get the queue of %q: %v", key, err)
	}
	return resp.Kvs
}

// etcdHolder checks that lease holds key in etcd: the oldest key queued
// for it is the lease's, created at the lease's fencing token.
func etcdHolder(t *testing.T, cl *clientv3.Client, l *lock.Etcd, lease *lock.Lease) *mvccpb.KeyValue {
	t.Helper()
	q := etcdQueue(t, cl, l, lease.Key())
	if len(q) == 0 {
		t.Fatalf("nobody holds %q in etcd; the lease has token %d", lease.Key(), lease.Fence())
	}
	if q[0].CreateRevision != lease.Fence() {
		t.Fatalf("%q is held in etcd by %s, created at %d; the lease has token %d", lease.Key(), q[0].Key, q[0].CreateRevision, lease.Fence())
	}
	return q[0]
}

func etcdObtain(t *testing.T, l *lock.Etcd, key string) *lock.Lease {
	t.Helper()
	lease, err := l.Obtain(context.Background(), key)
	if err != nil {
		t.Fatalf("obtain %q: %v", key, err)
	}
	return lease
}

func TestEtcdObtainRelease(t *testing.T) {
	c := testenv.StartEtcdCluster(t)
	cl := c.Client(t, c.Endpoints()...)
	l := etcdLock(t, cl, etcdPrefix(), lock.EtcdOptions{})
	ctx := context.Background()

	first := etcdObtain(t, l, "sku:1")
	kv := etcdHolder(t, cl, l, first)
	if q := etcdQueue(t, cl, l, "sku:1"); len(q) != 1 {
		t.Errorf("%d keys queued for a key held uncontended, want 1", len(q))
	}
	// The key lives on the session's lease, of the TTL rounded to seconds.
	ttl, err := cl.TimeToLive(ctx, clientv3.LeaseID(kv.Lease))
	if err != nil {
		t.Fatal(err)
	}
	if ttl.GrantedTTL != 5 {
		t.Errorf("the holder's lease was granted %d s, want the default TTL, 5 s", ttl.GrantedTTL)
	}
	// Another key of the same prefix with a "/" is another lock.
	other := etcdObtain(t, l, "sku:1/x")
	if err := first.Release(ctx); err != nil {
		t.Fatalf("release: %v", err)
	}
	if q := etcdQueue(t, cl, l, "sku:1"); len(q) != 0 {
		t.Errorf("%d keys left queued for %q after its release", len(q), "sku:1")
	}
	if err := first.Context().Err(); err == nil {
		t.Error("the released lease's Context is not done")
	}
	second := etcdObtain(t, l, "sku:1")
	if second.Fence() <= first.Fence() {
		t.Errorf("token of the next holder %d, want > %d", second.Fence(), first.Fence())
	}
	if err := second.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := other.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if s := l.Stats(); s.Attempts != 3 || s.Wakeups != 0 || s.Waiting != 0 {
		t.Errorf("Stats = %+v, want 3 attempts, no wake-ups, nobody waiting", s)
	}

	// TryObtain takes a free key and refuses a held one at once.
	held, err := l.TryObtain(ctx, "sku:2")
	if err != nil {
		t.Fatalf("TryObtain of a free key: %v", err)
	}
	etcdHolder(t, cl, l, held)
	rival := etcdLock(t, cl, keyPrefixEtcd(l), lock.EtcdOptions{})
	if _, err := rival.TryObtain(ctx, "sku:2"); !errors.Is(err, lock.ErrNotObtained) {
		t.Errorf("TryObtain of a key held in another session = %v, want ErrNotObtained", err)
	}
	if _, err := l.TryObtain(ctx, "sku:2"); !errors.Is(err, lock.ErrNotObtained) {
		t.Errorf("TryObtain of a key held in this process = %v, want ErrNotObtained", err)
	}
	if q := etcdQueue(t, cl, l, "sku:2"); len(q) != 1 {
		t.Errorf("%d keys queued after refused TryObtains, want the holder's alone", len(q))
	}
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// keyPrefixEtcd recovers the prefix an etcd lock was built with.
func keyPrefixEtcd(l *lock.Etcd) string {
	k := l.Key("x")
	return k[:len(k)-1]
}

// Callers of three processes (sessions), several in each, take one key in
// turn: never two inside at once, and each holder's token is above the
// last one's.
func TestEtcdMutualExclusion(t *testing.T) {
	c := testenv.StartEtcdCluster(t)
	prefix := etcdPrefix()
	const processes, callers, rounds = 3, 4, 5
	var (
		inside, overlaps atomic.Int32
		mu               sync.Mutex
		tokens           []int64 // in the order the key was held
		wg               sync.WaitGroup
		errs             = make(chan error, processes*callers*rounds)
		locks            []*lock.Etcd
	)
	for range processes {
		l := etcdLock(t, c.Client(t, c.Endpoints()...), prefix, lock.EtcdOptions{Wait: 30 * time.Second})
		locks = append(locks, l)
		for range callers {
			wg.Go(func() {
				for range rounds {
					lease, err := l.Obtain(context.Background(), "sku:1")
					if err != nil {
						errs <- err
						return
					}
					if inside.Add(1) != 1 {
						overlaps.Add(1)
					}
					mu.Lock()
					tokens = append(tokens, lease.Fence())
					mu.Unlock()
					time.Sleep(time.Millisecond)
					inside.Add(-1)
					if err := lease.Release(context.Background()); err != nil {
						errs <- err
					}
				}
			})
		}
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	if n := overlaps.Load(); n != 0 {
		t.Errorf("%d holders found another inside", n)
	}
	if len(tokens) != processes*callers*rounds {
		t.Fatalf("%d holdings, want %d", len(tokens), processes*callers*rounds)
	}
	for i := 1; i < len(tokens); i++ {
		if tokens[i] <= tokens[i-1] {
			t.Fatalf("holding %d had token %d after %d: tokens must increase in holding order", i, tokens[i], tokens[i-1])
		}
	}
	var wakeups uint64
	for _, l := range locks {
		s := l.Stats()
		wakeups += s.Wakeups
		if s.Waiting != 0 {
			t.Errorf("Stats.Waiting = %d after every caller is done", s.Waiting)
		}
	}
	if wakeups == 0 {
		t.Error("no holder waited in etcd: the test did not contend across processes")
	}
	t.Logf("%d holdings, %d after a wait in etcd", len(tokens), wakeups)
}

// A held key makes Obtain give up after the wait (or sooner, with the
// caller's context), with no key of its own left queued.
func TestEtcdWaitIsBounded(t *testing.T) {
	c := testenv.StartEtcdCluster(t)
	cl := c.Client(t, c.Endpoints()...)
	prefix := etcdPrefix()
	holder := etcdLock(t, cl, prefix, lock.EtcdOptions{Wait: 500 * time.Millisecond})
	const wait = 300 * time.Millisecond
	waiter := etcdLock(t, cl, prefix, lock.EtcdOptions{Wait: wait})
	lease := etcdObtain(t, holder, "k")

	check := func(what string, ctx context.Context, want time.Duration) {
		t.Helper()
		start := time.Now()
		_, err := waiter.Obtain(ctx, "k")
		took := time.Since(start)
		if !errors.Is(err, lock.ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("%s: Obtain = %v, want ErrNotObtained with DeadlineExceeded", what, err)
		}
		if took < want || took > want+500*time.Millisecond {
			t.Errorf("%s: Obtain gave up after %v, want about %v", what, took, want)
		}
		// Obtain returns when the wait ends; the key the waiter queued
		// with is deleted right after.
		waitForEtcd(t, what+": the waiter's key is deleted", func() bool {
			q := etcdQueue(t, cl, waiter, "k")
			return len(q) == 1 && q[0].CreateRevision == lease.Fence()
		})
		if gone := time.Since(start) - took; gone > 500*time.Millisecond {
			t.Errorf("%s: the waiter's key was deleted %v after Obtain returned", what, gone)
		}
	}
	check("the wait", context.Background(), wait)
	short, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	check("a shorter context", short, 100*time.Millisecond)
	// In process too: a second caller of the holder's process waits in
	// line and gives up as well.
	start := time.Now()
	if _, err := holder.Obtain(context.Background(), "k"); !errors.Is(err, lock.ErrNotObtained) {
		t.Errorf("Obtain in the holder's process = %v, want ErrNotObtained", err)
	} else if took := time.Since(start); took < 500*time.Millisecond || took > time.Second {
		t.Errorf("Obtain in the holder's process gave up after %v, want about its 500 ms wait", took)
	}
	// The waiter that gave up is not in the way of the next holder.
	if err := lease.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	next, err := waiter.TryObtain(context.Background(), "k")
	if err != nil {
		t.Fatalf("TryObtain after the release: %v", err)
	}
	next.Release(context.Background())
}

// A lease whose session is revoked (as etcd does when its TTL runs out)
// is lost: its Context is cancelled with ErrNotHeld, and its Release says
// so.
func TestEtcdReleaseAfterLoss(t *testing.T) {
	c := testenv.StartEtcdCluster(t)
	cl := c.Client(t, c.Endpoints()...)
	l := etcdLock(t, cl, etcdPrefix(), lock.EtcdOptions{TTL: time.Second})
	ctx := context.Background()
	lease := etcdObtain(t, l, "k")
	kv := etcdHolder(t, cl, l, lease)
	if _, err := cl.Revoke(ctx, clientv3.LeaseID(kv.Lease)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lease.Context().Done():
	case <-time.After(5 * time.Second):
		t.Fatal("the lease's Context is live 5 s after its session was revoked")
	}
	if cause := context.Cause(lease.Context()); !errors.Is(cause, lock.ErrNotHeld) {
		t.Errorf("the lost lease's cause = %v, want ErrNotHeld", cause)
	}
	if err := lease.Release(ctx); !errors.Is(err, lock.ErrNotHeld) {
		t.Errorf("Release after the loss = %v, want ErrNotHeld", err)
	}
	// The lock goes on in a new session.
	next := etcdObtain(t, l, "k")
	if next.Fence() <= lease.Fence() {
		t.Errorf("token after the loss %d, want > %d", next.Fence(), lease.Fence())
	}
	if kv2 := etcdHolder(t, cl, l, next); kv2.Lease == kv.Lease {
		t.Error("the new lease was taken in the revoked session")
	}
	if err := next.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// still's error ends a wait — in etcd, once the key is released to the
// waiter, and in line behind a holder of the same process — and the key
// is not kept.
func TestEtcdObtainWhileStillEndsWait(t *testing.T) {
	c := testenv.StartEtcdCluster(t)
	cl := c.Client(t, c.Endpoints()...)
	prefix := etcdPrefix()
	errSoldOut := errors.New("sold out")
	for _, sameProcess := range []bool{false, true} {
		name := "in etcd"
		if sameProcess {
			name = "in process"
		}
		t.Run(name, func(t *testing.T) {
			holder := etcdLock(t, cl, prefix, lock.EtcdOptions{})
			waiter := etcdLock(t, cl, prefix, lock.EtcdOptions{Wait: 10 * time.Second})
			if sameProcess {
				waiter = holder
			}
			lease := etcdObtain(t, holder, "k")
			var calls atomic.Int32
			done := make(chan error, 1)
			go func() {
				_, err := waiter.ObtainWhile(context.Background(), "k", func(context.Context) error {
					calls.Add(1)
					return errSoldOut
				})
				done <- err
			}()
			// In etcd, the waiter waits once its own key is queued behind the
			// holder's: counted as waiting a moment before, it may not have
			// sent it yet, and a release then finds the key free.
			waitForEtcd(t, "the waiter waits", func() bool {
				return waiter.Stats().Waiting == 1 && (sameProcess || len(etcdQueue(t, cl, holder, "k")) == 2)
			})
			if n := calls.Load(); n != 0 {
				t.Fatalf("still called %d times while the key is held", n)
			}
			if err := lease.Release(context.Background()); err != nil {
				t.Fatal(err)
			}
			select {
			case err := <-done:
				if !errors.Is(err, errSoldOut) || errors.Is(err, lock.ErrNotObtained) {
					t.Errorf("ObtainWhile = %v, want still's error", err)
				}
			case <-time.After(5 * time.Second):
				t.Fatal("ObtainWhile still waits 5 s after the release")
			}
			if n := calls.Load(); n != 1 {
				t.Errorf("still called %d times, want once", n)
			}
			if q := etcdQueue(t, cl, holder, "k"); len(q) != 0 {
				t.Errorf("%d keys queued after the waiter gave up, want none", len(q))
			}
			// Its turn in line was passed on.
			next, err := waiter.TryObtain(context.Background(), "k")
			if err != nil {
				t.Fatalf("TryObtain after the wait ended: %v", err)
			}
			next.Release(context.Background())
		})
	}
}

// waitForEtcd polls cond for up to 10 s.
func waitForEtcd(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
	}
}

// A holder whose process is gone (its client closed without revoking its
// lease) keeps the key for about the TTL; then etcd expires its lease and
// the next holder gets the key with a larger token.
func TestEtcdCrashedHolderExpires(t *testing.T) {
	c := testenv.StartEtcdCluster(t)
	prefix := etcdPrefix()
	crashing := c.Client(t, c.Endpoints()...)
	crashed := lock.NewEtcd(crashing, lock.EtcdOptions{Prefix: prefix, TTL: time.Second})
	lease := etcdObtain(t, crashed, "k")
	cl := c.Client(t, c.Endpoints()...)
	next := etcdLock(t, cl, prefix, lock.EtcdOptions{Wait: 10 * time.Second})
	etcdHolder(t, cl, next, lease)

	crashing.Close() // no revoke: its keep-alives just stop
	start := time.Now()
	got, err := next.Obtain(context.Background(), "k")
	took := time.Since(start)
	if err != nil {
		t.Fatalf("the key was not freed by the crashed holder's expiry: %v", err)
	}
	// A TTL of 1 s; etcd checks for expired leases every 500 ms.
	if took < 500*time.Millisecond || took > 3*time.Second {
		t.Errorf("the key passed on %v after the crash, want about the 1 s TTL", took)
	}
	if got.Fence() <= lease.Fence() {
		t.Errorf("token after the crash %d, want > %d", got.Fence(), lease.Fence())
	}
	etcdHolder(t, cl, next, got)
	if err := got.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
	t.Logf("the key passed on %v after the crash", took)
}

// A holder that stops (its member, the only one its client knows, frozen:
// no keep-alive gets through) loses the key after the TTL; the next holder
// writes a row fenced by its token; when the first resumes, its write with
// its older token is refused by MySQL.
func TestEtcdPausedHolderStaleWriteRefused(t *testing.T) {
	c := testenv.StartEtcdCluster(t)
	db := testenv.MySQL(t)
	sqlDB, err := db.Gorm.DB()
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	if _, err := sqlDB.ExecContext(ctx, "CREATE TABLE etcd_fenced (id INT PRIMARY KEY, v VARCHAR(16) NOT NULL, fence BIGINT NOT NULL)"); err != nil {
		t.Fatal(err)
	}
	if _, err := sqlDB.ExecContext(ctx, "INSERT INTO etcd_fenced VALUES (1, 'none', 0)"); err != nil {
		t.Fatal(err)
	}
	write := func(v string, token int64) int64 {
		t.Helper()
		res, err := sqlDB.ExecContext(ctx, "UPDATE etcd_fenced SET v = ?, fence = ? WHERE id = 1 AND fence < ?", v, token, token)
		if err != nil {
			t.Fatalf("fenced write of %s: %v", v, err)
		}
		n, err := res.RowsAffected()
		if err != nil {
			t.Fatal(err)
		}
		return n
	}

	// A's client knows one follower alone; B's the two others.
	leader := c.Leader(t)
	paused := (leader + 1) % 3
	var others []string
	for i, ep := range c.Endpoints() {
		if i != paused {
			others = append(others, ep)
		}
	}
	prefix := etcdPrefix()
	a := etcdLock(t, c.Client(t, c.Endpoint(paused)), prefix, lock.EtcdOptions{TTL: time.Second})
	bClient := c.Client(t, others...)
	b := etcdLock(t, bClient, prefix, lock.EtcdOptions{Wait: 10 * time.Second})
	leaseA := etcdObtain(t, a, "sku:1")

	c.Pause(paused)
	resumed := false
	resume := func() {
		if !resumed {
			c.Resume(paused)
			resumed = true
		}
	}
	defer resume()
	leaseB, err := b.Obtain(ctx, "sku:1")
	if err != nil {
		t.Fatalf("B did not get the key of the paused holder: %v", err)
	}
	if leaseB.Fence() <= leaseA.Fence() {
		t.Fatalf("B's token %d, want > A's %d", leaseB.Fence(), leaseA.Fence())
	}
	etcdHolder(t, bClient, b, leaseB)
	if n := write("B", leaseB.Fence()); n != 1 {
		t.Fatalf("B's fenced write changed %d rows, want 1", n)
	}

	resume()
	// A wakes up and writes as if it still held the key.
	if n := write("A", leaseA.Fence()); n != 0 {
		t.Errorf("A's stale write with token %d changed %d rows, want 0", leaseA.Fence(), n)
	}
	var (
		v     string
		fence int64
	)
	if err := sqlDB.QueryRowContext(ctx, "SELECT v, fence FROM etcd_fenced WHERE id = 1").Scan(&v, &fence); err != nil {
		t.Fatal(err)
	}
	if v != "B" || fence != leaseB.Fence() {
		t.Errorf("row = (%s, %d), want B's (B, %d)", v, fence, leaseB.Fence())
	}
	// A hears that its lease is gone, and cannot release B's key.
	select {
	case <-leaseA.Context().Done():
		if cause := context.Cause(leaseA.Context()); !errors.Is(cause, lock.ErrNotHeld) {
			t.Errorf("A's lease ended with %v, want ErrNotHeld", cause)
		}
	case <-time.After(5 * time.Second):
		t.Error("A's lease is live 5 s after it was resumed")
	}
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := leaseA.Release(rctx); !errors.Is(err, lock.ErrNotHeld) {
		t.Errorf("A's Release = %v, want ErrNotHeld", err)
	}
	etcdHolder(t, bClient, b, leaseB)
	if err := leaseB.Release(ctx); err != nil {
		t.Fatal(err)
	}
}

// The leader dies under a holder: the holder keeps the key (its Context
// stays live for well over the TTL, and nobody else gets it) while the
// two others elect a new leader; after its release the next token is
// larger; the killed member comes back with the key's history.
func TestEtcdLeaderFailover(t *testing.T) {
	c := testenv.StartEtcdCluster(t)
	prefix := etcdPrefix()
	const ttl = 2 * time.Second
	cl := c.Client(t, c.Endpoints()...)
	holder := etcdLock(t, cl, prefix, lock.EtcdOptions{TTL: ttl})
	lease := etcdObtain(t, holder, "k")
	contender := etcdLock(t, c.Client(t, c.Endpoints()...), prefix, lock.EtcdOptions{Wait: 300 * time.Millisecond})

	leader := c.Leader(t)
	c.Kill(leader)
	killed := time.Now()
	newLeader := c.Leader(t)
	t.Logf("member %d led, member %d leads %v after it was killed", leader, newLeader, time.Since(killed))
	for time.Since(killed) < 3*ttl {
		if err := lease.Context().Err(); err != nil {
			t.Fatalf("the lease ended %v after the leader was killed: %v", time.Since(killed), context.Cause(lease.Context()))
		}
		if l, err := contender.Obtain(context.Background(), "k"); !errors.Is(err, lock.ErrNotObtained) {
			if err == nil {
				l.Release(context.Background())
			}
			t.Fatalf("a contender's Obtain %v after the leader was killed = %v, want ErrNotObtained", time.Since(killed), err)
		}
		time.Sleep(200 * time.Millisecond)
	}
	etcdHolder(t, cl, holder, lease)
	if err := lease.Release(context.Background()); err != nil {
		t.Fatalf("release after the failover: %v", err)
	}
	next, err := contender.Obtain(context.Background(), "k")
	if err != nil {
		t.Fatalf("obtain after the release: %v", err)
	}
	if next.Fence() <= lease.Fence() {
		t.Errorf("token after the failover %d, want > %d", next.Fence(), lease.Fence())
	}

	c.Start(leader)
	// The member that was killed serves the new holder's key.
	back := c.Client(t, c.Endpoint(leader))
	etcdHolder(t, back, contender, next)
	if err := next.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// Every member stopped and started again on its data: the next token is
// larger than every one handed out before.
func TestEtcdTokensSurviveRestart(t *testing.T) {
	c := testenv.StartEtcdCluster(t)
	prefix := etcdPrefix()
	before := etcdLock(t, c.Client(t, c.Endpoints()...), prefix, lock.EtcdOptions{})
	var tokens []int64
	for _, key := range []string{"a", "b", "a", "c"} {
		lease := etcdObtain(t, before, key)
		tokens = append(tokens, lease.Fence())
		if err := lease.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	last := slices.Max(tokens)

	c.StopAll()
	c.StartAll()
	after := etcdLock(t, c.Client(t, c.Endpoints()...), prefix, lock.EtcdOptions{})
	for _, key := range []string{"a", "d"} {
		lease := etcdObtain(t, after, key)
		if lease.Fence() <= last {
			t.Errorf("token of %q after the restart %d, want > %d (tokens before: %v)", key, lease.Fence(), last, tokens)
		}
		last = lease.Fence()
		if err := lease.Release(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
}
