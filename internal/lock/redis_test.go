package lock_test

import (
	"cmp"
	"context"
	"errors"
	"maps"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"shop/internal/lock"
	"shop/internal/testenv"
)

// newRedis returns a Redis lock with a key prefix of the test's own, and the
// client it uses: a lockRedis.
func newRedis(t *testing.T, opt lock.RedisOptions) (*lock.Redis, *redis.Client) {
	t.Helper()
	c, prefix := lockRedis(t)
	opt.Prefix = prefix
	return lock.NewRedis(c, opt), c
}

// lockRedis returns a client of the test Redis as the lock wants it (see
// lockClient), and a key prefix of the test's own, whose keys are deleted
// when the test ends. (A client that retries a command whose reply was
// lost, a read timed out on a loaded machine, would take a key and then
// find it held by itself.)
func lockRedis(t *testing.T) (*redis.Client, string) {
	t.Helper()
	_, prefix := testenv.Redis(t)
	return lockClient(t, testenv.RedisAddr(t), true), prefix
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

// keyPrefix recovers the prefix a lock in Redis was built with.
func keyPrefix(l interface{ Key(string) string }) string {
	k := l.Key("x")
	return k[:len(k)-len("{x}")]
}

// redisFamily is the Redis lock on topo as the conformance suite runs it,
// its waiters woken on release (as the service has them) or polling. Each
// process has a client of its own.
func redisFamily(topo testenv.Topology, woken bool) family {
	name := "redis " + topo.Name + map[bool]string{true: ", woken", false: ", polling"}[woken]
	return family{name: name, claims: everything, woken: woken, ttl: 2 * time.Second,
		servers: func(t *testing.T) func(*testing.T, settings) world {
			_, prefix := testenv.RedisOn(t, topo)
			return func(t *testing.T, opt settings) world {
				ttl := cmp.Or(opt.TTL, 5*time.Second)
				return func() *handle {
					c := lockClientOn(t, topo)
					o := lock.RedisOptions{Prefix: prefix, TTL: ttl, Wait: opt.Wait}
					if woken {
						o.Subscriber = c
					}
					if woken && opt.onlyWoken {
						o.MinBackoff, o.MaxBackoff = never, never
					}
					l := lock.NewRedis(c, o)
					return &handle{locker: l, crash: crashing(t, l, c.Close),
						// The key expired while its holder was paused, or a
						// failover lost it.
						lose: func(t *testing.T, lease *lock.Lease) {
							if err := c.Del(context.Background(), l.Key(lease.Key())).Err(); err != nil {
								t.Fatal(err)
							}
						},
						// The key is held, for the lease length at most, and
						// its counter is at the lease's token: nobody has
						// taken the key since.
						holds: func(lease *lock.Lease) error {
							ctx := context.Background()
							left, err := c.PTTL(ctx, l.Key(lease.Key())).Result()
							if err != nil {
								return err
							}
							fence, err := c.Get(ctx, l.FenceKey(lease.Key())).Int64()
							if err != nil {
								return err
							}
							if left <= 0 || left > ttl || fence != lease.Fence() {
								return errHolds(lease, "the key is held for %v more (the lease is %v), its counter is at %d", left, ttl, fence)
							}
							return nil
						},
					}
				}
			}
		}}
}

func TestRedisWrongTokenCanNeitherReleaseNorRenew(t *testing.T) {
	t.Parallel()
	testenv.EachTopology(t, func(t *testing.T, topo testenv.Topology) {
		t.Parallel()
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

// The watchdog cancels a lease whose renewals go unanswered no later than
// the moment the lease may run out in Redis, whatever the client does with
// the context's deadline.
func TestWatchdogCancelsByValidUntil(t *testing.T) {
	// Not in parallel with the other tests: its slack is a quarter of a second.
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
			t.Parallel()
			p := testenv.StartRedis(t)
			l := lock.NewRedis(lockClient(t, p.Addr, cte), lock.RedisOptions{TTL: ttl})
			lease := obtain(t, l, "k")
			p.Pause()
			t.Cleanup(p.Resume)
			check(t, lease)
		})
	}
	t.Run("redlock, slow node timeout", func(t *testing.T) {
		t.Parallel()
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

// A try cut short by its context's deadline is a wait that ran out, not a
// Redis error, even before the context's timer has fired: the connection's
// deadline, taken from the context's, times the command out at that instant,
// and on a loaded machine the timer fires a moment later. timerNotFired
// stands for that moment, with a Redis that has stopped answering.
func TestTryCutByItsDeadlineIsNotObtained(t *testing.T) {
	t.Parallel()
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
	t.Parallel()
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
	t.Parallel()
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

// commandStats returns the calls per command that the Redis of c has run
// since its statistics were last reset (INFO commandstats), the commands
// run inside scripts included and INFO and CONFIG, the counting's own, left
// out.
func commandStats(t *testing.T, c *redis.Client) map[string]int64 {
	t.Helper()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		t.Fatal(err)
	}
	stats := map[string]int64{}
	for line := range strings.Lines(info) {
		name, fields, _ := strings.Cut(strings.TrimSpace(line), ":")
		name, ok := strings.CutPrefix(name, "cmdstat_")
		calls, _, _ := strings.Cut(strings.TrimPrefix(fields, "calls="), ",")
		if base, _, _ := strings.Cut(name, "|"); !ok || base == "info" || base == "config" {
			continue
		}
		n, err := strconv.ParseInt(calls, 10, 64)
		if err != nil {
			t.Fatalf("commandstats %q: %v", line, err)
		}
		stats[name] = n
	}
	return stats
}

// An uncontended Obtain and Release run seven commands in Redis, with
// wake-on-release as the service runs the lock and without it: the obtain
// script's EVALSHA, its SET NX PX, and the fencing token's TIME and SET …
// GET of the counter (which writes the clock and reads the old value at
// once); the release script's EVALSHA, its GET, and one DEL of the lock and
// of its waiting flag, which no one set. (They were nine: the token read
// the counter and wrote it back, and the release deleted the flag on its
// own.)
func TestUncontendedCommands(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	addr := testenv.StartRedis(t).Addr
	admin := testenv.RedisAt(t, addr)
	want := map[string]int64{"evalsha": 2, "set": 2, "time": 1, "get": 1, "del": 1}
	for _, tc := range []struct {
		name string
		opt  lock.RedisOptions
	}{
		{"wake on release", lock.RedisOptions{Subscriber: admin}},
		{"backoff only", lock.RedisOptions{}},
	} {
		l := lock.NewRedis(lockClient(t, addr, true), tc.opt)
		t.Cleanup(func() { l.Close() })
		// The first run loads the scripts (EVAL after EVALSHA's NOSCRIPT).
		if err := obtain(t, l, "k").Release(ctx); err != nil {
			t.Fatal(err)
		}
		if err := admin.ConfigResetStat(ctx).Err(); err != nil {
			t.Fatal(err)
		}
		lease := obtain(t, l, "k")
		if err := lease.Release(ctx); err != nil {
			t.Fatal(err)
		}
		if got := commandStats(t, admin); !maps.Equal(got, want) {
			t.Errorf("%s: one Obtain and Release ran %v in Redis, want %v", tc.name, got, want)
		}
	}
}
