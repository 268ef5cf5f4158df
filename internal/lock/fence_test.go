package lock_test

import (
	"context"
	"errors"
	"math"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"shop/internal/lock"
	"shop/internal/testenv"
)

// micros is the time of the Redis c answers in microseconds.
func micros(t *testing.T, c redis.Cmdable) int64 {
	t.Helper()
	now, err := c.Time(context.Background()).Result()
	if err != nil {
		t.Fatal(err)
	}
	return now.UnixMicro()
}

// restored are counters as a Redis brought back from an older snapshot (or
// a promoted replica that missed the latest INCRs) holds them, given the
// last token T issued before: below T, yet large — more than 2^40, which an
// earlier rule took for a counter that had survived.
var restored = []struct {
	name    string
	counter func(last int64) int64
}{
	{"just below the last token", func(last int64) int64 { return last - 1000 }},
	{"far below it, above 2^40", func(int64) int64 { return 1<<40 + 1<<39 }},
}

// A fencing token is never below the server's clock, so a counter restored
// from an older snapshot still issues tokens above every one written before.
func TestFencingAboveRestoredCounter(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	for _, r := range restored {
		t.Run("redis, "+r.name, func(t *testing.T) {
			t.Parallel()
			l, c := newRedis(t, lock.RedisOptions{})
			first := obtain(t, l, "k")
			first.Release(ctx)
			if err := c.Set(ctx, l.FenceKey("k"), r.counter(first.Fence()), 0).Err(); err != nil {
				t.Fatal(err)
			}
			next := obtain(t, l, "k")
			defer next.Release(ctx)
			if next.Fence() <= first.Fence() {
				t.Errorf("token after the restore %d, want > %d", next.Fence(), first.Fence())
			}
		})
		t.Run("reentrant, "+r.name, func(t *testing.T) {
			t.Parallel()
			l, c := newReentrant(t, lock.RedisOptions{})
			a := lock.WithOwner(ctx, lock.NewOwner())
			first := obtainAs(t, l, a, "k")
			first.Release(a)
			if err := c.Set(ctx, l.Key("k")+":fence", r.counter(first.Fence()), 0).Err(); err != nil {
				t.Fatal(err)
			}
			next := obtainAs(t, l, a, "k")
			defer next.Release(a)
			if next.Fence() <= first.Fence() {
				t.Errorf("token after the restore %d, want > %d", next.Fence(), first.Fence())
			}
		})
		t.Run("redlock, "+r.name, func(t *testing.T) {
			t.Parallel()
			c := newCluster(t, 3)
			l := c.lock(t, lock.RedisOptions{})
			first := obtain(t, l, "k")
			first.Release(ctx)
			// Every master restored from its snapshot.
			for _, cl := range c.clients {
				if err := cl.Set(ctx, l.Key("k")+":fence", r.counter(first.Fence()), 0).Err(); err != nil {
					t.Fatal(err)
				}
			}
			next := obtain(t, l, "k")
			defer next.Release(ctx)
			if next.Fence() <= first.Fence() {
				t.Errorf("token after the restore %d, want > %d", next.Fence(), first.Fence())
			}
		})
	}
}

// A Redis that lost its counters (restarted empty) still issues tokens
// above every earlier one: they come from its clock.
func TestFencingAboveLostCounter(t *testing.T) {
	t.Parallel()
	testenv.EachTopology(t, func(t *testing.T, topo testenv.Topology) {
		t.Parallel()
		ctx := context.Background()
		l, c := newRedisOn(t, topo, lock.RedisOptions{})
		first := obtain(t, l, "k")
		first.Release(ctx)
		if err := c.Del(ctx, l.FenceKey("k")).Err(); err != nil {
			t.Fatal(err)
		}
		next := obtain(t, l, "k")
		defer next.Release(ctx)
		if next.Fence() <= first.Fence() {
			t.Errorf("token after losing the counter %d, want > %d", next.Fence(), first.Fence())
		}
	})
}

// raiser is a lock whose fencing counters can be raised.
type raiser interface {
	Obtain(context.Context, string) (*lock.Lease, error)
	RaiseFence(context.Context, string, int64) error
}

// checkRaise checks that l's tokens for key are at or below fence (its
// counter and its clock are both behind it), that after RaiseFence(fence)
// the next token is above it, and that raising to less lowers nothing.
// beforeRaise and afterRaise, if not nil, run around the raise.
func checkRaise(t *testing.T, l raiser, key string, fence int64, beforeRaise, afterRaise func()) {
	t.Helper()
	ctx := context.Background()
	take := func() int64 {
		t.Helper()
		lease := obtain(t, l, key)
		lease.Release(ctx)
		return lease.Fence()
	}
	if stale := take(); stale > fence {
		t.Fatalf("token %d above the fence %d before any repair: the test shows nothing", stale, fence)
	}
	if beforeRaise != nil {
		beforeRaise()
	}
	if err := l.RaiseFence(ctx, key, fence); err != nil {
		t.Fatalf("RaiseFence: %v", err)
	}
	if afterRaise != nil {
		afterRaise()
	}
	next := take()
	if next <= fence {
		t.Fatalf("token after RaiseFence(%d) = %d, want above it", fence, next)
	}
	if err := l.RaiseFence(ctx, key, 1); err != nil {
		t.Fatal(err)
	}
	if after := take(); after <= next {
		t.Errorf("token after RaiseFence(1) = %d, want > %d: a counter was lowered", after, next)
	}
}

// When the clock cannot cover a lost counter (a replica promoted on a
// machine whose clock is behind the fences MySQL holds), RaiseFence repairs
// it: the next token is above the fence it is given, and it never lowers
// the counter.
func TestRaiseFence(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		testenv.EachTopology(t, func(t *testing.T, topo testenv.Topology) {
			t.Parallel()
			l, c := newRedisOn(t, topo, lock.RedisOptions{})
			// MySQL holds a fence an hour ahead of this Redis's clock, and
			// the counter is behind it too.
			fence := micros(t, c) + time.Hour.Microseconds()
			if err := c.Set(ctx, l.FenceKey("k"), fence-1000, 0).Err(); err != nil {
				t.Fatal(err)
			}
			checkRaise(t, l, "k", fence, nil, nil)
		})
	})
	t.Run("redlock", func(t *testing.T) {
		t.Parallel()
		c := newCluster(t, 3)
		l := c.lock(t, lock.RedisOptions{})
		fence := micros(t, c.clients[0]) + time.Hour.Microseconds()
		for _, cl := range c.clients {
			if err := cl.Set(ctx, l.Key("k")+":fence", fence-1000, 0).Err(); err != nil {
				t.Fatal(err)
			}
		}
		// Stored on a majority, the repair holds for every majority after.
		checkRaise(t, l, "k", fence, c.procs[2].Kill, func() {
			c.procs[2].Restart()
			c.procs[0].Kill()
		})
		// No majority: an error, not a silent partial repair.
		c.procs[1].Kill()
		if err := l.RaiseFence(ctx, "k", fence+1000); err == nil || errors.Is(err, lock.ErrNotObtained) {
			t.Errorf("RaiseFence with 1 of 3 nodes = %v, want the nodes' errors", err)
		}
	})
	t.Run("mysql", func(t *testing.T) {
		t.Parallel()
		dsn := mysqlDB(t).DSN
		ns := testenv.Name() + ":"
		key, fresh, held := ns+"k", ns+"new", ns+"held"
		db := mysqlPool(t, dsn)
		l := newMySQL(t, dsn, lock.MySQLOptions{})
		// The rows hold a fence an hour ahead of MySQL's clock, and the
		// key's counter is behind it too (the lock table was restored from
		// an older backup, say).
		fence := mysqlNow(t, db).Add(time.Hour).UnixMicro()
		if _, err := db.Exec("INSERT INTO shop_locks (name, owner, fence, expires_at) VALUES (?, '', ?, UTC_TIMESTAMP(6))", key, fence-1000); err != nil {
			t.Fatal(err)
		}
		checkRaise(t, l, key, fence, nil, nil)

		// A key never locked gets a free row with the counter.
		if err := l.RaiseFence(ctx, fresh, fence); err != nil {
			t.Fatal(err)
		}
		if o, f, _ := mysqlHolder(t, l, fresh); o != "" || f != fence {
			t.Errorf("a key raised before it was ever locked: owner %q, fence %d; want free with fence %d", o, f, fence)
		}
		if lease := obtain(t, l, fresh); lease.Fence() <= fence {
			t.Errorf("first token of a raised key %d, want above %d", lease.Fence(), fence)
		}

		// A held key keeps its holder and its lease.
		lease := obtain(t, l, held)
		owner, _, until := mysqlHolder(t, l, held)
		if err := l.RaiseFence(ctx, held, fence); err != nil {
			t.Fatal(err)
		}
		if o, f, u := mysqlHolder(t, l, held); o != owner || !u.Equal(until) || f != fence {
			t.Errorf("a held key after the raise: owner %q until %v, fence %d; want %q until %v, fence %d", o, u, f, owner, until, fence)
		}
		if err := lease.Release(ctx); err != nil {
			t.Errorf("the holder's release after the raise: %v", err)
		}

		for _, bad := range []int64{-1, math.MaxInt64} {
			if err := l.RaiseFence(ctx, key, bad); err == nil {
				t.Errorf("RaiseFence(%d) = nil, want an error: the next token would not fit", bad)
			}
		}
	})
}
