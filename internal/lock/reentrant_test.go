package lock_test

import (
	"context"
	"errors"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"shop/internal/lock"
	"shop/internal/testenv"
)

func newReentrant(t *testing.T, opt lock.RedisOptions) (*lock.Reentrant, *redis.Client) {
	t.Helper()
	c, prefix := lockRedis(t)
	opt.Prefix = prefix
	l := lock.NewReentrant(c, opt)
	t.Cleanup(func() { l.Close() })
	return l, c
}

// hold reads the lock's hash: its owner's depth ("" owner when free).
func hold(t *testing.T, c redis.Cmdable, l *lock.Reentrant, key string) (owner string, depth int) {
	t.Helper()
	h, err := c.HGetAll(context.Background(), l.Key(key)).Result()
	if err != nil {
		t.Fatal(err)
	}
	if h["depth"] != "" {
		if depth, err = strconv.Atoi(h["depth"]); err != nil {
			t.Fatal(err)
		}
	}
	return h["owner"], depth
}

// obtainAs takes l on key for the owner in ctx.
func obtainAs(t *testing.T, l *lock.Reentrant, owner context.Context, key string) *lock.Lease {
	t.Helper()
	lease, err := l.Obtain(owner, key)
	if err != nil {
		t.Fatalf("obtain %q: %v", key, err)
	}
	return lease
}

func TestReentrantDepth(t *testing.T) {
	t.Parallel()
	testenv.EachTopology(t, func(t *testing.T, topo testenv.Topology) {
		t.Parallel()
		l, c := newReentrantOn(t, topo, lock.RedisOptions{TTL: 5 * time.Second})
		a := lock.WithOwner(context.Background(), lock.NewOwner())

		var leases []*lock.Lease
		for i := 1; i <= 3; i++ {
			lease, err := l.Obtain(a, "k")
			if err != nil {
				t.Fatalf("acquisition %d by the owner: %v", i, err)
			}
			leases = append(leases, lease)
			if _, depth := hold(t, c, l, "k"); depth != i {
				t.Fatalf("depth after %d acquisitions = %d", i, depth)
			}
		}
		if leases[0].Fence() <= 0 || leases[1].Fence() != leases[0].Fence() || leases[2].Fence() != leases[0].Fence() {
			t.Errorf("fences %d %d %d, want one token for the whole hold", leases[0].Fence(), leases[1].Fence(), leases[2].Fence())
		}
		for i := 2; i >= 1; i-- {
			if err := leases[i].Release(context.Background()); err != nil {
				t.Fatal(err)
			}
			if owner, depth := hold(t, c, l, "k"); owner == "" || depth != i {
				t.Fatalf("after a release: owner %q depth %d, want still held at depth %d", owner, depth, i)
			}
		}
		if err := leases[0].Release(context.Background()); err != nil {
			t.Fatal(err)
		}
		if n := c.Exists(context.Background(), l.Key("k")).Val(); n != 0 {
			t.Error("the lock still exists after the last release")
		}
	})
}

func TestReentrantOtherOwnerRefused(t *testing.T) {
	t.Parallel()
	testenv.EachTopology(t, func(t *testing.T, topo testenv.Topology) {
		t.Parallel()
		l, c := newReentrantOn(t, topo, lock.RedisOptions{TTL: 5 * time.Second})
		// Another process's lock on the same keys, whose callers give up
		// at once.
		impatient := lock.NewReentrant(c, lock.RedisOptions{Prefix: keyPrefix(l), TTL: 5 * time.Second, Wait: 100 * time.Millisecond})
		t.Cleanup(func() { impatient.Close() })
		a := lock.WithOwner(context.Background(), lock.NewOwner())
		b := lock.WithOwner(context.Background(), lock.NewOwner())

		held := obtainAs(t, l, a, "k")
		if _, err := impatient.Obtain(b, "k"); !errors.Is(err, lock.ErrNotObtained) {
			t.Fatalf("another owner's Obtain = %v, want ErrNotObtained", err)
		}
		if _, depth := hold(t, c, l, "k"); depth != 1 {
			t.Errorf("depth %d after the refusal, want 1: the refused owner changed it", depth)
		}
		if _, err := l.Obtain(context.Background(), "k"); !errors.Is(err, lock.ErrNoOwner) {
			t.Errorf("Obtain without an owner = %v, want ErrNoOwner", err)
		}
		// Released, it is b's.
		if err := held.Release(a); err != nil {
			t.Fatal(err)
		}
		next, err := l.Obtain(b, "k")
		if err != nil {
			t.Fatalf("other owner after the release: %v", err)
		}
		if next.Fence() <= held.Fence() {
			t.Errorf("next hold's fence %d, want > %d", next.Fence(), held.Fence())
		}
		next.Release(b)
	})
}

func TestReentrantWatchdogKeepsWholeHold(t *testing.T) {
	t.Parallel()
	// A renewal has 2/3 of the TTL to answer before the watchdog gives the
	// lease up: two seconds, for a loaded machine under -race (a second and
	// a third was seen not to be enough).
	const ttl = 3 * time.Second
	l, c := newReentrant(t, lock.RedisOptions{TTL: ttl})
	a := lock.WithOwner(context.Background(), lock.NewOwner())

	outer := obtainAs(t, l, a, "k")
	inner := obtainAs(t, l, a, "k")
	// The inner acquisition ends; the outer one's watchdog keeps the hold
	// alive over two TTLs.
	if err := inner.Release(a); err != nil {
		t.Fatal(err)
	}
	time.Sleep(2 * ttl)
	if owner, depth := hold(t, c, l, "k"); owner == "" || depth != 1 {
		t.Fatalf("after 2×TTL: owner %q depth %d, want held at depth 1", owner, depth)
	}
	if err := outer.Context().Err(); err != nil {
		t.Fatalf("outer lease lost: %v", context.Cause(outer.Context()))
	}
	if err := outer.Release(a); err != nil {
		t.Fatal(err)
	}
}

func TestReentrantExpiry(t *testing.T) {
	t.Parallel()
	// A frozen owner: its watchdog never renews, as in a long pause. The
	// next owner's is live: its hold, renewed, outlasts the checks below
	// on a loaded machine.
	c, prefix := lockRedis(t)
	l := lock.NewReentrant(c, lock.RedisOptions{Prefix: prefix, TTL: 200 * time.Millisecond, Wait: 5 * time.Second, After: frozen})
	live := lock.NewReentrant(c, lock.RedisOptions{Prefix: prefix, Wait: 5 * time.Second})
	t.Cleanup(func() { l.Close(); live.Close() })
	a := lock.WithOwner(context.Background(), lock.NewOwner())
	b := lock.WithOwner(context.Background(), lock.NewOwner())

	first := obtainAs(t, l, a, "k")
	again := obtainAs(t, l, a, "k")
	// The whole hold, depth 2, expires together; b gets the lock.
	taken, err := live.Obtain(b, "k")
	if err != nil {
		t.Fatalf("the expired hold did not free the lock: %v", err)
	}
	if owner, depth := hold(t, c, l, "k"); depth != 1 || owner == "" {
		t.Fatalf("after expiry: owner %q depth %d, want b at depth 1", owner, depth)
	}
	// a's releases must not touch b's hold.
	for _, lease := range []*lock.Lease{again, first} {
		if err := lease.Release(a); !errors.Is(err, lock.ErrNotHeld) {
			t.Errorf("expired owner's Release = %v, want ErrNotHeld", err)
		}
	}
	if _, depth := hold(t, c, l, "k"); depth != 1 {
		t.Errorf("b's depth %d after a's releases, want 1", depth)
	}
	if err := taken.Release(b); err != nil {
		t.Fatal(err)
	}
}

func TestReentrantWakesWaiterOnLastRelease(t *testing.T) {
	t.Parallel()
	testenv.EachTopology(t, func(t *testing.T, topo testenv.Topology) {
		t.Parallel()
		c, prefix := lockRedisOn(t, topo)
		l := lock.NewReentrant(c, lock.RedisOptions{Prefix: prefix, Subscriber: c, MinBackoff: never, MaxBackoff: never, Wait: time.Minute})
		t.Cleanup(func() { l.Close() })
		a := lock.WithOwner(context.Background(), lock.NewOwner())
		b := lock.WithOwner(context.Background(), lock.NewOwner())

		outer := obtainAs(t, l, a, "k")
		inner := obtainAs(t, l, a, "k")
		got := obtainAsync(ownerLock{l, b}, "k")
		waitFor(t, "b waits, subscribed, having flagged the key", func() bool {
			return l.Stats().Waiting == 1 && subscribers(c, prefix+"released") == 1 &&
				c.Exists(context.Background(), l.Key("k")+":waiting").Val() == 1
		})
		// The inner release frees nothing and announces nothing; the outer one
		// wakes b, whose backoff is an hour.
		inner.Release(a)
		outer.Release(a)
		lease := received(t, got)
		defer lease.Release(b)
		if s := l.Stats(); s.Wakeups != 1 {
			t.Errorf("stats = %+v, want 1 wakeup", s)
		}
	})
}

// ownerLock obtains l for a fixed owner.
type ownerLock struct {
	l     *lock.Reentrant
	owner context.Context
}

func (o ownerLock) Key(key string) string { return o.l.Key(key) }

func (o ownerLock) Obtain(_ context.Context, key string) (*lock.Lease, error) {
	return o.l.Obtain(o.owner, key)
}

// A hold that ended (expired, or lost with its Redis) is not the owner's
// next hold: a late Release or renewal of the old one must leave the new one
// alone.
func TestReentrantOldHoldCannotTouchNewHold(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Run("release after expiry", func(t *testing.T) {
		l, c := newReentrant(t, lock.RedisOptions{TTL: 200 * time.Millisecond, Wait: 5 * time.Second, After: frozen})
		// The new hold is renewed, so that it outlasts the checks below on
		// a loaded machine.
		live := lock.NewReentrant(c, lock.RedisOptions{Prefix: keyPrefix(l), Wait: 5 * time.Second})
		t.Cleanup(func() { live.Close() })
		a := lock.WithOwner(ctx, lock.NewOwner())
		old := obtainAs(t, l, a, "k")
		waitFor(t, "the frozen hold expired", func() bool { return c.Exists(ctx, l.Key("k")).Val() == 0 })
		taken := obtainAs(t, live, a, "k") // the same owner: a new hold
		if err := old.Release(a); !errors.Is(err, lock.ErrNotHeld) {
			t.Errorf("the expired hold's Release = %v, want ErrNotHeld", err)
		}
		if owner, depth := hold(t, c, l, "k"); owner == "" || depth != 1 {
			t.Fatalf("after the old hold's release: owner %q depth %d, want the new hold at depth 1", owner, depth)
		}
		if err := taken.Release(a); err != nil {
			t.Fatal(err)
		}
	})
	t.Run("renewal after loss", func(t *testing.T) {
		c, prefix := testenv.Redis(t)
		tick := make(chan time.Time)
		// The old lease's TTL is the longer, so that its renewal would show.
		stopped := lock.NewReentrant(c, lock.RedisOptions{Prefix: prefix, TTL: time.Minute,
			After: func(time.Duration) <-chan time.Time { return tick }})
		live := lock.NewReentrant(c, lock.RedisOptions{Prefix: prefix, TTL: 30 * time.Second})
		a := lock.WithOwner(ctx, lock.NewOwner())
		old := obtainAs(t, stopped, a, "k")
		// The hold is lost (a failover to a replica that never saw it) while
		// its lease still runs; the owner takes the lock again.
		c.Del(ctx, stopped.Key("k"))
		taken := obtainAs(t, live, a, "k")
		ttl := c.PTTL(ctx, live.Key("k")).Val()
		tick <- time.Now() // the old lease's watchdog renews
		select {
		case <-old.Context().Done():
		case <-time.After(10 * time.Second):
			t.Fatal("the old hold's lease renewed the new hold and lives on")
		}
		if cause := context.Cause(old.Context()); !errors.Is(cause, lock.ErrNotHeld) {
			t.Errorf("cause = %v, want ErrNotHeld", cause)
		}
		if now := c.PTTL(ctx, live.Key("k")).Val(); now > ttl {
			t.Errorf("the new hold's TTL rose from %v to %v: the old lease renewed it", ttl, now)
		}
		if err := old.Release(a); !errors.Is(err, lock.ErrNotHeld) {
			t.Errorf("the old hold's Release = %v, want ErrNotHeld", err)
		}
		if owner, depth := hold(t, c, live, "k"); owner == "" || depth != 1 {
			t.Fatalf("owner %q depth %d, want the new hold at depth 1", owner, depth)
		}
		if err := taken.Release(a); err != nil {
			t.Fatal(err)
		}
	})
}

// TestReentrantReleaseCommands: the release that frees a reentrant lock
// deletes the hash and its waiting flag in one DEL, as release.lua does.
func TestReentrantReleaseCommands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	addr := testenv.StartRedis(t).Addr
	admin := testenv.RedisAt(t, addr)
	l := lock.NewReentrant(lockClient(t, addr, true), lock.RedisOptions{Subscriber: admin})
	t.Cleanup(func() { l.Close() })
	a := lock.WithOwner(ctx, lock.NewOwner())
	// The first run loads the scripts (EVAL after EVALSHA's NOSCRIPT).
	if err := obtainAs(t, l, a, "k").Release(ctx); err != nil {
		t.Fatal(err)
	}
	if err := admin.ConfigResetStat(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	if err := obtainAs(t, l, a, "k").Release(ctx); err != nil {
		t.Fatal(err)
	}
	if got := commandStats(t, admin); got["del"] != 1 {
		t.Errorf("one Obtain and Release ran %v in Redis, want one DEL", got)
	}
}
