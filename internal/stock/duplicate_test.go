package stock_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"

	"github.com/go-sql-driver/mysql"
	"gorm.io/gorm"

	"shop/internal/lock"
	"shop/internal/stock"
	"shop/internal/testenv"
)

// likeMySQL8 returns a pool on db whose duplicate-key errors read as MySQL
// 8.0.19 and later word them, the key named with its table ("for key
// 'orders.uq_orders_user_sku'") where MariaDB writes 'uq_orders_user_sku'.
func likeMySQL8(t *testing.T, db *testenv.DB) *gorm.DB {
	t.Helper()
	g := db.Open(t)
	rewrite := func(tx *gorm.DB) {
		var me *mysql.MySQLError
		if errors.As(tx.Error, &me) && me.Number == 1062 && !strings.Contains(me.Message, "'orders.") {
			me.Message = strings.Replace(me.Message, "for key '", "for key 'orders.", 1)
		}
	}
	if err := g.Callback().Create().After("gorm:create").Register("test:mysql8", rewrite); err != nil {
		t.Fatal(err)
	}
	if err := g.Callback().Raw().After("gorm:raw").Register("test:mysql8", rewrite); err != nil {
		t.Fatal(err)
	}
	return g
}

// sellerLikeMySQL8 is a Service on products 1..2 with 10 units each that
// writes through a pool worded like MySQL 8 and runs hook before each write.
func sellerLikeMySQL8(t *testing.T, db *testenv.DB, batch int, hook func(context.Context, int64) func()) (*stock.Service, *lock.Redis) {
	t.Helper()
	_, l, _ := lined(t, db, 2, 10, options{}, lock.RedisOptions{})
	svc := newService(likeMySQL8(t, db), l, options{Settings: stock.Settings{Batch: batch, Fencing: true}, Hooks: stock.Hooks{BeforeWrite: hook}})
	return svc, l
}

// once returns a BeforeWrite hook that runs f the first time only: another
// replica's order committed between this holder's checks and its INSERT.
func once(f func(ctx context.Context, sku int64)) func(context.Context, int64) func() {
	var o sync.Once
	return func(ctx context.Context, sku int64) func() {
		o.Do(func() { f(ctx, sku) })
		return nil
	}
}

// A repeat order is 409 already_ordered on MySQL 8 too, where the duplicate
// key's message names 'orders.uq_orders_user_sku'.
func TestRepeatOrderOnMySQL8(t *testing.T) {
	ctx := context.Background()
	for _, batch := range []int{1, 0} {
		t.Run(map[int]string{1: "alone", 0: "batch"}[batch], func(t *testing.T) {
			db := testenv.MySQL(t)
			svc, _ := sellerLikeMySQL8(t, db, batch, nil)
			if _, err := svc.PlaceOrder(ctx, 1, 7, ""); err != nil {
				t.Fatal(err)
			}
			_, err := svc.PlaceOrder(ctx, 1, 7, "")
			if !errors.Is(err, stock.ErrAlreadyOrdered) {
				t.Fatalf("second order of user 7: %v, want ErrAlreadyOrdered", err)
			}
			if r := report(t, db); !r.OK() || r.Orders != 1 {
				t.Errorf("want one order:\n%s", r)
			}
		})
	}
}

// Orders that collide with an order committed after they were checked —
// the same user's of the SKU, or one of the same user under the same
// idempotency key — are told apart by asking MySQL, alone and in a batch.
// The batch is one transaction and one more in its place, never its orders
// placed again one by one: a buyer who sends one key to two products at
// once cannot turn a hot SKU's batches into single orders. A key belongs to
// its buyer: another buyer's order under the same key is no collision.
func TestDuplicateAnsweredByQueryOnMySQL8(t *testing.T) {
	ctx := context.Background()
	tests := []struct {
		name string
		// committed is the order another replica commits meanwhile; the
		// order under test is user 8's of SKU 1 under key "key-8".
		committed string
		check     func(t *testing.T, o stock.Order, err error)
		// orders is how many orders of user 8 or under key-8 there are
		// afterwards.
		orders int64
	}{
		{"same user and sku", "INSERT INTO orders (sku_id, user_id) VALUES (1, 8)",
			func(t *testing.T, o stock.Order, err error) {
				if !errors.Is(err, stock.ErrAlreadyOrdered) {
					t.Errorf("%+v, %v; want ErrAlreadyOrdered", o, err)
				}
			}, 1},
		{"same key, another product", "INSERT INTO orders (sku_id, user_id, idempotency_key) VALUES (2, 8, 'key-8')",
			func(t *testing.T, o stock.Order, err error) {
				if !errors.Is(err, stock.ErrIdempotencyMismatch) {
					t.Errorf("%+v, %v; want ErrIdempotencyMismatch", o, err)
				}
			}, 1},
		{"same key, same order", "INSERT INTO orders (sku_id, user_id, idempotency_key) VALUES (1, 8, 'key-8')",
			func(t *testing.T, o stock.Order, err error) {
				if err != nil || !o.Replayed || o.SKUID != 1 || o.UserID != 8 {
					t.Errorf("%+v, %v; want the committed order, replayed", o, err)
				}
			}, 1},
		{"same key, another user", "INSERT INTO orders (sku_id, user_id, idempotency_key) VALUES (1, 9, 'key-8')",
			func(t *testing.T, o stock.Order, err error) {
				if err != nil || o.Replayed || o.SKUID != 1 || o.UserID != 8 {
					t.Errorf("%+v, %v; want a new order of user 8", o, err)
				}
			}, 2},
	}
	for _, batch := range []int{1, 0} {
		for _, tt := range tests {
			t.Run(map[int]string{1: "alone", 0: "batch"}[batch]+"/"+tt.name, func(t *testing.T) {
				db := testenv.MySQL(t)
				svc, l := sellerLikeMySQL8(t, db, batch, once(func(ctx context.Context, sku int64) {
					if err := db.Gorm.WithContext(ctx).Exec(tt.committed).Error; err != nil {
						t.Error(err)
					}
				}))
				if batch == 1 {
					o, err := svc.PlaceOrder(ctx, 1, 8, "key-8")
					tt.check(t, o, err)
				} else {
					holder := hold(t, l, 1)
					answers := queue(t, ctx, svc, 1, []int64{8, 10}, []string{"key-8", ""})
					letGo(t, holder)
					r := <-answers[0]
					tt.check(t, r.order, r.err)
					if r := <-answers[1]; r.err != nil {
						t.Errorf("the other buyer of the batch: %v", r.err)
					} else {
						checkOrder(t, db, r.order, 1, 10)
					}
				}
				if st := svc.Stats(); st.Batches != 1 {
					t.Errorf("stats %+v: want the orders decided in one batch", st)
				}
				var n int64
				if err := db.Gorm.Model(&stock.Order{}).Where("user_id = 8 OR idempotency_key = 'key-8'").Count(&n).Error; err != nil || n != tt.orders {
					t.Errorf("%d orders of user 8 or under key-8 (%v), want %d", n, err, tt.orders)
				}
			})
		}
	}
}
