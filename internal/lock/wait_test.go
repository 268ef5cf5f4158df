package lock_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"shop/internal/lock"
	"shop/internal/testenv"
)

// never is a backoff so long that a waiter which obtains the lock within a
// test's run can only have been woken by the release.
const never = time.Hour

// waitFor polls cond until it holds, failing the test after 10 s.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting until %s", what)
		}
	}
}

// obtainAsync starts Obtain on l in a goroutine.
func obtainAsync(l interface {
	Obtain(context.Context, string) (*lock.Lease, error)
}, key string) <-chan obtained {
	got := make(chan obtained, 1)
	go func() {
		lease, err := l.Obtain(context.Background(), key)
		got <- obtained{lease, err}
	}()
	return got
}

// stillWaiter is a caller of ObtainWhile (obtainWhileAsync): its check
// passes while wanted is true, and counts its calls; ended gets
// ObtainWhile's error.
type stillWaiter struct {
	checks atomic.Int32
	wanted atomic.Bool
	ended  chan error
}

// obtainWhileAsync starts ObtainWhile on l in a goroutine, with a check
// that returns gone once w.wanted is false; a lease it gets is released.
func obtainWhileAsync(ctx context.Context, l interface {
	ObtainWhile(context.Context, string, func(context.Context) error) (*lock.Lease, error)
}, key string, gone error) *stillWaiter {
	w := &stillWaiter{ended: make(chan error, 1)}
	w.wanted.Store(true)
	go func() {
		lease, err := l.ObtainWhile(ctx, key, func(context.Context) error {
			w.checks.Add(1)
			if !w.wanted.Load() {
				return gone
			}
			return nil
		})
		if lease != nil {
			lease.Release(ctx)
		}
		w.ended <- err
	}()
	return w
}

// obtained is what an Obtain of obtainAsync returned.
type obtained struct {
	lease *lock.Lease
	err   error
}

// line starts n waiters for key on l, one after the other, each once the
// one before is waiting.
func line(t *testing.T, l *lock.Redis, key string, n int) []<-chan obtained {
	t.Helper()
	var got []<-chan obtained
	for i := range n {
		got = append(got, obtainAsync(l, key))
		waitFor(t, "the waiter is in line", func() bool { return l.Stats().Waiting == i+1 })
	}
	return got
}

// received waits for a waiter's result.
func received(t *testing.T, got <-chan obtained) *lock.Lease {
	t.Helper()
	select {
	case r := <-got:
		if r.err != nil {
			t.Fatalf("the waiter did not obtain the lock: %v", r.err)
		}
		return r.lease
	case <-time.After(30 * time.Second):
		t.Fatal("the waiter is still waiting after the release")
	}
	return nil
}

func TestWaitersInProcessAreHandedTheKey(t *testing.T) {
	t.Parallel()
	testenv.EachTopology(t, func(t *testing.T, topo testenv.Topology) {
		t.Parallel()
		c, prefix := lockRedisOn(t, topo)
		l := lock.NewRedis(c, lock.RedisOptions{Prefix: prefix, Subscriber: c, MinBackoff: never, MaxBackoff: never, Wait: time.Minute})
		t.Cleanup(func() { l.Close() })
		ctx := context.Background()

		const waiters = 5
		holder := obtain(t, l, "k")
		got := line(t, l, "k", waiters)
		// Each release hands the key to the next waiter, in the order they
		// came, and that waiter's one try in Redis gets it: nobody polls.
		lease := holder
		for i := range waiters {
			if err := lease.Release(ctx); err != nil {
				t.Fatal(err)
			}
			next := received(t, got[i])
			if next.Fence() <= lease.Fence() {
				t.Errorf("fence %d after %d", next.Fence(), lease.Fence())
			}
			lease = next
			if s := l.Stats(); s.Attempts != uint64(1+i+1) || s.Waiting != waiters-i-1 {
				t.Fatalf("after release %d: stats = %+v, want %d attempts (one per acquisition) and %d waiting", i+1, s, 1+i+1, waiters-i-1)
			}
		}
		lease.Release(ctx)
	})
}

func TestWakeOnReleaseAcrossProcesses(t *testing.T) {
	t.Parallel()
	testenv.EachTopology(t, func(t *testing.T, topo testenv.Topology) {
		t.Parallel()
		_, prefix := testenv.RedisOn(t, topo)
		a, c := wokenProcess(t, topo, prefix)
		b, _ := wokenProcess(t, topo, prefix)
		ctx := context.Background()

		// B's three waiters: the first tries once and waits for the release
		// to be announced, the other two wait behind it without trying.
		const waiters = 3
		holder := obtain(t, a, "k")
		got := line(t, b, "k", waiters)
		waitFor(t, "B subscribed and flagged the key", func() bool {
			return subscribers(c, prefix+"released") == 1 &&
				c.Exists(ctx, a.Key("k")+":waiting").Val() == 1
		})
		if s := b.Stats(); s.Attempts != 1 {
			t.Fatalf("B's stats before the release = %+v, want 1 attempt: only the first in line tries", s)
		}
		if err := holder.Release(ctx); err != nil {
			t.Fatal(err)
		}
		lease := received(t, got[0])
		if s := b.Stats(); s.Attempts != 2 || s.Wakeups != 1 {
			t.Errorf("B's stats = %+v, want 2 attempts and 1 wakeup: its backoff is an hour", s)
		}
		for i := 1; i < waiters; i++ {
			lease.Release(ctx)
			lease = received(t, got[i])
		}
		lease.Release(ctx)
		if s := b.Stats(); s.Attempts != 2+waiters-1 {
			t.Errorf("B's stats at the end = %+v, want %d attempts", s, 2+waiters-1)
		}
	})
}

func TestWakeMissedFallsBackToBackoff(t *testing.T) {
	t.Parallel()
	c, prefix := testenv.Redis(t)
	// The holder does not announce its release (as if the message were
	// lost); the waiter must still get the lock, on its backoff.
	silent := lock.NewRedis(c, lock.RedisOptions{Prefix: prefix})
	l := lock.NewRedis(c, lock.RedisOptions{Prefix: prefix, Subscriber: c, MinBackoff: 5 * time.Millisecond, MaxBackoff: 20 * time.Millisecond, Wait: time.Minute})
	t.Cleanup(func() { l.Close() })
	ctx := context.Background()

	holder := obtain(t, silent, "k")
	got := obtainAsync(l, "k")
	waitFor(t, "the waiter tried thrice", func() bool { return l.Stats().Attempts >= 3 })
	if err := holder.Release(ctx); err != nil {
		t.Fatal(err)
	}
	lease := received(t, got)
	defer lease.Release(ctx)
	if s := l.Stats(); s.Wakeups != 0 {
		t.Errorf("stats = %+v, want no wakeups: nothing was announced", s)
	}
}

func TestReleaseAnnouncedOnlyWhenWaitedFor(t *testing.T) {
	t.Parallel()
	addr := testenv.StartRedis(t).Addr
	c := testenv.RedisAt(t, addr)
	l := lock.NewRedis(c, lock.RedisOptions{Subscriber: c, MinBackoff: never, MaxBackoff: never, Wait: time.Minute})
	t.Cleanup(func() { l.Close() })
	ctx := context.Background()
	publishes := func() int64 { return commandStats(t, c)["publish"] }

	for range 10 {
		obtain(t, l, "k").Release(ctx)
	}
	if n := publishes(); n != 0 {
		t.Errorf("%d PUBLISH after 10 releases nobody waited for, want 0", n)
	}

	// A waiter in another process flags the key; the release is announced.
	other := testenv.RedisAt(t, addr)
	b := lock.NewRedis(other, lock.RedisOptions{Subscriber: other, MinBackoff: never, MaxBackoff: never, Wait: time.Minute})
	t.Cleanup(func() { b.Close() })
	holder := obtain(t, l, "k")
	got := obtainAsync(b, "k")
	waitFor(t, "the waiter subscribed and flagged the key", func() bool {
		return c.PubSubNumSub(ctx, "shop:lock:released").Val()["shop:lock:released"] == 1 &&
			c.Exists(ctx, l.Key("k")+":waiting").Val() == 1
	})
	holder.Release(ctx)
	received(t, got).Release(ctx)
	if n := publishes(); n != 1 {
		t.Errorf("%d PUBLISH after a release with a waiter, want 1", n)
	}
}

func TestWaitInLineCountsAgainstTheBudget(t *testing.T) {
	// Not in parallel with the other tests: its margin is 400 ms.
	c, prefix := testenv.Redis(t)
	const wait = time.Second
	l := lock.NewRedis(c, lock.RedisOptions{Prefix: prefix, Subscriber: c, Wait: wait})
	t.Cleanup(func() { l.Close() })
	// Held by another process, so that this one's first waiter polls Redis.
	holder := obtain(t, lock.NewRedis(c, lock.RedisOptions{Prefix: prefix}), "k")
	defer holder.Release(context.Background())

	// The first waiter polls Redis until its caller gives up, 0.8 s in; the
	// second waits in line behind it, then polls. It must give up when its
	// own wait is over, the time in line included, not a wait later.
	start := time.Now()
	first := make(chan error, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), wait*8/10)
		defer cancel()
		_, err := l.Obtain(ctx, "k")
		first <- err
	}()
	waitFor(t, "the first waiter polls", func() bool { return l.Stats().Waiting == 1 })
	_, err := l.Obtain(context.Background(), "k")
	if !errors.Is(err, lock.ErrNotObtained) {
		t.Fatalf("second waiter: err = %v, want ErrNotObtained", err)
	}
	if elapsed := time.Since(start); elapsed > wait*14/10 {
		t.Errorf("the second waiter gave up after %v, well past its %v wait", elapsed, wait)
	}
	if err := <-first; !errors.Is(err, lock.ErrNotObtained) {
		t.Errorf("first waiter: err = %v, want ErrNotObtained", err)
	}
}

// A lock without fencing (the cache's mutex) wakes its waiters too: an
// attempt that finds the key held flags it, as with fencing.
func TestWakeOnReleaseWithoutFencing(t *testing.T) {
	t.Parallel()
	testenv.EachTopology(t, func(t *testing.T, topo testenv.Topology) {
		t.Parallel()
		c, prefix := lockRedisOn(t, topo)
		opt := lock.RedisOptions{Prefix: prefix, NoFencing: true, Subscriber: c, MinBackoff: never, MaxBackoff: never, Wait: time.Minute}
		a, b := lock.NewRedis(c, opt), lock.NewRedis(c, opt)
		t.Cleanup(func() { a.Close(); b.Close() })
		ctx := context.Background()

		holder := obtain(t, a, "k")
		got := obtainAsync(b, "k")
		// Registered for a wake-up too (Waiting): a release announced
		// between its subscription and its registration would be missed,
		// and only its backoff, an hour here, would retry.
		waitFor(t, "the waiter subscribed, flagged the key and waits for a wake-up", func() bool {
			return subscribers(c, prefix+"released") == 1 &&
				c.Exists(ctx, a.Key("k")+":waiting").Val() == 1 && b.Stats().Waiting == 1
		})
		if err := holder.Release(ctx); err != nil {
			t.Fatal(err)
		}
		lease := received(t, got)
		defer lease.Release(ctx)
		if s := b.Stats(); s.Attempts != 2 || s.Wakeups != 1 {
			t.Errorf("stats = %+v, want 2 attempts and 1 wakeup: its backoff is an hour", s)
		}
	})
}

// A waiter that finds its Redis answering as a replica (READONLY: a
// Sentinel failover has demoted the master, and the client has not yet
// heard of the new one) backs off and tries again within its wait, and
// gets the lock once the client writes to a master again; a wait that runs
// out says why.
func TestWaitOutlastsReadOnly(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	master, replica := testenv.StartRedis(t), testenv.StartRedis(t)
	c := lockClient(t, replica.Addr, true)
	host, port, _ := strings.Cut(master.Addr, ":")
	if err := c.ReplicaOf(ctx, host, port).Err(); err != nil {
		t.Fatal(err)
	}
	l := lock.NewRedis(c, lock.RedisOptions{Subscriber: c, Wait: time.Minute})
	t.Cleanup(func() { l.Close() })

	type result struct {
		lease *lock.Lease
		err   error
	}
	got := make(chan result, 1)
	go func() {
		lease, err := l.Obtain(ctx, "k")
		got <- result{lease, err}
	}()
	var r result
	waitFor(t, "the waiter tried thrice", func() bool {
		select {
		case r = <-got:
			t.Fatalf("Obtain ended within its wait while Redis answered READONLY: %v", r.err)
		default:
		}
		return l.Stats().Attempts >= 3
	})
	if err := c.ReplicaOf(ctx, "NO", "ONE").Err(); err != nil { // promoted
		t.Fatal(err)
	}
	if r = <-got; r.err != nil {
		t.Fatalf("Obtain once promoted: %v", r.err)
	}
	r.lease.Release(ctx)

	if err := c.ReplicaOf(ctx, host, port).Err(); err != nil {
		t.Fatal(err)
	}
	// The waits leave room for answers on a loaded machine: a wait that
	// ends before the replica has answered has no READONLY to report.
	short := lock.NewRedis(c, lock.RedisOptions{Wait: 2 * time.Second})
	_, err := short.Obtain(ctx, "k")
	if !errors.Is(err, lock.ErrNotObtained) || !redis.IsReadOnlyError(err) {
		t.Errorf("Obtain from a replica = %v, want ErrNotObtained with the READONLY", err)
	}

	// The replica stops answering, once it has answered a try, before the
	// wait ends: the last try is cut short by the wait's end, with no
	// answer, and the READONLY is still the last thing Redis said.
	stalled := lock.NewRedis(c, lock.RedisOptions{Wait: 2 * time.Second})
	ended := make(chan error, 1)
	go func() {
		_, err := stalled.Obtain(ctx, "k")
		ended <- err
	}()
	waitFor(t, "the first try was answered", func() bool {
		select {
		case err := <-ended:
			t.Fatalf("Obtain ended before its first try was answered: %v", err)
		default:
		}
		return stalled.Stats().Attempts >= 2
	})
	replica.Pause()
	defer replica.Resume()
	if err := <-ended; !errors.Is(err, lock.ErrNotObtained) || !redis.IsReadOnlyError(err) {
		t.Errorf("Obtain from a replica that stopped answering = %v, want ErrNotObtained with the READONLY", err)
	}
}
