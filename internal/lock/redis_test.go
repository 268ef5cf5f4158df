package lock_test

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"shop/internal/lock"
	"shop/internal/testenv"
)

// newRedis returns a Redis lock with a key prefix of the test's own, and the
// client it uses.
func newRedis(t *testing.T, opt lock.RedisOptions) (*lock.Redis, *redis.Client) {
	t.Helper()
	c, prefix := testenv.Redis(t)
	opt.Prefix = prefix
	return lock.NewRedis(c, opt), c
}

// frozen is a watchdog timer that never fires: the holder behaves as if its
// process were stopped.
func frozen(time.Duration) <-chan time.Time { return nil }

// lockClient is a client of the Redis at addr as the lock wants it (see
// lock.Client): go-redis never retries a command by itself, so the lock
// alone decides what a lost reply means. cte makes go-redis honour the
// deadlines of contexts.
func lockClient(t *testing.T, addr string, cte bool) *redis.Client {
	t.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1, ContextTimeoutEnabled: cte})
	t.Cleanup(func() { c.Close() })
	return c
}

func obtain(t *testing.T, l interface {
	Obtain(context.Context, string) (*lock.Lease, error)
}, key string) *lock.Lease {
	t.Helper()
	lease, err := l.Obtain(context.Background(), key)
	if err != nil {
		t.Fatalf("obtain %q: %v", key, err)
	}
	return lease
}

func TestRedisMutualExclusion(t *testing.T) {
	testenv.EachTopology(t, func(t *testing.T, topo testenv.Topology) {
		l, _ := newRedisOn(t, topo, lock.RedisOptions{TTL: 5 * time.Second, Wait: 30 * time.Second})
		const workers = 100
		var (
			inside, maxInside atomic.Int32
			counter           int // guarded by the lock alone; -race watches it
			wg                sync.WaitGroup
			errs              = make(chan error, workers)
		)
		for range workers {
			wg.Go(func() {
				lease, err := l.Obtain(context.Background(), "sku:1")
				if err != nil {
					errs <- err
					return
				}
				n := inside.Add(1)
				if n > maxInside.Load() {
					maxInside.Store(n)
				}
				v := counter
				time.Sleep(time.Millisecond)
				counter = v + 1
				inside.Add(-1)
				if err := lease.Release(context.Background()); err != nil {
					errs <- err
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Fatal(err)
		}
		if got := maxInside.Load(); got != 1 {
			t.Errorf("%d holders inside at once, want 1", got)
		}
		if counter != workers {
			t.Errorf("counter = %d, want %d: increments were lost", counter, workers)
		}
	})
}

func TestRedisWrongTokenCanNeitherReleaseNorRenew(t *testing.T) {
	testenv.EachTopology(t, func(t *testing.T, topo testenv.Topology) {
		l, c := newRedisOn(t, topo, lock.RedisOptions{TTL: 300 * time.Millisecond})
		ctx := context.Background()
		lease := obtain(t, l, "k")

		// Someone else now holds the key (our lease was lost, say by a failover).
		if err := c.Set(ctx, l.Key("k"), "other-token", time.Minute).Err(); err != nil {
			t.Fatal(err)
		}
		// The watchdog's renewal must not extend the other holder's lease, and
		// must tell our holder it lost the lock.
		select {
		case <-lease.Context().Done():
		case <-time.After(5 * time.Second):
			t.Fatal("lease context not cancelled after the key changed hands")
		}
		if ttl := c.PTTL(ctx, l.Key("k")).Val(); ttl < 50*time.Second {
			t.Errorf("other holder's TTL = %v: our renewal touched it", ttl)
		}
		if err := lease.Release(ctx); !errors.Is(err, lock.ErrNotHeld) {
			t.Errorf("Release = %v, want ErrNotHeld", err)
		}
		if v := c.Get(ctx, l.Key("k")).Val(); v != "other-token" {
			t.Errorf("key holds %q after our release, want the other holder's token", v)
		}
	})
}

func TestRedisExpiredLeaseFreesKey(t *testing.T) {
	paused, c := newRedis(t, lock.RedisOptions{TTL: 200 * time.Millisecond, After: frozen})
	ctx := context.Background()
	lease := obtain(t, paused, "k")
	if ttl := c.PTTL(ctx, paused.Key("k")).Val(); ttl <= 0 || ttl > 200*time.Millisecond {
		t.Fatalf("PTTL = %v, want (0, 200ms]", ttl)
	}
	other := lock.NewRedis(c, lock.RedisOptions{Prefix: keyPrefix(paused), TTL: time.Second, Wait: 2 * time.Second})
	next, err := other.Obtain(ctx, "k")
	if err != nil {
		t.Fatalf("the key was not freed by expiry: %v", err)
	}
	if next.Fence() <= lease.Fence() {
		t.Errorf("fence after expiry %d, want > %d", next.Fence(), lease.Fence())
	}
	if err := lease.Release(ctx); !errors.Is(err, lock.ErrNotHeld) {
		t.Errorf("expired holder's Release = %v, want ErrNotHeld", err)
	}
	if err := next.Release(ctx); err != nil {
		t.Errorf("new holder's Release: %v", err)
	}
}

// keyPrefix recovers the prefix a Redis lock was built with.
func keyPrefix(l *lock.Redis) string {
	k := l.Key("x")
	return k[:len(k)-len("{x}")]
}

func TestRedisWatchdogKeepsLockForThreeTTLs(t *testing.T) {
	testenv.EachTopology(t, func(t *testing.T, topo testenv.Topology) {
		// A renewal has 2/3 of the TTL to answer before the watchdog gives the
		// lease up: 400 ms, ample for a loaded machine under -race.
		const ttl = 600 * time.Millisecond
		l, c := newRedisOn(t, topo, lock.RedisOptions{TTL: ttl, Wait: 20 * time.Millisecond})
		ctx := context.Background()
		lease := obtain(t, l, "k")
		token := c.Get(ctx, l.Key("k")).Val()

		time.Sleep(3*ttl + ttl/2)

		if err := lease.Context().Err(); err != nil {
			t.Fatalf("lease context ended while held: %v", context.Cause(lease.Context()))
		}
		if got := c.Get(ctx, l.Key("k")).Val(); got != token {
			t.Fatalf("after 3.5×TTL the key holds %q, want the holder's token %q", got, token)
		}
		if _, err := l.Obtain(ctx, "k"); !errors.Is(err, lock.ErrNotObtained) {
			t.Fatalf("second Obtain = %v, want ErrNotObtained", err)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if n := c.Exists(ctx, l.Key("k")).Val(); n != 0 {
			t.Errorf("key still exists after Release")
		}
		// Released: the watchdog must not bring it back.
		time.Sleep(ttl)
		if n := c.Exists(ctx, l.Key("k")).Val(); n != 0 {
			t.Errorf("key reappeared after Release")
		}
	})
}

func TestRedisLostLeaseCancelsContext(t *testing.T) {
	l, c := newRedis(t, lock.RedisOptions{TTL: 300 * time.Millisecond})
	ctx := context.Background()
	lease := obtain(t, l, "k")
	if err := c.Del(ctx, l.Key("k")).Err(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-lease.Context().Done():
	case <-time.After(5 * time.Second):
		t.Fatal("lease context not cancelled after the lock vanished")
	}
	if cause := context.Cause(lease.Context()); !errors.Is(cause, lock.ErrNotHeld) {
		t.Errorf("cause = %v, want ErrNotHeld", cause)
	}
}

// The watchdog cancels a lease whose renewals go unanswered no later than
// the moment the lease may run out in Redis, whatever the client does with
// the context's deadline.
func TestWatchdogCancelsByValidUntil(t *testing.T) {
	const ttl, slack = 600 * time.Millisecond, 250 * time.Millisecond
	check := func(t *testing.T, lease *lock.Lease) {
		t.Helper()
		select {
		case <-lease.Context().Done():
		case <-time.After(30 * time.Second):
			t.Fatal("the lease was not cancelled while Redis was paused")
		}
		if late := time.Since(lease.Until()); late > slack {
			t.Errorf("cancelled %v after the lease could run out, want at most %v", late, slack)
		}
		if cause := context.Cause(lease.Context()); !errors.Is(cause, lock.ErrNotHeld) {
			t.Errorf("cause = %v, want ErrNotHeld", cause)
		}
	}
	for _, cte := range []bool{true, false} {
		name := map[bool]string{true: "redis, deadlines honoured", false: "redis, deadlines ignored"}[cte]
		t.Run(name, func(t *testing.T) {
			p := testenv.StartRedis(t)
			l := lock.NewRedis(lockClient(t, p.Addr, cte), lock.RedisOptions{TTL: ttl})
			lease := obtain(t, l, "k")
			p.Pause()
			t.Cleanup(p.Resume)
			check(t, lease)
		})
	}
	t.Run("redlock, slow node timeout", func(t *testing.T) {
		c := newCluster(t, 3)
		// A node timeout longer than the lease: a renewal may still be
		// waiting for the nodes when the lease runs out.
		l := c.lock(t, lock.RedisOptions{TTL: ttl, NodeTimeout: 2 * time.Second})
		lease := obtain(t, l, "k")
		for _, p := range c.procs[1:] {
			p.Pause()
			t.Cleanup(p.Resume)
		}
		check(t, lease)
	})
}

func TestRedisFencingTokensIncrease(t *testing.T) {
	testenv.EachTopology(t, func(t *testing.T, topo testenv.Topology) {
		l, c := newRedisOn(t, topo, lock.RedisOptions{TTL: time.Second, Wait: 10 * time.Second})
		ctx := context.Background()

		// Concurrent holders: tokens in the order the lock was held must rise.
		var (
			mu     sync.Mutex
			tokens []int64
			wg     sync.WaitGroup
		)
		for range 30 {
			wg.Go(func() {
				lease, err := l.Obtain(ctx, "k")
				if err != nil {
					t.Error(err)
					return
				}
				mu.Lock()
				tokens = append(tokens, lease.Fence())
				mu.Unlock()
				if err := lease.Release(ctx); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
		for i := 1; i < len(tokens); i++ {
			if tokens[i] <= tokens[i-1] {
				t.Fatalf("token %d = %d after %d: not increasing (%v)", i, tokens[i], tokens[i-1], tokens)
			}
		}
		last := tokens[len(tokens)-1]

		// Other keys count on their own.
		other := obtain(t, l, "other")
		if err := other.Release(ctx); err != nil {
			t.Fatal(err)
		}

		// A Redis that lost its counters (restarted empty) still issues tokens
		// above every earlier one.
		if err := c.Del(ctx, l.FenceKey("k")).Err(); err != nil {
			t.Fatal(err)
		}
		after := obtain(t, l, "k")
		if after.Fence() <= last {
			t.Errorf("token after losing the counter = %d, want > %d", after.Fence(), last)
		}
		_ = after.Release(ctx)
	})
}

func TestRedisWaitIsBounded(t *testing.T) {
	l, c := newRedis(t, lock.RedisOptions{TTL: 5 * time.Second, Wait: 200 * time.Millisecond})
	ctx := context.Background()
	holder := obtain(t, l, "k")
	defer holder.Release(ctx)

	t.Run("wait budget", func(t *testing.T) {
		start := time.Now()
		_, err := l.Obtain(ctx, "k")
		elapsed := time.Since(start)
		if !errors.Is(err, lock.ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v, want ErrNotObtained joined with DeadlineExceeded", err)
		}
		if elapsed < 200*time.Millisecond {
			t.Errorf("gave up after %v, before the 200ms wait", elapsed)
		}
	})
	t.Run("caller deadline", func(t *testing.T) {
		long := lock.NewRedis(c, lock.RedisOptions{Prefix: keyPrefix(l), Wait: time.Minute})
		dctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
		defer cancel()
		start := time.Now()
		_, err := long.Obtain(dctx, "k")
		if !errors.Is(err, lock.ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) {
			t.Fatalf("err = %v, want ErrNotObtained joined with DeadlineExceeded", err)
		}
		if elapsed := time.Since(start); elapsed > 10*time.Second {
			t.Errorf("waited %v past a 100ms deadline", elapsed)
		}
	})
	t.Run("caller cancel", func(t *testing.T) {
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if _, err := l.Obtain(cctx, "k"); !errors.Is(err, lock.ErrNotObtained) || !errors.Is(err, context.Canceled) {
			t.Fatalf("err = %v, want ErrNotObtained joined with Canceled", err)
		}
	})
}

// A try cut short by its context's deadline is a wait that ran out, not a
// Redis error, even before the context's timer has fired: the connection's
// deadline, taken from the context's, times the command out at that instant,
// and on a loaded machine the timer fires a moment later. timerNotFired
// stands for that moment, with a Redis that has stopped answering.
func TestTryCutByItsDeadlineIsNotObtained(t *testing.T) {
	ctx := context.Background()
	p := testenv.StartRedis(t)
	c := lockClient(t, p.Addr, true)
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	l := lock.NewRedis(c, lock.RedisOptions{})
	p.Pause()
	defer p.Resume()
	_, err := l.TryObtain(timerNotFired{ctx, time.Now().Add(50 * time.Millisecond)}, "k")
	if !errors.Is(err, lock.ErrNotObtained) || !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("err = %v, want ErrNotObtained joined with DeadlineExceeded", err)
	}
}

// timerNotFired is a context whose deadline has passed and whose timer has
// not fired: Done is open and Err is nil.
type timerNotFired struct {
	context.Context
	deadline time.Time
}

func (c timerNotFired) Deadline() (time.Time, bool) { return c.deadline, true }

func TestRedisDown(t *testing.T) {
	c := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1})
	defer c.Close()
	l := lock.NewRedis(c, lock.RedisOptions{Wait: 5 * time.Second})
	start := time.Now()
	_, err := l.Obtain(context.Background(), "k")
	if err == nil || errors.Is(err, lock.ErrNotObtained) {
		t.Fatalf("err = %v, want the connection error", err)
	}
	if elapsed := time.Since(start); elapsed > 4*time.Second {
		t.Errorf("took %v to report Redis down; it should not wait out the lock wait", elapsed)
	}
}

func TestRedisTryObtainWithoutFencing(t *testing.T) {
	l, c := newRedis(t, lock.RedisOptions{TTL: 5 * time.Second, NoFencing: true})
	ctx := context.Background()

	first, err := l.TryObtain(ctx, "k")
	if err != nil {
		t.Fatalf("TryObtain on a free key: %v", err)
	}
	if first.Fence() != 0 {
		t.Errorf("Fence = %d without fencing, want 0", first.Fence())
	}
	if n := c.Exists(ctx, l.FenceKey("k")).Val(); n != 0 {
		t.Errorf("fencing counter exists without fencing")
	}

	start := time.Now()
	second, err := l.TryObtain(ctx, "k")
	if !errors.Is(err, lock.ErrNotObtained) || second != nil {
		t.Fatalf("TryObtain on a held key = %v, %v; want ErrNotObtained", second, err)
	}
	if d := time.Since(start); d > time.Second {
		t.Errorf("TryObtain on a held key took %v: it must not wait", d)
	}
	if err := first.Release(ctx); err != nil {
		t.Fatal(err)
	}
	if n := c.Exists(ctx, l.Key("k")).Val(); n != 0 {
		t.Errorf("lock key still exists after release")
	}
	again, err := l.TryObtain(ctx, "k")
	if err != nil {
		t.Fatalf("TryObtain after release: %v", err)
	}
	_ = again.Release(ctx)
}
