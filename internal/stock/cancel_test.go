package stock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"shop/internal/lock"
	"shop/internal/stock"
	"shop/internal/testenv"
)

// A cancellation that MySQL applied is never answered busy, which says that
// nothing changed: when the COMMIT's answer is lost, and when the COMMIT
// was answered but the order could not be read back, it is
// ErrCancelOutcomeUnknown. The order is cancelled once, its unit is back,
// and cancelling again answers the cancelled order.
func TestCancelAppliedIsNeverBusy(t *testing.T) {
	for _, tt := range []struct{ name, cut string }{
		{"COMMIT lost", "COMMIT"},
		{"read-back lost", "SELECT *, ("},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := testenv.MySQL(t)
			_, l, _ := lined(t, db, 1, 3, options{}, lock.RedisOptions{})
			// Orders, the cancellation's transaction and its read-back go
			// through the proxy; the first read of the order, the
			// lifecycle's look-up, does not (Lookups), so that the cut is
			// the read-back's.
			pool, p := throughProxy(t, db)
			svc := newService(pool, l, options{Settings: stock.Settings{PayWindow: payWindow, Fencing: true},
				Reads: pool, Lookups: stock.NewCatalog(db.Gorm)})
			o, err := svc.PlaceOrder(ctx, 1, 7, "")
			if err != nil {
				t.Fatal(err)
			}
			lost := cutReply(t, p, tt.cut)
			_, err = svc.Cancel(ctx, 7, o.ID)
			lost()
			t.Logf("cancel, %s: %v", tt.name, err)
			if !errors.Is(err, stock.ErrCancelOutcomeUnknown) || errors.Is(err, stock.ErrBusy) {
				t.Errorf("cancel, %s: %v; want ErrCancelOutcomeUnknown, not ErrBusy", tt.name, err)
			}
			wantSettled(t, db, 1, 3, []int64{o.ID}, stock.StatusCancelled)
			again, err := svc.Cancel(ctx, 7, o.ID)
			if err != nil || again.Status != stock.StatusCancelled {
				t.Errorf("cancel again: %+v, %v; want the cancelled order", again, err)
			}
			wantSettled(t, db, 1, 3, []int64{o.ID}, stock.StatusCancelled)
		})
	}
}

// A reservation that is payable when the cancellation locks it, and whose
// pay_by passes before the cancellation's UPDATE, is answered
// ErrOrderExpired, not busy: nothing is cancelled, and the sweep returns
// the unit as expired.
func TestCancelLapsingWhileLockedIsExpired(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	var lapsing, reached atomic.Int64 // the order to let lapse; the one the hook saw
	var db *testenv.DB
	// The hook runs with the order locked: it waits, on a connection of
	// its own, until MySQL's clock has passed the order's pay_by.
	hook := func(ctx context.Context, sku int64) {
		id := lapsing.Load()
		if id == 0 {
			return
		}
		reached.Store(id)
		for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(2 * time.Millisecond) {
			var past bool
			if err := db.Gorm.Raw("SELECT pay_by <= UTC_TIMESTAMP(6) FROM orders WHERE id = ?", id).Scan(&past).Error; err != nil || past {
				return
			}
		}
	}
	svc, db, _, _ := openPool(t, "orders pool", options{Hooks: stock.Hooks{BeforeEnd: hook}})
	// The order must still be payable at the cancellation's locking read,
	// which a loaded machine may reach late: its window starts short and
	// doubles until the hook has seen the order locked.
	for user, margin := int64(1), 250*time.Millisecond; ; user, margin = user+1, margin*2 {
		o, err := svc.PlaceOrder(ctx, 1, user, "")
		if err != nil {
			t.Fatal(err)
		}
		if err := db.Gorm.Exec("UPDATE orders SET pay_by = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND WHERE id = ?",
			margin.Microseconds(), o.ID).Error; err != nil {
			t.Fatal(err)
		}
		lapsing.Store(o.ID)
		_, err = svc.Cancel(ctx, user, o.ID)
		lapsing.Store(0)
		if reached.Load() != o.ID {
			if margin > 5*time.Second {
				t.Fatalf("the cancellation never locked a payable order (last: %v)", err)
			}
			t.Logf("window of %s lapsed before the cancellation locked the order (%v): again, longer", margin, err)
			if _, err := svc.Sweep(ctx); err != nil {
				t.Fatal(err)
			}
			continue
		}
		if !errors.Is(err, stock.ErrOrderExpired) || errors.Is(err, stock.ErrBusy) {
			t.Errorf("cancel of a reservation that lapsed while locked: %v; want ErrOrderExpired", err)
		}
		wantStatus(t, db, o.ID, stock.StatusReserved)
		if n, err := svc.Sweep(ctx); err != nil || n != 1 {
			t.Errorf("sweep after it: %d, %v; want 1 returned", n, err)
		}
		wantSettled(t, db, 1, 2, []int64{o.ID}, stock.StatusExpired)
		return
	}
}

// Payment events race cancellations and the sweep, many at once: 300
// races, and not one answered busy (a deadlock between a payment and a
// cancellation or the sweep would be). Each cancellation race has exactly
// one winner; each payment racing the sweep across pay_by is either applied
// or owed back as expired; every unit not paid goes back exactly once.
func TestPaymentsRaceCancelsAndSweepAtScale(t *testing.T) {
	t.Parallel()
	const skus, perSKU = 50, 6 // 300 reservations: half race a cancellation, half the sweep
	ctx := context.Background()
	db := testenv.MySQL(t)
	// Leases that a loaded machine's stalls do not run out: a lost lease is
	// busy too, and not what this test is after.
	_, l, _ := lined(t, db, skus, perSKU, options{}, lock.RedisOptions{TTL: 30 * time.Second})
	pool := db.OpenOrders(t, 16)
	svc := newService(pool, l, options{Settings: stock.Settings{PayWindow: payWindow, Fencing: true}})
	start := time.Now()
	orders := make([]stock.Order, skus*perSKU)
	var wg sync.WaitGroup
	errs := make(chan error, len(orders)*3)
	for i := range orders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			// Placing them is not the race: a busy order is sent again,
			// as a buyer would.
			o, err := svc.PlaceOrder(ctx, int64(1+i%skus), int64(1+i), "")
			for try := 0; errors.Is(err, stock.ErrBusy) && try < 3; try++ {
				o, err = svc.PlaceOrder(ctx, int64(1+i%skus), int64(1+i), "")
			}
			orders[i] = o
			if err != nil {
				errs <- fmt.Errorf("order %d: %w", i, err)
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	t.Logf("placed in %s", time.Since(start))
	// The sweep's half lapses together, soon, by MySQL's clock; payments for
	// them start now and keep arriving across pay_by while sweeps run.
	var sweepIDs []int64
	for i, o := range orders {
		if i%2 == 1 {
			sweepIDs = append(sweepIDs, o.ID)
		}
	}
	if err := db.Gorm.Exec("UPDATE orders SET pay_by = UTC_TIMESTAMP(6) + INTERVAL 200000 MICROSECOND WHERE id IN ?", sweepIDs).Error; err != nil {
		t.Fatal(err)
	}
	type race struct {
		receipt   stock.Receipt
		payErr    error
		cancelErr error
	}
	races := make([]race, len(orders))
	errs = make(chan error, 64)
	sweeping, swept := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(swept)
		for {
			if _, err := svc.Sweep(ctx); err != nil {
				errs <- fmt.Errorf("sweep: %w", err)
			}
			select {
			case <-sweeping:
				return
			default:
			}
		}
	}()
	for i, o := range orders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i%2 == 1 {
				// Spread over the 400 ms around pay_by.
				time.Sleep(time.Duration(i%40) * 10 * time.Millisecond)
				races[i].receipt, races[i].payErr = pay(ctx, svc, o, fmt.Sprintf("sweep-race-%d", i))
				return
			}
			var inner sync.WaitGroup
			inner.Add(1)
			go func() { defer inner.Done(); _, races[i].cancelErr = svc.Cancel(ctx, o.UserID, o.ID) }()
			races[i].receipt, races[i].payErr = pay(ctx, svc, o, fmt.Sprintf("cancel-race-%d", i))
			inner.Wait()
		}()
	}
	wg.Wait()
	t.Logf("raced in %s", time.Since(start))
	close(sweeping)
	<-swept
	// What the sweep did not get to before it stopped, it returns now.
	if _, err := svc.Sweep(ctx); err != nil {
		t.Error(err)
	}
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	var rows []stock.Order
	if err := db.Gorm.Raw("SELECT * FROM orders").Scan(&rows).Error; err != nil {
		t.Fatal(err)
	}
	now := make(map[int64]stock.Order, len(rows))
	for _, o := range rows {
		now[o.ID] = o
	}
	busy, back := 0, 0
	for i, r := range races {
		if errors.Is(r.payErr, stock.ErrBusy) || errors.Is(r.cancelErr, stock.ErrBusy) {
			busy++
		}
		if r.payErr != nil {
			t.Errorf("race %d: payment: %v", i, r.payErr)
			continue
		}
		o := now[orders[i].ID]
		switch {
		case i%2 == 0 && r.receipt.Outcome == stock.OutcomeApplied:
			if !errors.Is(r.cancelErr, stock.ErrOrderPaid) || o.Status != stock.StatusPaid {
				t.Errorf("race %d: paid, and the cancellation: %v; order %s", i, r.cancelErr, o.Status)
			}
		case i%2 == 0:
			if r.cancelErr != nil || r.receipt.Reason != stock.RefundOrderCancelled || o.Status != stock.StatusCancelled {
				t.Errorf("race %d: %+v, and the cancellation: %v; order %s", i, r.receipt, r.cancelErr, o.Status)
			}
			back++
		case r.receipt.Outcome == stock.OutcomeApplied:
			if o.Status != stock.StatusPaid {
				t.Errorf("race %d: payment applied, order %s", i, o.Status)
			}
		default:
			if r.receipt.Reason != stock.RefundOrderExpired || o.Status != stock.StatusExpired {
				t.Errorf("race %d: payment %+v across pay_by, order %s; want applied, or owed back as expired", i, r.receipt, o.Status)
			}
			back++
		}
	}
	t.Logf("%d races: %d units back, %d busy", len(races), back, busy)
	if busy > 0 {
		t.Errorf("%d of %d races answered busy, want none", busy, len(races))
	}
	total := 0
	for sku := int64(1); sku <= skus; sku++ {
		total += stockOf(t, db, sku)
	}
	if total != back {
		t.Errorf("%d units back in stock, want %d: one per cancellation or expiry", total, back)
	}
	verified(t, db)
}
