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

// seeded returns a Service with a Redis lock on a fresh database holding
// products 1..n with units each.
func seeded(t *testing.T, n, units int, opt stock.Options) (*stock.Service, *testenv.DB, *lock.Redis) {
	t.Helper()
	db := testenv.MySQL(t)
	rdb, prefix := testenv.Redis(t)
	if err := stock.NewCatalog(db.Gorm).Seed(context.Background(), n, units); err != nil {
		t.Fatal(err)
	}
	l := lock.NewRedis(rdb, lock.RedisOptions{Prefix: prefix, TTL: 2 * time.Second, Wait: 100 * time.Millisecond})
	return stock.NewService(db.Gorm, l, opt), db, l
}

func stockOf(t *testing.T, db *testenv.DB, sku int64) int {
	t.Helper()
	n, err := stock.NewCatalog(db.Gorm).Stock(context.Background(), sku)
	if err != nil {
		t.Fatal(err)
	}
	return n
}

func TestPlaceOrderRules(t *testing.T) {
	ctx := context.Background()
	svc, db, _ := seeded(t, 2, 2, stock.Options{Fencing: true})

	o, err := svc.PlaceOrder(ctx, 1, 7, "")
	if err != nil {
		t.Fatal(err)
	}
	if o.ID == 0 || o.SKUID != 1 || o.UserID != 7 || o.CreatedAt.IsZero() || o.Fence == 0 {
		t.Errorf("order = %+v", o)
	}

	tests := []struct {
		name      string
		sku, user int64
		key       string
		want      error
	}{
		{"same user again", 1, 7, "", stock.ErrAlreadyOrdered},
		{"no such product", 99, 7, "", stock.ErrNotFound},
		{"zero sku", 0, 7, "", stock.ErrInvalid},
		{"negative user", 1, -1, "", stock.ErrInvalid},
		{"bad key", 1, 8, "no spaces allowed", stock.ErrInvalid},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if _, err := svc.PlaceOrder(ctx, tt.sku, tt.user, tt.key); !errors.Is(err, tt.want) {
				t.Fatalf("err = %v, want %v", err, tt.want)
			}
		})
	}
	if _, err := svc.PlaceOrder(ctx, 1, 8, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.PlaceOrder(ctx, 1, 9, ""); !errors.Is(err, stock.ErrSoldOut) {
		t.Fatalf("third buyer of two units: %v, want ErrSoldOut", err)
	}
	r := verify(t, db)
	if !r.OK() || r.Orders != 2 || stockOf(t, db, 1) != 0 || stockOf(t, db, 2) != 2 {
		t.Errorf("after the rules: stock(1)=%d stock(2)=%d\n%s", stockOf(t, db, 1), stockOf(t, db, 2), r)
	}
}

func TestPlaceOrderIdempotencyKey(t *testing.T) {
	ctx := context.Background()
	svc, db, _ := seeded(t, 2, 5, stock.Options{})
	first, err := svc.PlaceOrder(ctx, 1, 7, "key-1")
	if err != nil {
		t.Fatal(err)
	}
	again, err := svc.PlaceOrder(ctx, 1, 7, "key-1")
	if err != nil {
		t.Fatal(err)
	}
	if !again.Replayed || first.Replayed || again.ID != first.ID || !again.CreatedAt.Equal(first.CreatedAt) {
		t.Errorf("replay = %+v, first = %+v", again, first)
	}
	if _, err := svc.PlaceOrder(ctx, 2, 7, "key-1"); !errors.Is(err, stock.ErrIdempotencyMismatch) {
		t.Errorf("same key, other SKU: %v, want ErrIdempotencyMismatch", err)
	}
	if r := verify(t, db); r.Orders != 1 || stockOf(t, db, 1) != 4 || stockOf(t, db, 2) != 5 {
		t.Errorf("want one order and one unit taken:\n%s", r)
	}
}

func TestPlaceOrderBusyWritesNothing(t *testing.T) {
	ctx := context.Background()
	svc, db, l := seeded(t, 1, 1, stock.Options{})
	holder, err := l.Obtain(ctx, stock.LockKey(1))
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release(ctx)
	_, err = svc.PlaceOrder(ctx, 1, 7, "")
	if !errors.Is(err, stock.ErrBusy) || !errors.Is(err, lock.ErrNotObtained) {
		t.Fatalf("err = %v, want ErrBusy wrapping ErrNotObtained", err)
	}
	if r := verify(t, db); r.Orders != 0 || r.Stock != 1 {
		t.Errorf("a refused order changed the database:\n%s", r)
	}
}

// A holder that learns mid-transaction that its lease is gone rolls back.
func TestPlaceOrderLostLeaseRollsBack(t *testing.T) {
	ctx := context.Background()
	db := testenv.MySQL(t)
	rdb, prefix := testenv.Redis(t)
	if err := stock.NewCatalog(db.Gorm).Seed(ctx, 1, 1); err != nil {
		t.Fatal(err)
	}
	l := lock.NewRedis(rdb, lock.RedisOptions{Prefix: prefix, TTL: 150 * time.Millisecond})
	svc := stock.NewService(db.Gorm, l, stock.Options{
		Update: stock.Naive,
		BeforeWrite: func(ctx context.Context, sku int64) {
			rdb.Del(ctx, l.Key(stock.LockKey(sku))) // the lock vanishes (a failover, say)
			<-ctx.Done()                            // the watchdog notices within TTL/3
		},
	})
	_, err := svc.PlaceOrder(ctx, 1, 7, "")
	if !errors.Is(err, stock.ErrBusy) || !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("err = %v, want ErrBusy wrapping ErrNotHeld", err)
	}
	if r := verify(t, db); r.Orders != 0 || r.Stock != 1 {
		t.Errorf("the transaction of a lost lease was not rolled back:\n%s", r)
	}
}
