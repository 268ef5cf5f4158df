package lock_test

import (
	"context"
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

// An obtain script that ran, and whose reply was lost, must give the key
// back at once: otherwise it stays held for a whole TTL by a token nobody
// has, and every order for it waits.
func TestObtainReplyLostFreesKey(t *testing.T) {
	ctx := context.Background()
	t.Run("redis", func(t *testing.T) {
		p, c, direct, prefix := proxied(t)
		l := lock.NewRedis(c, lock.RedisOptions{Prefix: prefix, TTL: time.Minute, Wait: time.Second})
		// Load the scripts, so that the cut lands on the obtain script's own
		// reply rather than on a NOSCRIPT.
		obtain(t, l, "warm").Release(ctx)

		cut := p.CutReply([]byte(l.Key("k")))
		if lease, err := l.Obtain(ctx, "k"); err == nil {
			lease.Release(ctx)
			t.Fatal("obtained although the reply was lost")
		}
		cutDone(t, cut)
		if ttl := direct.PTTL(ctx, l.Key("k")).Val(); ttl > 0 {
			t.Fatalf("the failed obtain left the key held for %v more: nobody holds its token", ttl)
		}
		lease, err := l.TryObtain(ctx, "k")
		if err != nil {
			t.Fatalf("the key is not free after the failed obtain: %v", err)
		}
		lease.Release(ctx)
	})
	t.Run("reentrant", func(t *testing.T) {
		p, c, direct, prefix := proxied(t)
		l := lock.NewReentrant(c, lock.RedisOptions{Prefix: prefix, TTL: time.Minute, Wait: 100 * time.Millisecond})
		a := lock.WithOwner(ctx, lock.NewOwner())
		obtainAs(t, l, a, "warm").Release(a)

		// A new hold.
		cut := p.CutReply([]byte(l.Key("k")))
		if lease, err := l.Obtain(a, "k"); err == nil {
			lease.Release(a)
			t.Fatal("obtained although the reply was lost")
		}
		cutDone(t, cut)
		if ttl := direct.PTTL(ctx, l.Key("k")).Val(); ttl > 0 {
			t.Fatalf("the failed obtain left a hold for %v more", ttl)
		}

		// Taking a hold again: the depth the lost acquisition added is taken
		// back, so the owner's last release still frees the lock.
		outer := obtainAs(t, l, a, "k")
		cut = p.CutReply([]byte(l.Key("k")))
		if lease, err := l.Obtain(a, "k"); err == nil {
			lease.Release(a)
			t.Fatal("obtained again although the reply was lost")
		}
		cutDone(t, cut)
		if _, depth := hold(t, direct, l, "k"); depth != 1 {
			t.Fatalf("depth %d after a lost re-acquisition, want 1", depth)
		}
		if err := outer.Release(a); err != nil {
			t.Fatal(err)
		}
		if n := direct.Exists(ctx, l.Key("k")).Val(); n != 0 {
			t.Fatal("the owner's last release left the lock held")
		}
	})
}
