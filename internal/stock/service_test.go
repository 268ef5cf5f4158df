package stock_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"shop/internal/lock"
	"shop/internal/stock"
	"shop/internal/testenv"
)

// seeded returns a Service with a Redis lock on a fresh database holding
// products 1..n with units each.
func seeded(t *testing.T, n, units int, opt options) (*stock.Service, *testenv.DB, *lock.Redis) {
	t.Helper()
	db := testenv.MySQL(t)
	rdb, prefix := testenv.Redis(t)
	if err := stock.NewCatalog(db.Gorm).Seed(context.Background(), n, units); err != nil {
		t.Fatal(err)
	}
	l := lock.NewRedis(rdb, lock.RedisOptions{Prefix: prefix, TTL: 2 * time.Second, Wait: 100 * time.Millisecond})
	return newService(db.Gorm, l, opt), db, l
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
	svc, db, _ := seeded(t, 2, 2, options{Settings: stock.Settings{Fencing: true}})

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
	r := report(t, db)
	if !r.OK() || r.Orders != 2 || stockOf(t, db, 1) != 0 || stockOf(t, db, 2) != 2 {
		t.Errorf("after the rules: stock(1)=%d stock(2)=%d\n%s", stockOf(t, db, 1), stockOf(t, db, 2), r)
	}
}

func TestPlaceOrderIdempotencyKey(t *testing.T) {
	ctx := context.Background()
	svc, db, _ := seeded(t, 2, 5, options{})
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
	if r := report(t, db); r.Orders != 1 || stockOf(t, db, 1) != 4 || stockOf(t, db, 2) != 5 {
		t.Errorf("want one order and one unit taken:\n%s", r)
	}
}

func TestPlaceOrderBusyWritesNothing(t *testing.T) {
	ctx := context.Background()
	svc, db, l := seeded(t, 1, 1, options{})
	holder, err := l.Obtain(ctx, stock.LockKey(1))
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release(ctx)
	_, err = svc.PlaceOrder(ctx, 1, 7, "")
	if !errors.Is(err, stock.ErrBusy) || !errors.Is(err, lock.ErrNotObtained) {
		t.Fatalf("err = %v, want ErrBusy wrapping ErrNotObtained", err)
	}
	if r := report(t, db); r.Orders != 0 || r.Stock != 1 {
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
	svc := newService(db.Gorm, l, options{Settings: stock.Settings{Update: stock.Naive}, Hooks: stock.Hooks{BeforeWrite: func(ctx context.Context, sku int64) func() {
		rdb.Del(ctx, l.Key(stock.LockKey(sku))) // the lock vanishes (a failover, say)
		<-ctx.Done()                            // the watchdog notices within TTL/3
		return nil
	}}})
	_, err := svc.PlaceOrder(ctx, 1, 7, "")
	if !errors.Is(err, stock.ErrBusy) || !errors.Is(err, lock.ErrNotHeld) {
		t.Fatalf("err = %v, want ErrBusy wrapping ErrNotHeld", err)
	}
	if r := report(t, db); r.Orders != 0 || r.Stock != 1 {
		t.Errorf("the transaction of a lost lease was not rolled back:\n%s", r)
	}
}

// What BeforeWrite returns runs once per transaction, after it has ended
// (the row it wrote is free, its orders are in MySQL or gone) and before the
// lease is released, whether the transaction committed or rolled back, alone
// or as a batch.
func TestBeforeWriteAfterRunsBetweenTransactionAndRelease(t *testing.T) {
	users := []int64{1, 2, 3}
	for _, batch := range []int{1, 0} {
		for _, commit := range []bool{true, false} {
			t.Run(fmt.Sprintf("batch=%d,commit=%v", batch, commit), func(t *testing.T) {
				t.Parallel()
				ctx := context.Background()
				db := testenv.MySQL(t)
				perTx := 1 // orders each transaction places
				if batch != 1 {
					perTx = len(users)
				}
				opt := options{Settings: stock.Settings{Batch: batch, Fencing: true}}
				if !commit {
					// A naive write is a compare-and-set on the fence it
					// read: moving the fence between the read and the
					// write makes the transaction refuse and roll back.
					opt.Update, perTx = stock.Naive, 0
				}
				var (
					l      *lock.Redis
					rdb    *redis.Client
					hooks  atomic.Int32
					afters atomic.Int32
					seen   = make(chan string, len(users))
				)
				opt.BeforeWrite = func(_ context.Context, sku int64) func() {
					hooks.Add(1)
					before := ordersOf(t, db, sku)
					if !commit {
						if err := db.Gorm.Exec("UPDATE products SET fence = fence + 1 WHERE id = ?", sku).Error; err != nil {
							t.Error(err)
						}
					}
					return func() {
						afters.Add(1)
						seen <- afterState(db, rdb, l, sku, before+perTx)
					}
				}
				svc, l, rdb := lined(t, db, 1, 5, opt, lock.RedisOptions{})
				var errs []error
				if batch == 1 {
					for _, user := range users {
						_, err := svc.PlaceOrder(ctx, 1, user, "")
						errs = append(errs, err)
					}
				} else {
					holder := hold(t, l, 1)
					answers := queue(t, ctx, svc, 1, users, nil)
					letGo(t, holder)
					for _, ch := range answers {
						errs = append(errs, (<-ch).err)
					}
				}
				for i, err := range errs {
					if commit && err != nil || !commit && !errors.Is(err, stock.ErrBusy) {
						t.Errorf("buyer %d: %v", i+1, err)
					}
				}
				close(seen)
				for s := range seen {
					if s != "" {
						t.Error(s)
					}
				}
				if h, a := hooks.Load(), afters.Load(); h == 0 || a != h {
					t.Errorf("BeforeWrite ran %d times, what it returned %d times; want as often, at least once", h, a)
				}
				want := 0
				if commit {
					want = len(users)
				}
				if r := report(t, db); !r.OK() || r.Orders != int64(want) {
					t.Errorf("want %d orders:\n%s", want, r)
				}
			})
		}
	}
}

// ordersOf counts the orders of sku in MySQL.
func ordersOf(t *testing.T, db *testenv.DB, sku int64) int {
	t.Helper()
	var n int64
	if err := db.Gorm.Model(&stock.Order{}).Where("sku_id = ?", sku).Count(&n).Error; err != nil {
		t.Error(err)
	}
	return int(n)
}

// afterState checks, from outside, what an after hook must find: the SKU's
// lock still held, no transaction holding its row, and orders orders of the
// SKU in MySQL. It returns what is wrong, or "".
func afterState(db *testenv.DB, rdb *redis.Client, l *lock.Redis, sku int64, orders int) string {
	ctx := context.Background()
	if n, err := rdb.Exists(ctx, l.Key(stock.LockKey(sku))).Result(); err != nil || n != 1 {
		return fmt.Sprintf("after hook: lock key exists = %d (%v), want the lease still held", n, err)
	}
	err := db.Gorm.Transaction(func(tx *gorm.DB) error {
		return tx.Exec("SELECT id FROM products WHERE id = ? FOR UPDATE NOWAIT", sku).Error
	})
	if err != nil {
		return fmt.Sprintf("after hook: the product's row is still locked (%v): the transaction has not ended", err)
	}
	var n int64
	if err := db.Gorm.Model(&stock.Order{}).Where("sku_id = ?", sku).Count(&n).Error; err != nil || n != int64(orders) {
		return fmt.Sprintf("after hook: %d orders of sku %d in MySQL (%v), want %d", n, sku, err, orders)
	}
	return ""
}
