package notify_test

import (
	"context"
	"testing"
	"time"

	"shop/internal/notify"
	"shop/internal/testenv"
)

// everything is what a listener is told when it (re)subscribes.
var everything = notify.Event{Kind: notify.Raised, SKU: notify.All}

// listening starts r.Listen, waits until it has subscribed and told its
// caller so (All), and returns what it hears from then on and its stop.
func listening(t *testing.T, r *notify.Restocks) (<-chan notify.Event, func() error) {
	t.Helper()
	heard := make(chan notify.Event, 64)
	ready, stop := r.Listen(func(e notify.Event) { heard <- e })
	select {
	case <-ready:
	case <-time.After(10 * time.Second):
		stop()
		t.Fatal("never subscribed")
	}
	// A (re)subscription may have missed announcements: all may have changed.
	if got := <-heard; got != everything {
		stop()
		t.Fatalf("on subscribing: heard %+v, want %+v", got, everything)
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
		if want := (notify.Event{Kind: notify.Raised, SKU: 7}); got != want {
			t.Errorf("heard %+v, want %+v (and nothing from another prefix)", got, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("announcement never heard")
	}
	if err := stop(); err != nil {
		t.Errorf("stop: %v", err)
	}
	select {
	case got := <-heard:
		t.Errorf("heard %+v after stop", got)
	default:
	}
}

// Announcements made while a listener's connection was down are lost; the
// listener is told that everything may have changed once it is back.
func TestListenStartsOverAfterALostConnection(t *testing.T) {
	ctx := context.Background()
	redisProc := testenv.StartRedis(t)
	rdb := testenv.RedisAt(t, redisProc.Addr)
	heard := make(chan notify.Event, 16)
	ready, stop := notify.New(rdb, "p:").Listen(func(e notify.Event) { heard <- e })
	defer stop()
	<-ready
	if got := <-heard; got != everything {
		t.Fatalf("on subscribing: heard %+v, want %+v", got, everything)
	}
	redisProc.Kill() // the connection drops; go-redis resubscribes once it is back
	redisProc.Restart()
	select {
	case got := <-heard:
		if got != everything {
			t.Errorf("after the restart: heard %+v, want %+v", got, everything)
		}
	case <-time.After(20 * time.Second):
		t.Fatal("not told after the connection came back")
	}
	if err := notify.New(rdb, "p:").Announce(ctx, 5); err != nil {
		t.Fatal(err)
	}
	if got := <-heard; got.SKU != 5 {
		t.Errorf("after the restart: heard %+v, want product 5", got)
	}
}

// A subscription whose connection went silent — no reset, no close, as
// behind a peer gone from the network — is pinged, given up when the ping
// is not answered, and made again: the listener is told that everything may
// have changed, and hears what is announced from then on. Without the
// ping, only TCP's keepalive would notice, minutes later.
func TestListenNoticesASilentConnection(t *testing.T) {
	ctx := context.Background()
	rdb, prefix := testenv.Redis(t)
	proxy := testenv.StartProxy(t, testenv.RedisAddr(t))
	r := notify.New(testenv.RedisAt(t, proxy.Addr), prefix)
	r.HealthCheck = 100 * time.Millisecond
	heard, stop := listening(t, r)
	defer stop()

	proxy.Blackhole()
	// Announced until heard: what went out before the new subscription is
	// lost with the silent connection.
	announcer := notify.New(rdb, prefix)
	tick := time.NewTicker(50 * time.Millisecond)
	defer tick.Stop()
	deadline := time.After(10 * time.Second)
	toldAll := false
	for {
		select {
		case got := <-heard:
			switch {
			case got == everything:
				toldAll = true
			case got != notify.Event{Kind: notify.Raised, SKU: 5}:
				t.Fatalf("heard %+v, want product 5", got)
			case !toldAll:
				t.Fatal("heard product 5 on a new subscription before being told that everything may have changed")
			default:
				return
			}
		case <-tick.C:
			if err := announcer.Announce(ctx, 5); err != nil {
				t.Fatal(err)
			}
		case <-deadline:
			t.Fatalf("a silent subscription was not made again (told everything: %v)", toldAll)
		}
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
			case e := <-heard:
				sku := e.SKU
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

// Every kind of announcement reaches a listener as it was made, told on
// its own or queued in a pipeline; a bare SKU (how replicas before the
// other kinds announced a restock) is a Raised without a fence, and a
// payload the listener does not know is dropped.
func TestEveryKindHeard(t *testing.T) {
	ctx := context.Background()
	rdb, prefix := testenv.Redis(t)
	r := notify.New(rdb, prefix)
	heard, stop := listening(t, r)
	defer stop()

	told := []notify.Event{
		{Kind: notify.Raised, SKU: 4},
		{Kind: notify.Raised, SKU: 4, Fence: 17},
		{Kind: notify.Changed, SKU: 9},
		{Kind: notify.SoldOut, SKU: 9, Fence: 18},
		{Kind: notify.Raised, SKU: notify.All},
	}
	for _, e := range told[:3] {
		if err := r.Tell(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	pipe := rdb.Pipeline()
	for _, e := range told[3:] {
		r.Queue(ctx, pipe, e)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		t.Fatal(err)
	}
	// Payloads of no known shape, then a bare SKU as older replicas send it.
	for _, p := range []string{"", "x1", "s9", "s0:3", "c9:3", "r9", "r9:0", "s9:-1", "12a", "-3", "11"} {
		if err := rdb.Publish(ctx, prefix+"stock:raised", p).Err(); err != nil {
			t.Fatal(err)
		}
	}
	told = append(told, notify.Event{Kind: notify.Raised, SKU: 11})
	for _, want := range told {
		select {
		case got := <-heard:
			if got != want {
				t.Fatalf("heard %+v, want %+v", got, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("never heard %+v", want)
		}
	}
}
