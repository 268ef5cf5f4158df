package stock_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"shop/internal/lock"
	"shop/internal/mysqldb"
	"shop/internal/stock"
	"shop/internal/testenv"
)

// fullPublicGate is a public Catalog on db whose gate of width places is
// full until the test ends: its pool's one connection is held, and width
// reads wait for it, each holding a place. Another public read is refused
// with ErrBusy, as under a flood of anonymous reads.
func fullPublicGate(t *testing.T, db *testenv.DB, width int) *stock.Catalog {
	t.Helper()
	ctx := context.Background()
	pool, err := mysqldb.Open(db.DSN, 1)
	if err != nil {
		t.Fatal(err)
	}
	sqlDB, err := pool.DB()
	if err != nil {
		t.Fatal(err)
	}
	held, err := sqlDB.Conn(ctx)
	if err != nil {
		t.Fatal(err)
	}
	public := stock.NewCatalog(pool).Public(width, stock.DefaultGateWait)
	readers, stop := context.WithCancel(ctx)
	done := make(chan struct{}, width)
	for range width {
		go func() {
			defer func() { done <- struct{}{} }()
			_, _ = public.Stock(readers, 1)
		}()
	}
	t.Cleanup(func() {
		stop()
		for range width {
			<-done
		}
		held.Close()
		sqlDB.Close()
	})
	// Full once the readers wait for the held connection: each took its
	// place first.
	for sqlDB.Stats().WaitCount < int64(width) {
		time.Sleep(time.Millisecond)
	}
	if _, err := public.Stock(ctx, 1); !errors.Is(err, stock.ErrBusy) {
		t.Fatalf("a read through the full gate: %v, want ErrBusy", err)
	}
	return public
}

// The lifecycle's look-ups have a bound of their own: with the public gate
// full (every anonymous read refused 503), a buyer still cancels a
// reservation and the provider's payment of another still applies.
func TestLifecycleBesideAFullPublicGate(t *testing.T) {
	ctx := context.Background()
	db := testenv.MySQL(t)
	if err := stock.NewCatalog(db.Gorm).Seed(ctx, 2, 2); err != nil {
		t.Fatal(err)
	}
	public := fullPublicGate(t, db, 2)
	svc := newService(db.Gorm, lock.NewLocal(time.Second), options{Settings: stock.Settings{PayWindow: payWindow}, Public: public})
	cancelled, err := svc.PlaceOrder(ctx, 1, 7, "")
	if err != nil {
		t.Fatal(err)
	}
	paid, err := svc.PlaceOrder(ctx, 2, 8, "")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.Order(ctx, 7, cancelled.ID); !errors.Is(err, stock.ErrBusy) {
		t.Fatalf("an anonymous order read through the full gate: %v, want ErrBusy", err)
	}

	if o, err := svc.Cancel(ctx, 7, cancelled.ID); err != nil || o.Status != stock.StatusCancelled {
		t.Errorf("cancel beside the full public gate: %+v, %v; want it cancelled", o, err)
	}
	if r, err := pay(ctx, svc, paid, "pay-full-gate"); err != nil || r.Outcome != stock.OutcomeApplied {
		t.Errorf("payment beside the full public gate: %+v, %v; want applied", r, err)
	}
	wantStatus(t, db, cancelled.ID, stock.StatusCancelled)
	wantStatus(t, db, paid.ID, stock.StatusPaid)
	if n := stockOf(t, db, 1); n != 2 {
		t.Errorf("stock of the cancelled order's product = %d, want its unit back: 2", n)
	}
}

// An order for a product that is not there, with the per-user limit on,
// is refused ErrNotFound and leaves no counter row behind; an order of a
// product makes the buyer's.
func TestAbsentProductMakesNoCounter(t *testing.T) {
	ctx := context.Background()
	db := testenv.MySQL(t)
	if err := stock.NewCatalog(db.Gorm).Seed(ctx, 1, 2); err != nil {
		t.Fatal(err)
	}
	svc := newService(db.Gorm, lock.NewLocal(time.Second), options{Settings: stock.Settings{UserLimit: 2}})
	for sku := int64(1000); sku < 1003; sku++ {
		if _, err := svc.PlaceOrder(ctx, sku, 9, ""); !errors.Is(err, stock.ErrNotFound) {
			t.Errorf("order of absent product %d: %v, want ErrNotFound", sku, err)
		}
	}
	if n, ok := counterOf(t, db, 9); ok {
		t.Errorf("user 9 has a counter of %d after orders of absent products only; want none", n)
	}
	if _, err := svc.PlaceOrder(ctx, 1, 9, ""); err != nil {
		t.Fatal(err)
	}
	checkCounterOf(t, db, 9, 1)
}
