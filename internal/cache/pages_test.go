package cache_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"shop/internal/cache"
	"shop/internal/lock"
	"shop/internal/notify"
	"shop/internal/stock"
)

// clock is a hand-moved clock for Pages' TTL.
type clock struct{ now atomic.Int64 }

func (c *clock) NowNano() int64                      { return c.now.Load() }
func (c *clock) Tick(time.Duration) <-chan time.Time { return nil }
func (c *clock) advance(d time.Duration)             { c.now.Add(int64(d)) }

// loader is a page load that counts its calls and answers "page N" for
// the Nth.
type loader struct{ calls atomic.Int64 }

func (l *loader) load(context.Context) ([]byte, error) {
	return fmt.Appendf(nil, "page %d", l.calls.Add(1)), nil
}

func newPages(t *testing.T, ttl time.Duration) (*cache.Pages, *clock) {
	t.Helper()
	c := &clock{}
	c.now.Store(time.Now().UnixNano())
	p, err := cache.NewPagesOn(ttl, time.Second, c)
	if err != nil {
		t.Fatal(err)
	}
	return p, c
}

func page(t *testing.T, p *cache.Pages, id int64, load func(context.Context) ([]byte, error)) string {
	t.Helper()
	b, err := p.Page(context.Background(), id, load)
	if err != nil {
		t.Fatalf("page %d: %v", id, err)
	}
	return string(b)
}

// A page is loaded once and served from memory until it is forgotten (its
// product changed), or until its TTL has passed.
func TestPagesKeepUntilForgottenOrLapsed(t *testing.T) {
	p, clk := newPages(t, time.Second)
	var l loader
	for range 3 {
		if got := page(t, p, 7, l.load); got != "page 1" {
			t.Fatalf("got %q, want the first load's page", got)
		}
	}
	p.Forget(8) // another product
	if got := page(t, p, 7, l.load); got != "page 1" {
		t.Fatalf("after another product's Forget: got %q, want page 1", got)
	}
	p.Forget(7)
	if got := page(t, p, 7, l.load); got != "page 2" {
		t.Fatalf("after Forget: got %q, want a new load", got)
	}
	p.Forget(0) // every page
	if got := page(t, p, 7, l.load); got != "page 3" {
		t.Fatalf("after Forget(All): got %q, want a new load", got)
	}
	clk.advance(999 * time.Millisecond)
	if got := page(t, p, 7, l.load); got != "page 3" {
		t.Fatalf("within the TTL: got %q, want page 3", got)
	}
	clk.advance(time.Millisecond)
	if got := page(t, p, 7, l.load); got != "page 4" {
		t.Fatalf("at the TTL: got %q, want a new load", got)
	}
}

// A load that was under way when its page was forgotten read the product
// before the change: its page is answered to those who waited for it, but
// not kept.
func TestPagesDropALoadOlderThanAForget(t *testing.T) {
	for _, forget := range []int64{5, 0} {
		t.Run(fmt.Sprintf("Forget(%d)", forget), func(t *testing.T) {
			p, _ := newPages(t, time.Minute)
			started, release := make(chan struct{}), make(chan struct{})
			old := func(context.Context) ([]byte, error) {
				close(started)
				<-release
				return []byte("before the change"), nil
			}
			done := make(chan string)
			go func() { done <- page(t, p, 5, old) }()
			<-started
			p.Forget(forget)
			close(release)
			if got := <-done; got != "before the change" {
				t.Fatalf("the waiting reader got %q", got)
			}
			var l loader
			if got := page(t, p, 5, l.load); got != "page 1" {
				t.Fatalf("the next read got %q, want a load after the change", got)
			}
		})
	}
}

// Readers that miss one page at once share one load, which outlives the
// reader who started it; an error is answered to them all and not kept.
func TestPagesShareOneLoad(t *testing.T) {
	p, _ := newPages(t, time.Minute)
	var calls atomic.Int64
	release := make(chan struct{})
	slow := func(context.Context) ([]byte, error) {
		calls.Add(1)
		<-release
		return []byte("shared"), nil
	}
	// The first reader leaves before the load ends: busy, not the load's
	// failure.
	ctx, cancel := context.WithCancel(context.Background())
	left := make(chan error)
	go func() {
		_, err := p.Page(ctx, 3, slow)
		left <- err
	}()
	for calls.Load() == 0 {
		time.Sleep(time.Millisecond)
	}
	var wg sync.WaitGroup
	got := make([]string, 20)
	for i := range got {
		wg.Go(func() { got[i] = page(t, p, 3, slow) })
	}
	cancel()
	if err := <-left; !errors.Is(err, stock.ErrBusy) {
		t.Fatalf("a reader who left: %v, want ErrBusy", err)
	}
	time.Sleep(10 * time.Millisecond) // the readers join the load
	close(release)
	wg.Wait()
	for i, g := range got {
		if g != "shared" {
			t.Fatalf("reader %d got %q", i, g)
		}
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("%d loads, want 1", n)
	}

	failing := func(context.Context) ([]byte, error) { return nil, stock.ErrNotFound }
	if _, err := p.Page(context.Background(), 4, failing); !errors.Is(err, stock.ErrNotFound) {
		t.Fatalf("got %v, want the load's error", err)
	}
	var l loader
	if got := page(t, p, 4, l.load); got != "page 1" {
		t.Fatalf("after a failed load: got %q, want a new load", got)
	}
}

// An order that changes a product is announced, with the invalidation, to
// every replica, and each drops its own copy of the page: the replica that
// placed it before the order is answered, the others when they hear it. The
// order that sells the last unit says so, with its lock's fencing token.
func TestOrderAnnouncedToEveryReplicasPages(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 2, 2)
	ctx := context.Background()
	restocks := notify.New(f.rdb, f.prefix)
	mine, err := cache.NewPages(time.Minute, time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	theirs, err := cache.NewPages(time.Minute, time.Second, nil)
	if err != nil {
		t.Fatal(err)
	}
	r := f.replicaTold(t, restocks, mine, cache.Settings{})
	other := f.replicaTold(t, nil, theirs, cache.Settings{})
	events := hearing(t, restocks, other)

	// stockOf is product 1's stock on the page of replica c, whose copy
	// of the pages is pages.
	stockOf := func(c replica, pages *cache.Pages) int {
		t.Helper()
		b, err := pages.Page(ctx, 1, func(ctx context.Context) ([]byte, error) {
			p, err := c.Product(ctx, 1)
			return fmt.Appendf(nil, "%d", p.Stock), err
		})
		if err != nil {
			t.Fatal(err)
		}
		var n int
		fmt.Sscan(string(b), &n)
		return n
	}
	next := func() notify.Event {
		t.Helper()
		select {
		case e := <-events:
			return e
		case <-time.After(10 * time.Second):
			t.Fatal("nothing heard")
			return notify.Event{}
		}
	}
	if a, b := stockOf(r, mine), stockOf(other, theirs); a != 2 || b != 2 {
		t.Fatalf("before the orders: pages show %d and %d, want 2", a, b)
	}
	locks := lock.NewRedis(f.rdb, lock.RedisOptions{Prefix: f.prefix + "lock:"})
	orders := stock.NewService(stock.Deps{DB: f.db.Gorm, Locks: locks, Announcer: r}, stock.Settings{Fencing: true}, stock.Hooks{})
	for i, want := range []int{1, 0} {
		user := int64(100 + i)
		o, err := orders.PlaceOrder(ctx, 1, user, "")
		if err != nil {
			t.Fatal(err)
		}
		if got := stockOf(r, mine); got != want {
			t.Fatalf("right after order %d: this replica's page shows %d, want %d", o.ID, got, want)
		}
		e := next()
		if want > 0 && e != (notify.Event{Kind: notify.Changed, SKU: 1}) {
			t.Fatalf("after order %d: heard %+v, want a Changed of product 1", o.ID, e)
		}
		if want == 0 && (e.Kind != notify.SoldOut || e.SKU != 1 || e.Fence != o.Fence || e.Fence <= 0) {
			t.Fatalf("after the last unit's order %d (fence %d): heard %+v, want a SoldOut of product 1 with its fence", o.ID, o.Fence, e)
		}
		if got := stockOf(other, theirs); got != want {
			t.Fatalf("after hearing order %d: the other replica's page shows %d, want %d", o.ID, got, want)
		}
	}
}
