package stock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"shop/internal/lock"
	"shop/internal/stock"
	"shop/internal/testenv"
)

// A buyer's counter made while a return of the buyer's order is under way
// counts what the return leaves. The order was placed with the limit off,
// so the buyer has no counter; its cancellation, with the limit on, has
// taken the order off a counter that is not there and stops before its
// COMMIT; the buyer's next order makes the counter then. Counted with a
// plain read, the counter would hold the cancelled order too, one too high
// for good.
func TestUserCounterMadeDuringAReturn(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db, l := catalog(t, 2)
	off := newService(db.Open(t), l, options{Settings: stock.Settings{PayWindow: payWindow}})
	o, err := off.PlaceOrder(ctx, 1, 7, "")
	if err != nil {
		t.Fatal(err)
	}
	h := newHeld()
	on := newService(db.Open(t), l, options{Settings: stock.Settings{PayWindow: payWindow, UserLimit: 5},
		Hooks: stock.Hooks{BeforeReturn: h.hook}})
	cancelled := make(chan error, 1)
	go func() { _, err := on.Cancel(ctx, 7, o.ID); cancelled <- err }()
	<-h.at
	ordered := place(ctx, on, 2, 7, "")
	// The order's count waits for the cancellation's row lock (or, counted
	// without one, the order ends first).
	var r *result
	for deadline := time.Now().Add(10 * time.Second); r == nil; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the order neither ended nor waited for the cancellation")
		}
		select {
		case got := <-ordered:
			r = &got
			continue
		default:
		}
		var n int
		if err := db.Gorm.Raw(`SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = DATABASE() AND INFO LIKE 'SELECT COUNT(*) FROM orders%FOR UPDATE'`).
			Scan(&n).Error; err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			break
		}
	}
	close(h.let)
	if err := <-cancelled; err != nil {
		t.Fatalf("cancel: %v", err)
	}
	if r == nil {
		got := <-ordered
		r = &got
	}
	if r.err != nil {
		t.Fatalf("order after the cancellation: %v", r.err)
	}
	wantStatus(t, db, o.ID, stock.StatusCancelled)
	checkCounterOf(t, db, 7, 1)
}

// A read that found no stock refuses the orders that were queued before it
// began, not those that arrived while it was under way: a unit given back
// meanwhile (here a cancellation) is theirs to take. The read's answer is
// held in the network while the unit comes back and a new order queues.
func TestOrderAfterAReturnTakesTheUnit(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.MySQL(t)
	_, l, _ := lined(t, db, 1, 1, options{}, lock.RedisOptions{})
	reads, p := throughProxy(t, db)
	clk := newClock(time.Now())
	svc := newService(db.Open(t), l, options{Settings: stock.Settings{PayWindow: payWindow, Fencing: true},
		Reads: reads, Public: stock.NewCatalog(db.Gorm), Now: clk.now})
	first, err := svc.PlaceOrder(ctx, 1, 1, "")
	if err != nil {
		t.Fatal(err)
	}
	// The sell-out is remembered; once it lapses, the product known sold
	// out until lately is read before its lock.
	clk.set(clk.now().Add(stock.DefaultSoldOutTTL))
	held, release := p.HoldReply([]byte("SELECT stock, sale_starts_at, sale_ends_at FROM products"))
	before := place(ctx, svc, 1, 2, "")
	select {
	case <-held:
	case r := <-before:
		t.Fatalf("order ended without reading the stock: %v", r.err)
	case <-time.After(10 * time.Second):
		t.Fatal("the stock read never went through the proxy")
	}
	// MySQL has answered zero; the answer waits in the proxy.
	if _, err := svc.Cancel(ctx, 1, first.ID); err != nil {
		t.Fatal(err)
	}
	after := place(ctx, svc, 1, 3, "")
	waitQueued(t, svc, 2)
	release(true)
	rb, ra := <-before, <-after
	t.Logf("queued before the read: %v; after the return: %v", rb.err, ra.err)
	if rb.err != nil && !errors.Is(rb.err, stock.ErrSoldOut) {
		t.Errorf("order queued before the read: %v; want sold out or an order", rb.err)
	}
	if ra.err != nil {
		t.Errorf("order queued after the unit came back: %v; want the unit", ra.err)
	}
	if n := stockOf(t, db, 1); n != 0 {
		t.Errorf("stock %d, want 0", n)
	}
	verified(t, db)
}

// An order's created_at is MySQL's clock, as its pay_by is, whatever the
// replica's clock says: pay_by is created_at plus the window, exactly.
func TestCreatedAtIsMySQLsClock(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	db := testenv.MySQL(t)
	// The replica's clock is an hour behind; its sale window judges that
	// clock, and admits the order.
	behind := func() time.Time { return time.Now().Add(-time.Hour) }
	for _, batch := range []int{1, 0} {
		_, l, _ := lined(t, db, 1, 2, options{}, lock.RedisOptions{})
		svc := newService(db.Open(t), l, options{Settings: stock.Settings{PayWindow: payWindow, Batch: batch}, Now: behind})
		o, err := svc.PlaceOrder(ctx, 1, 7, "")
		if err != nil {
			t.Fatal(err)
		}
		row := orderRow(t, db, o.ID)
		var mysqlNow time.Time
		if err := db.Gorm.Raw("SELECT UTC_TIMESTAMP(6)").Scan(&mysqlNow).Error; err != nil {
			t.Fatal(err)
		}
		for _, got := range []stock.Order{o, row} {
			if d := mysqlNow.Sub(got.CreatedAt); d < 0 || d > time.Minute {
				t.Errorf("batch %d: created_at %v, MySQL's clock now %v: want MySQL's clock at the INSERT", batch, got.CreatedAt, mysqlNow)
			}
			if got.PayBy == nil || !got.PayBy.Equal(got.CreatedAt.Add(payWindow)) {
				t.Errorf("batch %d: created_at %v, pay_by %v: want pay_by = created_at + %s", batch, got.CreatedAt, got.PayBy, payWindow)
			}
		}
	}
}
