package ratelimit_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"shop/internal/ratelimit"
	"shop/internal/testenv"
)

// store is what Limiter and Local both are.
type store interface {
	Take(ctx context.Context, key string, lim ratelimit.Limit) (time.Duration, error)
	Give(ctx context.Context, key string, lim ratelimit.Limit) error
}

// TestTakeRefusesPastTheBurst takes a burst of 3 at 1 a second, in Redis
// on each topology and in memory: the first three go on, the fourth is
// told to wait a second less the time since the first.
func TestTakeRefusesPastTheBurst(t *testing.T) { eachStore(t, takePastTheBurst) }

// eachStore runs test on a Limiter in Redis of each topology, then on a
// Local.
func eachStore(t *testing.T, test func(*testing.T, store)) {
	testenv.EachTopology(t, func(t *testing.T, topo testenv.Topology) {
		rdb, prefix := testenv.RedisOn(t, topo)
		test(t, ratelimit.New(rdb, prefix))
	})
	t.Run("local", func(t *testing.T) { test(t, &ratelimit.Local{}) })
}

func takePastTheBurst(t *testing.T, l store) {
	ctx := context.Background()
	lim := ratelimit.PerSecond(1, 3)
	start := time.Now()
	for i := range 3 {
		if wait, err := l.Take(ctx, "u:1", lim); err != nil || wait != 0 {
			t.Fatalf("take %d: wait %v, err %v; want to go on", i+1, wait, err)
		}
	}
	for _, name := range []string{"take", "take again"} {
		wait, err := l.Take(ctx, "u:1", lim)
		// 10ms for the clocks' granularity.
		if least := time.Second - time.Since(start) - 10*time.Millisecond; err != nil || wait < least || wait > time.Second {
			t.Fatalf("%s past the burst: wait %v, err %v; want between %v and 1s", name, wait, err, least)
		}
	}
	// Another key has its own allowance.
	if wait, err := l.Take(ctx, "u:2", lim); err != nil || wait != 0 {
		t.Fatalf("another key: wait %v, err %v; want to go on", wait, err)
	}
}

// TestGiveBack gives back requests taken, in Redis and in memory: each
// one given back can be taken again at once, the only one outstanding
// too, and giving back never raises an allowance past its burst.
func TestGiveBack(t *testing.T) { eachStore(t, giveBack) }

func giveBack(t *testing.T, l store) {
	ctx := context.Background()
	// A minute a request: nothing refills while the test runs.
	lim := ratelimit.Limit{Rate: 2, Burst: 2, Period: 2 * time.Minute}
	take := func(what string, want bool) {
		t.Helper()
		wait, err := l.Take(ctx, "g:1", lim)
		if err != nil || (wait == 0) != want {
			t.Fatalf("%s: wait %v, err %v; want to go on: %v", what, wait, err, want)
		}
	}
	give := func() {
		t.Helper()
		if err := l.Give(ctx, "g:1", lim); err != nil {
			t.Fatal(err)
		}
	}
	// Given back before anything was taken: still a burst of 2, not 3.
	give()
	take("first", true)
	give()
	take("first again, given back as the only one outstanding", true)
	take("second", true)
	take("third, past the burst", false)
	give()
	take("one given back", true)
	take("none given back", false)
	give()
	give()
	give()
	take("after giving back more than was taken, first", true)
	take("second", true)
	take("third", false)
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
