package lock_test

import (
	"context"
	"crypto/sha1"
	"encoding/hex"
	"errors"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"shop/internal/lock"
	"shop/internal/testenv"
)

// proxied returns a client of the test Redis that talks to it through a
// proxy which can lose a reply, a client that talks to it directly, and a
// key prefix of the test's own.
func proxied(t *testing.T) (*testenv.Proxy, *redis.Client, *redis.Client, string) {
	t.Helper()
	direct, prefix := testenv.Redis(t)
	p := testenv.StartProxy(t, testenv.RedisAddr(t))
	return p, lockClient(t, p.Addr, false), direct, prefix
}

// cutDone fails the test unless the proxy has cut the reply it was armed for.
func cutDone(t *testing.T, cut <-chan struct{}) {
	t.Helper()
	select {
	case <-cut:
	case <-time.After(10 * time.Second):
		t.Fatal("the proxy never saw the request it was to cut the reply of")
	}
}

// scriptSHA is the SHA1 digest by which go-redis calls the script in file
// (EVALSHA): matching it picks that script's calls out of the traffic.
func scriptSHA(t *testing.T, file string) []byte {
	t.Helper()
	src, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha1.Sum(src)
	return []byte(hex.EncodeToString(sum[:]))
}

// An obtain script that ran, and whose reply was lost, must give the key
// back at once: otherwise it stays held for a whole TTL by a token nobody
// has, and every order for it waits. TryObtain then fails; Obtain, whose
// caller waits anyway, takes the key again within its wait (a dropped
// connection is what a failover does to it: see failingOver).
func TestObtainReplyLostFreesKey(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		p, c, direct, prefix := proxied(t)
		l := lock.NewRedis(c, lock.RedisOptions{Prefix: prefix, TTL: time.Minute, Wait: time.Second})
		// Load the scripts, so that the cut lands on the obtain script's own
		// reply rather than on a NOSCRIPT.
		obtain(t, l, "warm").Release(ctx)

		cut := p.CutReply([]byte(l.Key("k")))
		if lease, err := l.TryObtain(ctx, "k"); err == nil {
			lease.Release(ctx)
			t.Fatal("obtained although the reply was lost")
		}
		cutDone(t, cut)
		if ttl := direct.PTTL(ctx, l.Key("k")).Val(); ttl > 0 {
			t.Fatalf("the failed obtain left the key held for %v more: nobody holds its token", ttl)
		}

		attempts := l.Stats().Attempts
		cut = p.CutReply([]byte(l.Key("k")))
		lease, err := l.Obtain(ctx, "k")
		cutDone(t, cut)
		if err != nil {
			t.Fatalf("Obtain with its first reply lost = %v, want the key taken again within the wait", err)
		}
		if n := l.Stats().Attempts - attempts; n != 2 {
			t.Errorf("Obtain made %d attempts, want 2: the lost one and the next", n)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatalf("Release = %v: the lease is not the holder's", err)
		}
		if n := direct.Exists(ctx, l.Key("k")).Val(); n != 0 {
			t.Fatal("the key is still held after Release: the lost try left it held")
		}
	})
	t.Run("reentrant", func(t *testing.T) {
		t.Parallel()
		p, c, direct, prefix := proxied(t)
		l := lock.NewReentrant(c, lock.RedisOptions{Prefix: prefix, TTL: time.Minute, Wait: time.Second})
		a := lock.WithOwner(ctx, lock.NewOwner())
		obtainAs(t, l, a, "warm").Release(a)

		// A new hold: the lost try's hold is given back, the next one taken.
		cut := p.CutReply([]byte(l.Key("k")))
		outer := obtainAs(t, l, a, "k")
		cutDone(t, cut)
		if _, depth := hold(t, direct, l, "k"); depth != 1 {
			t.Fatalf("depth %d after a new hold whose first reply was lost, want 1", depth)
		}

		// Taking a hold again: the depth the lost acquisition added is taken
		// back, so the owner's last release still frees the lock.
		cut = p.CutReply([]byte(l.Key("k")))
		inner := obtainAs(t, l, a, "k")
		cutDone(t, cut)
		if _, depth := hold(t, direct, l, "k"); depth != 2 {
			t.Fatalf("depth %d after a re-acquisition whose first reply was lost, want 2", depth)
		}
		if err := inner.Release(a); err != nil {
			t.Fatal(err)
		}
		if err := outer.Release(a); err != nil {
			t.Fatal(err)
		}
		if n := direct.Exists(ctx, l.Key("k")).Val(); n != 0 {
			t.Fatal("the owner's last release left the lock held")
		}
	})
}

// A waiter whose connection is closed under its attempt — what a Sentinel
// failover does to the demoted master's clients, and go-redis to its own
// connections to it — goes on waiting and takes the key on its release,
// rather than failing its order.
func TestWaitOutlastsDroppedConnection(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	p, c, direct, prefix := proxied(t)
	holder := lock.NewRedis(direct, lock.RedisOptions{Prefix: prefix, TTL: time.Minute})
	l := lock.NewRedis(c, lock.RedisOptions{Prefix: prefix, TTL: time.Minute, Wait: time.Minute,
		MinBackoff: time.Millisecond, MaxBackoff: 5 * time.Millisecond})
	held := obtain(t, holder, "k")
	got := obtainAsync(l, "k")
	waitFor(t, "the waiter tried twice", func() bool { return l.Stats().Attempts >= 2 })
	cutDone(t, p.CutReply([]byte(l.Key("k"))))
	attempts := l.Stats().Attempts
	waitFor(t, "the waiter tried again", func() bool { return l.Stats().Attempts > attempts })
	if err := held.Release(ctx); err != nil {
		t.Fatal(err)
	}
	received(t, got).Release(ctx)
}

// A release whose reply is lost after Redis deleted the key is retried by
// the lock; the retry finds no key, which is the lost try's doing, not a
// lease lost before it.
func TestReleaseReplyLostIsReleased(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		p, c, direct, prefix := proxied(t)
		l := lock.NewRedis(c, lock.RedisOptions{Prefix: prefix, TTL: time.Minute})
		obtain(t, l, "warm").Release(ctx)

		lease := obtain(t, l, "k")
		token := direct.Get(ctx, l.Key("k")).Val()
		cut := p.CutReply([]byte(token)) // only the release sends it now: no renewal for 20 s
		if err := lease.Release(ctx); err != nil {
			t.Fatalf("Release = %v, want nil: the try whose reply was lost released it", err)
		}
		cutDone(t, cut)
		if n := direct.Exists(ctx, l.Key("k")).Val(); n != 0 {
			t.Fatal("the key is still held after Release")
		}
	})
	t.Run("reentrant", func(t *testing.T) {
		t.Parallel()
		p, c, direct, prefix := proxied(t)
		l := lock.NewReentrant(c, lock.RedisOptions{Prefix: prefix, TTL: time.Minute})
		a := lock.WithOwner(ctx, lock.NewOwner())
		obtainAs(t, l, a, "warm").Release(a)

		outer := obtainAs(t, l, a, "k")
		inner := obtainAs(t, l, a, "k")
		owner, _ := hold(t, direct, l, "k")
		cut := p.CutReply([]byte(owner))
		if err := inner.Release(a); err != nil {
			t.Fatalf("Release = %v, want nil: the try whose reply was lost released it", err)
		}
		cutDone(t, cut)
		// Undone once, not once per try.
		if _, depth := hold(t, direct, l, "k"); depth != 1 {
			t.Fatalf("depth %d after the inner release, want 1", depth)
		}
		if err := outer.Release(a); err != nil {
			t.Fatal(err)
		}
		if n := direct.Exists(ctx, l.Key("k")).Val(); n != 0 {
			t.Fatal("the lock is still held after the last release")
		}
	})
	t.Run("redlock", func(t *testing.T) {
		t.Parallel()
		c := newCluster(t, 3)
		proxies := make([]*testenv.Proxy, len(c.procs))
		nodes := make([]redis.Scripter, len(c.procs))
		for i, p := range c.procs {
			proxies[i] = testenv.StartProxy(t, p.Addr)
			nodes[i] = nodeClient(t, proxies[i].Addr)
		}
		l, err := lock.NewRedlock(nodes, lock.RedisOptions{Prefix: "test:", TTL: time.Minute, NodeTimeout: loadedNodeTimeout})
		if err != nil {
			t.Fatal(err)
		}
		obtain(t, l, "warm").Release(ctx)
		lease := obtain(t, l, "k")
		// The obtain's calls to a node slower than the majority may still be
		// on their way: cut only the release script's replies.
		var cuts []<-chan struct{}
		for _, p := range proxies {
			cuts = append(cuts, p.CutReply(scriptSHA(t, "release.lua")))
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatalf("Release = %v, want nil: the tries whose replies were lost released it", err)
		}
		for _, cut := range cuts {
			cutDone(t, cut)
		}
		if n := c.heldOn(l, "k"); n != 0 {
			t.Fatalf("held on %d nodes after Release: %q", n, c.holders(l, "k"))
		}
	})
}

// A grant that comes back after the lease it granted has run out (a slow or
// paused Redis) is no lock: its holder could write before its watchdog
// noticed. It is given back, and a waiting Obtain tries again.
func TestGrantArrivingExpiredIsRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	const ttl, pause = 300 * time.Millisecond, time.Second
	t.Run("redis", func(t *testing.T) {
		t.Parallel()
		p := testenv.StartRedis(t)
		c := lockClient(t, p.Addr, false) // its 3 s read timeout outlasts the pause
		l := lock.NewRedis(c, lock.RedisOptions{TTL: ttl})
		obtain(t, l, "warm").Release(ctx)

		p.Pause()
		time.AfterFunc(pause, p.Resume)
		lease, err := l.TryObtain(ctx, "k")
		if err == nil {
			lease.Release(ctx)
			t.Fatalf("TryObtain handed out a lease that ran out %v before it was handed out", time.Since(lease.Until()))
		}
		if !errors.Is(err, lock.ErrNotObtained) {
			t.Fatalf("err = %v, want ErrNotObtained", err)
		}
		if n := c.Exists(ctx, l.Key("k")).Val(); n != 0 {
			t.Error("the late grant was not given back")
		}
	})
	t.Run("reentrant", func(t *testing.T) {
		t.Parallel()
		p := testenv.StartRedis(t)
		c := lockClient(t, p.Addr, false)
		l := lock.NewReentrant(c, lock.RedisOptions{TTL: ttl, Wait: 30 * time.Second})
		a := lock.WithOwner(ctx, lock.NewOwner())
		obtainAs(t, l, a, "warm").Release(a)
		before := l.Stats().Attempts

		p.Pause()
		time.AfterFunc(pause, p.Resume)
		lease := obtainAs(t, l, a, "k")
		defer lease.Release(a)
		if left := time.Until(lease.Until()); left <= 0 {
			t.Fatalf("Obtain handed out a lease that ran out %v before", -left)
		}
		if n := l.Stats().Attempts - before; n != 2 {
			t.Errorf("%d attempts, want 2: the late grant refused, the next one taken", n)
		}
		if _, depth := hold(t, c, l, "k"); depth != 1 {
			t.Errorf("depth %d, want 1: the late grant was not given back", depth)
		}
	})
}
