package lock_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"shop/internal/lock"
	"shop/internal/testenv"
)

// The tests share one cluster (etcdCluster), but for those that pause,
// kill or restart members, which share one of their own in turn.

// TestEtcdMemberFailures pauses a follower under a holder, kills the
// leader under another, and restarts the whole cluster, one after the
// other on a cluster of its own; each case leaves it whole again.
func TestEtcdMemberFailures(t *testing.T) {
	t.Parallel()
	c := testenv.StartEtcdCluster(t)
	t.Run("PausedHolderStaleWriteRefused", func(t *testing.T) { testEtcdPausedHolder(t, c) })
	t.Run("LeaderFailover", func(t *testing.T) { testEtcdLeaderFailover(t, c) })
	t.Run("TokensSurviveRestart", func(t *testing.T) { testEtcdRestart(t, c) })
}

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
	q, err := etcdQueueOf(cl, l, key)
	if err != nil {
		t.Fatal(err)
	}
	return q
}

// etcdQueueOf is etcdQueue, returning the error.
func etcdQueueOf(cl *clientv3.Client, l *lock.Etcd, key string) ([]*mvccpb.KeyValue, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := cl.Get(ctx, l.Key(key)+"/", clientv3.WithPrefix(), clientv3.WithSort(clientv3.SortByCreateRevision, clientv3.SortAscend))
	if err != nil {
		return nil, fmt.Errorf("get the queue of %q: %w", key, err)
	}
	return resp.Kvs, nil
}

// etcdFamily is the etcd lock, on the shared cluster, as the conformance
// suite runs it. Each process has a client and a session of its own.
func etcdFamily() family {
	return family{name: "etcd", claims: everything, woken: true, ttl: 2 * time.Second,
		servers: func(t *testing.T) func(*testing.T, settings) world {
			c := etcdCluster(t)
			prefix := etcdPrefix()
			cl := c.Client(t)
			return func(t *testing.T, opt settings) world {
				return func() *handle {
					own := c.Client(t)
					l := etcdLock(t, own, prefix, lock.EtcdOptions{TTL: opt.TTL, Wait: opt.Wait})
					return &handle{locker: l,
						// No revoke: its keep-alives just stop.
						crash: func() { own.Close() },
						// Its session's lease is revoked, as etcd does when
						// the lease's TTL runs out.
						lose: func(t *testing.T, lease *lock.Lease) {
							kv := etcdHolder(t, cl, l, lease)
							if _, err := cl.Revoke(context.Background(), clientv3.LeaseID(kv.Lease)); err != nil {
								t.Fatal(err)
							}
						},
						holds: func(lease *lock.Lease) error {
							q, err := etcdQueueOf(cl, l, lease.Key())
							switch {
							case err != nil:
								return err
							case len(q) == 0:
								return errHolds(lease, "nobody holds it")
							case q[0].CreateRevision != lease.Fence():
								return errHolds(lease, "%s, created at %d, does", q[0].Key, q[0].CreateRevision)
							}
							return nil
						},
						// Counted as waiting a moment before it sends its key,
						// a waiter of another process waits once its key is
						// queued behind the holder's.
						queued: func(t *testing.T, key string) bool { return len(etcdQueue(t, cl, l, key)) >= 2 },
					}
				}
			}
		}}
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
	t.Parallel()
	c := etcdCluster(t)
	cl := c.Client(t)
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

// A waiter that gives up — at the end of its wait, or of its context —
// leaves no key of its own queued in etcd: it is deleted right after
// Obtain returns.
func TestEtcdWaiterThatGaveUpLeavesNoKey(t *testing.T) {
	t.Parallel()
	c := etcdCluster(t)
	cl := c.Client(t)
	prefix := etcdPrefix()
	const wait = 300 * time.Millisecond // the waiter's
	holder := etcdLock(t, cl, prefix, lock.EtcdOptions{})
	waiter := etcdLock(t, c.Client(t), prefix, lock.EtcdOptions{Wait: wait})
	lease := etcdObtain(t, holder, "k")
	defer lease.Release(context.Background())
	for _, w := range []struct {
		name    string
		timeout time.Duration // the caller's context's; 0: none
		want    time.Duration // when Obtain gives up
	}{{"the wait", 0, wait}, {"a shorter context", 100 * time.Millisecond, 100 * time.Millisecond}} {
		start := time.Now() // before the context's deadline is set
		ctx := context.Background()
		if w.timeout > 0 {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, w.timeout)
			defer cancel()
		}
		_, err := waiter.Obtain(ctx, "k")
		returned := time.Now()
		if !errors.Is(err, lock.ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("%s: Obtain = %v, want ErrNotObtained with DeadlineExceeded", w.name, err)
		}
		if took := returned.Sub(start); took < w.want || took > w.want+time.Second {
			t.Errorf("%s: Obtain gave up after %v, want about %v", w.name, took, w.want)
		}
		waitForEtcd(t, w.name+": the waiter's key is deleted", func() bool {
			q := etcdQueue(t, cl, waiter, "k")
			return len(q) == 1 && q[0].CreateRevision == lease.Fence()
		})
		// The session keeps the key alive: only the waiter's delete removes
		// it, well before the session's lease (5 s) could have run out.
		if gone := time.Since(returned); gone > 4*time.Second {
			t.Errorf("%s: the waiter's key was deleted %v after Obtain returned", w.name, gone)
		}
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

// A holder that stops (its member, the only one its client knows, frozen:
// no keep-alive gets through) loses the key after the TTL; the next holder
// writes a row fenced by its token; when the first resumes, its write with
// its older token is refused by MySQL.
func testEtcdPausedHolder(t *testing.T, c *testenv.EtcdCluster) {
	ctx := context.Background()
	row := newFencedRow(t)

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
	if n := row.write("B", leaseB.Fence()); n != 1 {
		t.Fatalf("B's fenced write changed %d rows, want 1", n)
	}

	resume()
	// A wakes up and writes as if it still held the key.
	if n := row.write("A", leaseA.Fence()); n != 0 {
		t.Errorf("A's stale write with token %d changed %d rows, want 0", leaseA.Fence(), n)
	}
	row.holds("B", leaseB.Fence())
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
// stays live for twice the TTL, and nobody else gets it) while the two
// others elect a new leader; after its release the next token is larger;
// the killed member comes back with the key's history. The client gives
// its session up a TTL after the last keep-alive it was answered, which
// may have been a third of a TTL before the kill: the rest must outlast an
// election on a loaded machine (well over a second).
func testEtcdLeaderFailover(t *testing.T, c *testenv.EtcdCluster) {
	prefix := etcdPrefix()
	const ttl = 3 * time.Second
	cl := c.Client(t, c.Endpoints()...)
	holder := etcdLock(t, cl, prefix, lock.EtcdOptions{TTL: ttl})
	lease := etcdObtain(t, holder, "k")
	contender := etcdLock(t, c.Client(t, c.Endpoints()...), prefix, lock.EtcdOptions{Wait: 300 * time.Millisecond})

	leader := c.Leader(t)
	c.Kill(leader)
	killed := time.Now()
	newLeader := c.Leader(t)
	t.Logf("member %d led, member %d leads %v after it was killed", leader, newLeader, time.Since(killed))
	for time.Since(killed) < 2*ttl {
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
func testEtcdRestart(t *testing.T, c *testenv.EtcdCluster) {
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
