package notify_test

import (
	"context"
	"testing"
	"time"

	"shop/internal/notify"
	"shop/internal/testenv"
)

// listening starts r.Listen, waits until it has subscribed and told its
// caller so (All), and returns what it hears from then on and its stop.
func listening(t *testing.T, r *notify.Restocks) (<-chan int64, func() error) {
	t.Helper()
	heard := make(chan int64, 64)
	ready, stop := r.Listen(func(sku int64) { heard <- sku })
	select {
	case <-ready:
	case <-time.After(10 * time.Second):
		stop()
		t.Fatal("never subscribed")
	}
	// A (re)subscription may have missed announcements: all may have changed.
	if got := <-heard; got != notify.All {
		stop()
		t.Fatalf("on subscribing: heard %d, want All", got)
	}
	return heard, stop
}

func TestListenHearsAnnouncements(t *testing.T) {
	ctx := context.Background()
	rdb, prefix := testenv.Redis(t)
	heard, stop := listening(t, notify.New(rdb, prefix))
	defer stop()

	other := notify.New(rdb, prefix+"other:")
	if err := other.Announce(ctx, 3); err != nil {
		t.Fatal(err)
	}
	if err := notify.New(rdb, prefix).Announce(ctx, 7); err != nil {
		t.Fatal(err)
	}
	select {
	case got := <-heard:
		if got != 7 {
			t.Errorf("heard %d, want 7 (and nothing from another prefix)", got)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("announcement never heard")
	}
	if err := stop(); err != nil {
		t.Errorf("stop: %v", err)
	}
	select {
	case got := <-heard:
		t.Errorf("heard %d after stop", got)
	default:
	}
}

// Announcements made while a listener's connection was down are lost; the
// listener is told that everything may have changed once it is back.
func TestListenStartsOverAfterALostConnection(t *testing.T) {
	ctx := context.Background()
	redisProc := testenv.StartRedis(t)
	rdb := testenv.RedisAt(t, redisProc.Addr)
	heard := make(chan int64, 16)
	ready, stop := notify.New(rdb, "p:").Listen(func(sku int64) { heard <- sku })
	defer stop()
	<-ready
	if got := <-heard; got != notify.All {
		t.Fatalf("on subscribing: heard %d, want All", got)
	}
	redisProc.Kill() // the connection drops; go-redis resubscribes once it is back
	redisProc.Restart()
	select {
	case got := <-heard:
		if got != notify.All {
			t.Errorf("after the restart: heard %d, want All", got)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("not told after the connection came back")
	}
	if err := notify.New(rdb, "p:").Announce(ctx, 5); err != nil {
		t.Fatal(err)
	}
	if got := <-heard; got != 5 {
		t.Errorf("after the restart: heard %d, want 5", got)
	}
}

// On every topology an announcement made through one client reaches the
// listener of another: on a Cluster, PUBLISH goes to any node and the
// cluster bus carries it to the node of the subscription.
func TestAnnounceReachesAnotherClient(t *testing.T) {
	testenv.EachTopology(t, func(t *testing.T, topo testenv.Topology) {
		ctx := context.Background()
		_, prefix := testenv.RedisOn(t, topo)
		heard, stop := listening(t, notify.New(topo.Client(t, nil), prefix))
		defer stop()
		// Several announcements, so that a Cluster client sends them
		// through several nodes; each is heard once, in whatever order.
		announcer := notify.New(topo.Client(t, nil), prefix)
		const n = 12
		for sku := int64(1); sku <= n; sku++ {
			if err := announcer.Announce(ctx, sku); err != nil {
				t.Fatal(err)
			}
		}
		seen := map[int64]bool{}
		for len(seen) < n {
			select {
			case sku := <-heard:
				if sku < 1 || sku > n || seen[sku] {
					t.Fatalf("heard %d (after %v), want each of 1..%d once", sku, seen, n)
				}
				seen[sku] = true
			case <-time.After(10 * time.Second):
				t.Fatalf("heard %v of 1..%d", seen, n)
			}
		}
	})
}
