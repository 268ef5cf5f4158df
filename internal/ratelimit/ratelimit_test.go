package ratelimit_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"shop/internal/ratelimit"
	"shop/internal/testenv"
)

// TestTakeRefusesPastTheBurst takes a burst of 3 at 1 a second: the first
// three go on, the fourth is told to wait about a second, and Check agrees
// with Take without taking anything.
func TestTakeRefusesPastTheBurst(t *testing.T) {
	testenv.EachTopology(t, func(t *testing.T, topo testenv.Topology) {
		rdb, prefix := testenv.RedisOn(t, topo)
		l := ratelimit.New(rdb, prefix)
		ctx := context.Background()
		lim := ratelimit.PerSecond(1, 3)
		for i := range 3 {
			if wait, err := l.Check(ctx, "u:1", lim); err != nil || wait != 0 {
				t.Fatalf("check before take %d: wait %v, err %v; want to go on", i+1, wait, err)
			}
			if wait, err := l.Take(ctx, "u:1", lim); err != nil || wait != 0 {
				t.Fatalf("take %d: wait %v, err %v; want to go on", i+1, wait, err)
			}
		}
		for _, op := range []struct {
			name string
			fn   func(context.Context, string, ratelimit.Limit) (time.Duration, error)
		}{{"check", l.Check}, {"take", l.Take}, {"take again", l.Take}} {
			wait, err := op.fn(ctx, "u:1", lim)
			if err != nil || wait < 900*time.Millisecond || wait > time.Second {
				t.Fatalf("%s past the burst: wait %v, err %v; want about 1s", op.name, wait, err)
			}
		}
		// Another key has its own allowance.
		if wait, err := l.Take(ctx, "u:2", lim); err != nil || wait != 0 {
			t.Fatalf("another key: wait %v, err %v; want to go on", wait, err)
		}
	})
}

// TestZeroBurstIsTheRate: PerSecond(5, 0) lets five through at once, not
// none; PerSecond(0, n) is no limit.
func TestZeroBurstIsTheRate(t *testing.T) {
	if got := ratelimit.PerSecond(5, 0); got.Burst != 5 || got.Rate != 5 || got.Period != time.Second {
		t.Errorf("PerSecond(5, 0) = %v; want 5 a second in bursts of 5", got)
	}
	if got := ratelimit.PerSecond(0, 10); !got.IsZero() {
		t.Errorf("PerSecond(0, 10) = %v; want the zero Limit", got)
	}
}

// TestRedisDownIsAnError: a limiter whose Redis does not answer (paused)
// says so within about Timeout, rather than letting through or refusing
// on its own.
func TestRedisDownIsAnError(t *testing.T) {
	srv := testenv.StartRedis(t)
	// As the service's client: a command ends at its context's deadline.
	rdb := redis.NewClient(&redis.Options{Addr: srv.Addr, ContextTimeoutEnabled: true})
	defer rdb.Close()
	l := ratelimit.New(rdb, "rl:")
	lim := ratelimit.PerSecond(1, 1)
	if _, err := l.Take(context.Background(), "u:1", lim); err != nil {
		t.Fatal(err)
	}
	srv.Pause()
	defer srv.Resume()
	start := time.Now()
	_, err := l.Take(context.Background(), "u:1", lim)
	if took := time.Since(start); err == nil || took > ratelimit.Timeout+300*time.Millisecond {
		t.Fatalf("Take with Redis paused: err %v after %v; want an error within about %v", err, took, ratelimit.Timeout)
	}
}
