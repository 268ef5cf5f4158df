package stock_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"shop/internal/lock"
	"shop/internal/stock"
	"shop/internal/testenv"
	"shop/internal/verify"
)

// counterOf is user's row of user_orders: its count, and whether it exists.
func counterOf(t *testing.T, db *testenv.DB, user int64) (int, bool) {
	t.Helper()
	var n []int
	if err := db.Gorm.Raw("SELECT orders FROM user_orders WHERE user_id = ?", user).Scan(&n).Error; err != nil {
		t.Fatal(err)
	}
	if len(n) == 0 {
		return 0, false
	}
	return n[0], true
}

// userOrders is how many orders user holds in MySQL.
func userOrders(t *testing.T, db *testenv.DB, user int64) int {
	t.Helper()
	var n int
	if err := db.Gorm.Raw("SELECT COUNT(*) FROM orders WHERE user_id = ?", user).Scan(&n).Error; err != nil {
		t.Fatal(err)
	}
	return n
}

// checkCounter fails unless user holds want orders in MySQL and their
// counter says so.
func checkCounter(t *testing.T, db *testenv.DB, user int64, want int) {
	t.Helper()
	if n := userOrders(t, db, user); n != want {
		t.Errorf("user %d holds %d orders, want %d", user, n, want)
	}
	if n, ok := counterOf(t, db, user); !ok || n != want {
		t.Errorf("counter of user %d = %d (exists %v), want %d", user, n, ok, want)
	}
}

// The one-order path (Batch 1): the limit refuses the order beyond it and
// writes nothing for it; an order the user already holds and a replay are
// answered as such, not as the limit, and count nothing.
func TestUserLimitOneOrder(t *testing.T) {
	ctx := context.Background()
	svc, db, _ := seeded(t, 3, 2, options{Settings: stock.Settings{Batch: 1, UserLimit: 2, Fencing: true}})
	first, err := svc.PlaceOrder(ctx, 1, 7, "k1")
	if err != nil {
		t.Fatal(err)
	}
	if _, err := svc.PlaceOrder(ctx, 2, 7, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.PlaceOrder(ctx, 3, 7, ""); !errors.Is(err, stock.ErrUserLimit) {
		t.Fatalf("third order: %v, want ErrUserLimit", err)
	}
	if n := stockOf(t, db, 3); n != 2 {
		t.Errorf("stock of the refused product = %d, want 2", n)
	}
	if o, err := svc.PlaceOrder(ctx, 1, 7, "k1"); err != nil || !o.Replayed || o.ID != first.ID {
		t.Errorf("replay at the limit = %+v, %v; want order %d replayed", o, err, first.ID)
	}
	if _, err := svc.PlaceOrder(ctx, 2, 7, ""); !errors.Is(err, stock.ErrAlreadyOrdered) {
		t.Errorf("repeat order at the limit: %v, want ErrAlreadyOrdered", err)
	}
	if _, err := svc.PlaceOrder(ctx, 3, 8, ""); err != nil {
		t.Errorf("another user: %v", err)
	}
	checkCounter(t, db, 7, 2)
	checkCounter(t, db, 8, 1)
	if r := report(t, db); !r.OK() {
		t.Errorf("verify:\n%s", r)
	}
}

// A batch decides the limit per buyer in arrival order: a buyer at the
// limit is refused and the next buyer gets the unit; a replay and a repeat
// order in the same batch are answered as such and count nothing.
func TestUserLimitInBatch(t *testing.T) {
	ctx := context.Background()
	db := testenv.MySQL(t)
	svc, l, _ := lined(t, db, 3, 2, options{Settings: stock.Settings{UserLimit: 2}}, lock.RedisOptions{})
	// User 7 reaches the limit with products 1 and 2, one under a key;
	// user 5 leaves one unit of product 3.
	first, err := svc.PlaceOrder(ctx, 1, 7, "k1")
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range []struct{ sku, user int64 }{{2, 7}, {3, 5}} {
		if _, err := svc.PlaceOrder(ctx, o.sku, o.user, ""); err != nil {
			t.Fatal(err)
		}
	}
	// Queued behind a holder of product 3's lock: 7 again (at the limit),
	// then 8, who gets the last unit, then 9, too late.
	lease := hold(t, l, 3)
	answers := queue(t, ctx, svc, 3, []int64{7, 8, 9}, nil)
	// And behind product 1's: 7's replay and 7's repeat order.
	lease1 := hold(t, l, 1)
	again := queue(t, ctx, svc, 1, []int64{7, 7}, []string{"k1", ""})
	letGo(t, lease)
	letGo(t, lease1)

	if r := <-answers[0]; !errors.Is(r.err, stock.ErrUserLimit) {
		t.Errorf("user 7 at the limit: %+v, want ErrUserLimit", r)
	}
	if r := <-answers[1]; r.err != nil {
		t.Errorf("user 8 after a buyer at the limit: %v, want the last unit", r.err)
	} else {
		checkOrder(t, db, r.order, 3, 8)
	}
	if r := <-answers[2]; !errors.Is(r.err, stock.ErrSoldOut) {
		t.Errorf("user 9: %+v, want ErrSoldOut", r)
	}
	if r := <-again[0]; r.err != nil || !r.order.Replayed || r.order.ID != first.ID {
		t.Errorf("replay at the limit: %+v; want order %d replayed", r, first.ID)
	}
	if r := <-again[1]; !errors.Is(r.err, stock.ErrAlreadyOrdered) {
		t.Errorf("repeat order at the limit: %+v, want ErrAlreadyOrdered", r)
	}
	if st := svc.Stats(); st.Orders-st.Batches < 3 {
		t.Errorf("%+v: the queued orders were not placed in batches", st)
	}
	checkCounter(t, db, 7, 2)
	checkCounter(t, db, 8, 1)
	checkCounter(t, db, 9, 0)
	if n := stockOf(t, db, 1); n != 1 {
		t.Errorf("stock of product 1 = %d after a replay and a repeat order, want 1", n)
	}
	if r := report(t, db); !r.OK() {
		t.Errorf("verify:\n%s", r)
	}
}

// One user's concurrent orders for different SKUs, through three replicas
// each with its own lock client and pool, in batches and alone: exactly the
// limit is sold.
func TestUserLimitAcrossReplicas(t *testing.T) {
	const (
		limit = 3
		skus  = 24
	)
	for _, batch := range []int{0, 1} {
		t.Run(fmt.Sprintf("batch=%d", batch), func(t *testing.T) {
			ctx := context.Background()
			db := testenv.MySQL(t)
			rdb, prefix := testenv.Redis(t)
			if err := stock.NewCatalog(db.Gorm).Seed(ctx, skus, 1); err != nil {
				t.Fatal(err)
			}
			// Each order transaction waits for the others before it writes:
			// a limit checked by a count that does not lock would let
			// every one of them count the same orders.
			hook := barrier(skus, 200*time.Millisecond)
			var replicas []*stock.Service
			for range 3 {
				l := lock.NewRedis(rdb, lock.RedisOptions{Prefix: prefix, TTL: 5 * time.Second, Wait: 30 * time.Second})
				replicas = append(replicas, newService(db.Open(t), l,
					options{Settings: stock.Settings{Batch: batch, UserLimit: limit, Fencing: true}, Hooks: stock.Hooks{BeforeWrite: hook}}))
			}
			var (
				mu      sync.Mutex
				placed  int
				limited int
				others  []error
				wg      sync.WaitGroup
			)
			start := make(chan struct{})
			for sku := 1; sku <= skus; sku++ {
				svc := replicas[sku%len(replicas)]
				wg.Go(func() {
					<-start
					_, err := svc.PlaceOrder(ctx, int64(sku), 7, "")
					mu.Lock()
					defer mu.Unlock()
					switch {
					case err == nil:
						placed++
					case errors.Is(err, stock.ErrUserLimit):
						limited++
					default:
						others = append(others, err)
					}
				})
			}
			close(start)
			wg.Wait()
			if placed != limit || limited != skus-limit || len(others) > 0 {
				t.Errorf("%d placed, %d refused at the limit, other errors %v; want %d and %d", placed, limited, others, limit, skus-limit)
			}
			checkCounter(t, db, 7, limit)
			if r := report(t, db); !r.OK() || r.Orders != limit || r.Stock != skus-limit {
				t.Errorf("verify:\n%s", r)
			}
			if c, err := verify.UserLimit(ctx, db.Gorm, limit); err != nil || c.Violations != 0 {
				t.Errorf("verify.UserLimit = %+v, %v", c, err)
			}
		})
	}
}

// A seed deletes the counters with the orders: the user may buy the limit
// again.
func TestSeedResetsUserCounters(t *testing.T) {
	ctx := context.Background()
	svc, db, _ := seeded(t, 3, 1, options{Settings: stock.Settings{UserLimit: 1}})
	if _, err := svc.PlaceOrder(ctx, 1, 7, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.PlaceOrder(ctx, 2, 7, ""); !errors.Is(err, stock.ErrUserLimit) {
		t.Fatalf("second order: %v, want ErrUserLimit", err)
	}
	if err := stock.NewCatalog(db.Gorm).Seed(ctx, 3, 1); err != nil {
		t.Fatal(err)
	}
	if _, ok := counterOf(t, db, 7); ok {
		t.Error("the seed left user 7's counter")
	}
	svc.ForgetSoldOut(0)
	if _, err := svc.PlaceOrder(ctx, 2, 7, ""); err != nil {
		t.Errorf("order after the seed: %v", err)
	}
	checkCounter(t, db, 7, 1)
}

// catalog is a fresh database with products 1..n of one unit each, and a
// Redis lock for Services on it.
func catalog(t *testing.T, n int) (*testenv.DB, *lock.Redis) {
	t.Helper()
	db := testenv.MySQL(t)
	rdb, prefix := testenv.Redis(t)
	if err := stock.NewCatalog(db.Gorm).Seed(context.Background(), n, 1); err != nil {
		t.Fatal(err)
	}
	return db, lock.NewRedis(rdb, lock.RedisOptions{Prefix: prefix, TTL: 2 * time.Second, Wait: 10 * time.Second})
}

// statements is a gorm logger that keeps every statement run.
type statements struct {
	logger.Interface
	mu  sync.Mutex
	sql []string
}

func (s *statements) Trace(_ context.Context, _ time.Time, fc func() (string, int64), _ error) {
	q, _ := fc()
	s.mu.Lock()
	defer s.mu.Unlock()
	s.sql = append(s.sql, q)
}

// touching returns the statements that name table.
func (s *statements) touching(table string) []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	var found []string
	for _, q := range s.sql {
		if strings.Contains(q, table) {
			found = append(found, q)
		}
	}
	return found
}

// Orders placed with the limit off touch no counter — not one statement —
// and a counter made once the limit is on starts at the orders the user
// holds.
func TestUserCountersStartAtOrdersPlacedWithLimitOff(t *testing.T) {
	ctx := context.Background()
	db, l := catalog(t, 4)
	spy := &statements{Interface: logger.Discard}
	traced := db.Open(t).Session(&gorm.Session{Logger: spy})
	for _, batch := range []int{1, 0} {
		off := newService(traced, l, options{Settings: stock.Settings{Batch: batch}})
		if _, err := off.PlaceOrder(ctx, int64(batch+1), 7, ""); err != nil {
			t.Fatal(err)
		}
	}
	if len(spy.sql) == 0 {
		t.Fatal("no statement traced")
	}
	if q := spy.touching("user_orders"); len(q) > 0 {
		t.Errorf("with the limit off, orders ran %q", q)
	}
	if _, ok := counterOf(t, db, 7); ok {
		t.Error("a counter was made with the limit off")
	}

	on := newService(db.Open(t), l, options{Settings: stock.Settings{UserLimit: 3}})
	if _, err := on.PlaceOrder(ctx, 3, 7, ""); err != nil {
		t.Fatalf("third order under a limit of 3: %v", err)
	}
	if _, err := on.PlaceOrder(ctx, 4, 7, ""); !errors.Is(err, stock.ErrUserLimit) {
		t.Errorf("fourth order: %v, want ErrUserLimit", err)
	}
	checkCounter(t, db, 7, 3)
}

// waitForStatement waits until a statement of db's database that starts
// with prefix is running — here it can only be waiting for a lock — and
// fails the test if the call that should wait ends first.
func waitForStatement(t *testing.T, db *testenv.DB, prefix string, ended <-chan result) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		select {
		case r := <-ended:
			t.Fatalf("ended without waiting for the reseed: %+v", r)
		default:
		}
		var n int
		err := db.Gorm.Raw(`SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE DB = DATABASE() AND INFO LIKE ?`,
			prefix+"%").Scan(&n).Error
		if err != nil {
			t.Fatal(err)
		}
		if n > 0 {
			return
		}
	}
	t.Fatalf("no %q waited", prefix)
}

// A counter made while a reseed is under way counts the orders the reseed
// leaves, not those it deletes: the user's first order under the limit
// comes while a reseed has deleted the orders but not committed.
func TestUserCounterMadeDuringReseed(t *testing.T) {
	ctx := context.Background()
	db, l := catalog(t, 3)
	// Two orders of user 7, placed while the limit was off.
	for _, q := range []string{
		"UPDATE products SET stock = 0 WHERE id IN (1, 2)",
		"INSERT INTO orders (sku_id, user_id) VALUES (1, 7), (2, 7)",
	} {
		if err := db.Gorm.Exec(q).Error; err != nil {
			t.Fatal(err)
		}
	}
	// The reseed, as Catalog.Seed does it (at REPEATABLE READ), held open.
	reseed := db.Open(t).Begin(&sql.TxOptions{Isolation: sql.LevelRepeatableRead})
	for _, q := range []string{"DELETE FROM orders", "DELETE FROM user_orders", "UPDATE products SET stock = initial_stock"} {
		if err := reseed.Exec(q).Error; err != nil {
			reseed.Rollback()
			t.Fatal(err)
		}
	}
	svc := newService(db.Open(t), l, options{Settings: stock.Settings{UserLimit: 2, Batch: 1}})
	answer := place(ctx, svc, 3, 7, "")
	// The counter's locking count waits for the reseed's deleted rows.
	waitForStatement(t, db, "SELECT COUNT(*) FROM orders", answer)
	if err := reseed.Commit().Error; err != nil {
		t.Fatal(err)
	}
	if r := <-answer; r.err != nil {
		t.Errorf("first order after the reseed, under a limit of 2: %v", r.err)
	}
	checkCounter(t, db, 7, 1)
}

// An order whose counter a reseed deleted after it was made is refused as
// busy and writes nothing; the retry makes the counter again.
func TestUserCounterGoneIsBusy(t *testing.T) {
	ctx := context.Background()
	var drop func()
	svc, db, _ := seeded(t, 1, 1, options{Settings: stock.Settings{Batch: 1, UserLimit: 1}, Hooks: stock.Hooks{BeforeWrite: func(context.Context, int64) func() {
		if drop != nil {
			drop()
		}
		return nil
	}}})
	drop = func() {
		drop = nil
		if err := db.Gorm.Exec("DELETE FROM user_orders").Error; err != nil {
			t.Error(err)
		}
	}
	if _, err := svc.PlaceOrder(ctx, 1, 7, ""); !errors.Is(err, stock.ErrBusy) {
		t.Fatalf("order without its counter: %v, want ErrBusy", err)
	}
	if n := stockOf(t, db, 1); n != 1 || userOrders(t, db, 7) != 0 {
		t.Errorf("stock %d, orders %d after a refused order; want 1 and 0", n, userOrders(t, db, 7))
	}
	if _, err := svc.PlaceOrder(ctx, 1, 7, ""); err != nil {
		t.Errorf("retry: %v", err)
	}
	checkCounter(t, db, 7, 1)
}
