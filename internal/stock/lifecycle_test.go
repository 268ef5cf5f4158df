package stock_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"

	"shop/internal/lock"
	"shop/internal/mysqldb"
	"shop/internal/stock"
	"shop/internal/testenv"
	"shop/internal/verify"
)

// payWindow is the tests' payment window: long enough that nothing lapses
// unless a test makes it (lapse).
const payWindow = time.Hour

// pools runs test once with each pool the lifecycle may write through: the
// service's orders pool (READ COMMITTED), and a plain one at REPEATABLE
// READ with innodb_snapshot_isolation ON where the server has it — which
// refuses a locking read of a row changed since the transaction's snapshot
// (error 1020).
func pools(t *testing.T, test func(t *testing.T, open func(opt options) (*stock.Service, *testenv.DB, *lock.Redis))) {
	for _, pool := range []string{"orders pool", "repeatable read, snapshot isolation"} {
		t.Run(pool, func(t *testing.T) {
			test(t, func(opt options) (*stock.Service, *testenv.DB, *lock.Redis) {
				t.Helper()
				svc, db, l, _ := openPool(t, pool, opt)
				return svc, db, l
			})
		})
	}
}

// openPool is a Service with a payment window on a new database seeded
// with 3 products of 2 units, writing through pool (see pools), with the
// pool and the lock, for more replicas.
func openPool(t *testing.T, pool string, opt options) (*stock.Service, *testenv.DB, *lock.Redis, *gorm.DB) {
	t.Helper()
	db := testenv.MySQL(t)
	rdb, prefix := testenv.Redis(t)
	if err := stock.NewCatalog(db.Gorm).Seed(context.Background(), 3, 2); err != nil {
		t.Fatal(err)
	}
	var orders *gorm.DB
	var err error
	if dsn := snapshotDSN(t, db); pool == "orders pool" {
		orders, err = mysqldb.OpenOrders(dsn, 8)
	} else {
		orders, err = mysqldb.Open(dsn, 8)
	}
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if sqlDB, err := orders.DB(); err == nil {
			sqlDB.Close()
		}
	})
	if opt.PayWindow == 0 {
		opt.PayWindow = payWindow
	}
	opt.Fencing = true
	l := lock.NewRedis(rdb, lock.RedisOptions{Prefix: prefix, TTL: 2 * time.Second, Wait: time.Second})
	return newService(orders, l, opt), db, l, orders
}

// lapse ends the payment window of orders ids now, by MySQL's clock, as
// the passing of time would: the sweep finds them, a payment is late.
func lapse(t *testing.T, db *testenv.DB, ids ...int64) {
	t.Helper()
	if err := db.Gorm.Exec("UPDATE orders SET pay_by = UTC_TIMESTAMP(6) - INTERVAL 1 SECOND WHERE id IN ?", ids).Error; err != nil {
		t.Fatal(err)
	}
}

// lapsedReservations places an order of sku for each of users 1..n through
// svc, ends their payment windows (lapse), and returns their ids.
func lapsedReservations(t *testing.T, svc *stock.Service, db *testenv.DB, sku int64, n int) []int64 {
	t.Helper()
	var ids []int64
	for user := int64(1); user <= int64(n); user++ {
		o, err := svc.PlaceOrder(context.Background(), sku, user, "")
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, o.ID)
	}
	lapse(t, db, ids...)
	return ids
}

// orderRow is order id as MySQL has it.
func orderRow(t *testing.T, db *testenv.DB, id int64) stock.Order {
	t.Helper()
	var o stock.Order
	if err := db.Gorm.Take(&o, id).Error; err != nil {
		t.Fatal(err)
	}
	return o
}

// pay is the payment provider reporting payment id for order o, of the
// amount o owes.
func pay(ctx context.Context, svc *stock.Service, o stock.Order, id string) (stock.Receipt, error) {
	return svc.Receive(ctx, stock.Payment{Provider: "webhook", PaymentID: id, OrderID: o.ID,
		AmountCents: *o.AmountCents, Currency: *o.Currency, EventID: "msg_" + id})
}

// refundsOf are the refunds owed for order id: payment id → reason.
func refundsOf(t *testing.T, db *testenv.DB, id int64) map[string]string {
	t.Helper()
	var rows []struct {
		PaymentID string
		Reason    string
	}
	if err := db.Gorm.Raw("SELECT payment_id, reason FROM refunds WHERE order_id = ?", id).Scan(&rows).Error; err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, r := range rows {
		m[r.PaymentID] = r.Reason
	}
	return m
}

// wantStatus fails unless order id has status and its unit was given
// back (returned_at set) exactly when the status says so.
func wantStatus(t *testing.T, db *testenv.DB, id int64, status string) {
	t.Helper()
	o := orderRow(t, db, id)
	back := o.Status == stock.StatusCancelled || o.Status == stock.StatusExpired
	if o.Status != status || back != (o.ReturnedAt != nil) {
		t.Errorf("order %d: status %s, returned_at %v; want %s, returned_at set only when cancelled or expired", id, o.Status, o.ReturnedAt, status)
	}
}

// wantSettled fails unless sku's stock is units, each order of ids has
// status (wantStatus), and shop verify's checks hold.
func wantSettled(t *testing.T, db *testenv.DB, sku int64, units int, ids []int64, status string) {
	t.Helper()
	if n := stockOf(t, db, sku); n != units {
		t.Errorf("stock of %d = %d, want %d: every unit back once", sku, n, units)
	}
	for _, id := range ids {
		wantStatus(t, db, id, status)
	}
	verified(t, db)
}

// verified fails unless shop verify's checks hold.
func verified(t *testing.T, db *testenv.DB) {
	t.Helper()
	r, err := verify.Sale(context.Background(), db.Gorm, nil)
	if err != nil {
		t.Fatal(err)
	}
	if !r.OK() {
		t.Errorf("verify: %+v", r)
	}
}

// held pauses the transactions that give units back at their COMMIT
// until let is closed, and closes at when the first one gets there.
type held struct {
	at, let chan struct{}
	once    sync.Once
}

func newHeld() *held { return &held{at: make(chan struct{}), let: make(chan struct{})} }

func (h *held) hook(ctx context.Context, sku int64) {
	h.once.Do(func() { close(h.at) })
	<-h.let
}

// An order with a payment window is reserved until pay_by and owes its
// product's price; the payment wins while the window is open, the same
// payment again answers the same, another payment is owed back, and a
// buyer cannot read another's order.
func TestPayReservation(t *testing.T) {
	pools(t, func(t *testing.T, open func(options) (*stock.Service, *testenv.DB, *lock.Redis)) {
		ctx := context.Background()
		svc, db, _ := open(options{})
		o, err := svc.PlaceOrder(ctx, 1, 7, "k1")
		if err != nil {
			t.Fatal(err)
		}
		if o.Status != stock.StatusReserved || o.PayBy == nil || o.PayBy.Sub(o.CreatedAt) < payWindow-time.Minute {
			t.Fatalf("placed %+v, want reserved with pay_by an hour on", o)
		}
		if o.AmountCents == nil || *o.AmountCents != 137 || o.Currency == nil || *o.Currency != "USD" {
			t.Errorf("placed order owes %v %v, want 137 USD, product 1's price", o.AmountCents, o.Currency)
		}
		if _, err := svc.Order(ctx, 8, o.ID); !errors.Is(err, stock.ErrOrderNotFound) {
			t.Errorf("another buyer reads: %v, want ErrOrderNotFound", err)
		}
		if r, err := pay(ctx, svc, o, "pay-1"); err != nil || r.Outcome != stock.OutcomeApplied || r.Again {
			t.Fatalf("pay = %+v, %v; want applied", r, err)
		}
		if paid := orderRow(t, db, o.ID); paid.PaymentID == nil || *paid.PaymentID != "pay-1" {
			t.Fatalf("paid order %+v, want paid by pay-1", paid)
		}
		if r, err := pay(ctx, svc, o, "pay-1"); err != nil || r.Outcome != stock.OutcomeApplied || !r.Again {
			t.Errorf("the same payment again = %+v, %v; want applied, again", r, err)
		}
		if r, err := pay(ctx, svc, o, "pay-2"); err != nil || r.Outcome != stock.OutcomeOwed || r.Reason != stock.RefundDuplicatePayment {
			t.Errorf("another payment = %+v, %v; want owed: duplicate_payment", r, err)
		}
		if _, err := svc.Cancel(ctx, 7, o.ID); !errors.Is(err, stock.ErrOrderPaid) {
			t.Errorf("cancel a paid order: %v, want ErrOrderPaid", err)
		}
		if r, err := svc.PlaceOrder(ctx, 1, 7, "k1"); err != nil || !r.Replayed || r.Status != stock.StatusPaid {
			t.Errorf("replay of the key = %+v, %v; want the order, paid now", r, err)
		}
		if r := refundsOf(t, db, o.ID); len(r) != 1 || r["pay-2"] != stock.RefundDuplicatePayment {
			t.Errorf("refunds owed for the paid order = %v, want pay-2 only", r)
		}
		wantStatus(t, db, o.ID, stock.StatusPaid)
		verified(t, db)
	})
}

// A payment after pay_by is late even if no sweep has run: refused, and
// owed back once however often it is delivered. The sweep then returns the
// unit once, and the buyer may order the product again, with a new key:
// the old one replays the expired order.
func TestLatePaymentAndReorder(t *testing.T) {
	pools(t, func(t *testing.T, open func(options) (*stock.Service, *testenv.DB, *lock.Redis)) {
		ctx := context.Background()
		svc, db, _ := open(options{})
		o, err := svc.PlaceOrder(ctx, 1, 7, "k1")
		if err != nil {
			t.Fatal(err)
		}
		lapse(t, db, o.ID)
		for range 2 {
			if r, err := pay(ctx, svc, o, "pay-late"); err != nil || r.Outcome != stock.OutcomeOwed || r.Reason != stock.RefundOrderExpired {
				t.Fatalf("late payment = %+v, %v; want owed: order_expired", r, err)
			}
		}
		if r := refundsOf(t, db, o.ID); len(r) != 1 || r["pay-late"] != stock.RefundOrderExpired {
			t.Errorf("refunds owed = %v, want pay-late: order_expired once", r)
		}
		wantStatus(t, db, o.ID, stock.StatusReserved) // no sweep yet
		if n, err := svc.Sweep(ctx); err != nil || n != 1 {
			t.Fatalf("sweep = %d, %v; want 1 unit back", n, err)
		}
		if n, err := svc.Sweep(ctx); err != nil || n != 0 {
			t.Errorf("second sweep = %d, %v; want nothing left to return", n, err)
		}
		wantStatus(t, db, o.ID, stock.StatusExpired)
		if n := stockOf(t, db, 1); n != 2 {
			t.Errorf("stock = %d, want 2: the unit back", n)
		}
		if r, err := svc.PlaceOrder(ctx, 1, 7, "k1"); err != nil || !r.Replayed || r.ID != o.ID || r.Status != stock.StatusExpired {
			t.Errorf("the old key = %+v, %v; want the expired order replayed", r, err)
		}
		again, err := svc.PlaceOrder(ctx, 1, 7, "k2")
		if err != nil || again.ID == o.ID || again.Status != stock.StatusReserved {
			t.Fatalf("re-order after expiry = %+v, %v; want a new reservation", again, err)
		}
		if _, err := svc.PlaceOrder(ctx, 1, 7, ""); !errors.Is(err, stock.ErrAlreadyOrdered) {
			t.Errorf("a second active order: %v, want ErrAlreadyOrdered", err)
		}
		if n := stockOf(t, db, 1); n != 1 {
			t.Errorf("stock = %d, want 1", n)
		}
		verified(t, db)
	})
}

// A payment races a return of its order's unit — the sweep's, of an order
// whose window has lapsed, or the buyer's cancellation — that holds the
// order: the return's transaction has flipped it and waits at its COMMIT
// (the BeforeReturn hook) while the payment's UPDATE waits for the row.
// Once the return commits, the payment finds the order ended and is owed
// back, once; the unit is back once, and the return, asked again, changes
// nothing.
func TestPaymentWaitsForAReturn(t *testing.T) {
	for _, race := range []struct {
		name string
		// lapsed ends the order's window first: the sweep returns it.
		lapsed bool
		// give is the return, again the same asked a second time.
		give, again func(ctx context.Context, svc *stock.Service, o stock.Order) error
		status      string
		reason      string
	}{
		{
			name: "the sweep", lapsed: true,
			give: func(ctx context.Context, svc *stock.Service, _ stock.Order) error {
				_, err := svc.Sweep(ctx)
				return err
			},
			again: func(ctx context.Context, svc *stock.Service, _ stock.Order) error {
				n, err := svc.Sweep(ctx)
				return errors.Join(err, wantZero(n))
			},
			status: stock.StatusExpired, reason: stock.RefundOrderExpired,
		},
		{
			name: "a cancellation",
			give: func(ctx context.Context, svc *stock.Service, o stock.Order) error {
				_, err := svc.Cancel(ctx, o.UserID, o.ID)
				return err
			},
			again: func(ctx context.Context, svc *stock.Service, o stock.Order) error {
				if again, err := svc.Cancel(ctx, o.UserID, o.ID); err != nil || again.Status != stock.StatusCancelled {
					return fmt.Errorf("cancel again = %+v, %v; want the cancelled order", again, err)
				}
				return nil
			},
			status: stock.StatusCancelled, reason: stock.RefundOrderCancelled,
		},
	} {
		t.Run(race.name, func(t *testing.T) {
			pools(t, func(t *testing.T, open func(options) (*stock.Service, *testenv.DB, *lock.Redis)) {
				ctx := context.Background()
				h := newHeld()
				svc, db, _ := open(options{Hooks: stock.Hooks{BeforeReturn: h.hook}})
				o, err := svc.PlaceOrder(ctx, 1, 7, "")
				if err != nil {
					t.Fatal(err)
				}
				if race.lapsed {
					lapse(t, db, o.ID)
				}
				given := make(chan error, 1)
				go func() { given <- race.give(ctx, svc, o) }()
				<-h.at
				paid := make(chan stock.Receipt, 1)
				failed := make(chan error, 1)
				go func() {
					r, err := pay(ctx, svc, o, "pay-1")
					failed <- err
					paid <- r
				}()
				select {
				case err := <-failed:
					t.Fatalf("the payment was answered (%v) while %s held its order", err, race.name)
				case <-time.After(300 * time.Millisecond):
				}
				close(h.let)
				if err := <-given; err != nil {
					t.Fatal(err)
				}
				if err := <-failed; err != nil {
					t.Fatalf("payment after %s: %v", race.name, err)
				}
				if r := <-paid; r.Outcome != stock.OutcomeOwed || r.Reason != race.reason {
					t.Errorf("payment after %s = %+v, want owed: %s", race.name, r, race.reason)
				}
				if r := refundsOf(t, db, o.ID); len(r) != 1 || r["pay-1"] != race.reason {
					t.Errorf("refunds owed = %v, want pay-1: %s", r, race.reason)
				}
				if err := race.again(ctx, svc, o); err != nil {
					t.Error(err)
				}
				wantStatus(t, db, o.ID, race.status)
				if n := stockOf(t, db, 1); n != 2 {
					t.Errorf("stock = %d, want 2: the unit back once", n)
				}
				verified(t, db)
			})
		})
	}
}

// The payment holds the row: a payment's UPDATE, uncommitted, while the
// window lapses and a sweep starts; the sweep's locking read waits for it
// and then finds the order paid, and returns nothing.
func TestSweepWaitsForAPayment(t *testing.T) {
	pools(t, func(t *testing.T, open func(options) (*stock.Service, *testenv.DB, *lock.Redis)) {
		ctx := context.Background()
		svc, db, _ := open(options{})
		p, err := svc.PlaceOrder(ctx, 2, 7, "")
		if err != nil {
			t.Fatal(err)
		}
		// Its window ends half a second from now; the payment's UPDATE
		// comes before that, and stays uncommitted until after.
		if err := db.Gorm.Exec("UPDATE orders SET pay_by = UTC_TIMESTAMP(6) + INTERVAL 500000 MICROSECOND WHERE id = ?", p.ID).Error; err != nil {
			t.Fatal(err)
		}
		tx := db.Gorm.Begin()
		defer tx.Rollback()
		// The payment's transaction as Receive runs it: its row in the
		// ledger, then the UPDATE.
		if err := tx.Exec("INSERT INTO payments (provider, payment_id, order_id, amount_cents, currency, event_id, received_at, outcome) "+
			"VALUES ('webhook', 'pay-2', ?, ?, 'USD', 'msg', UTC_TIMESTAMP(6), 'applied')", p.ID, *p.AmountCents).Error; err != nil {
			t.Fatal(err)
		}
		res := tx.Exec("UPDATE orders SET status = 'paid', payment_id = 'pay-2', paid_at = UTC_TIMESTAMP(6) WHERE id = ? AND status = 'reserved' AND pay_by > UTC_TIMESTAMP(6)", p.ID)
		if res.Error != nil || res.RowsAffected != 1 {
			t.Fatalf("the payment's UPDATE: %v, %d rows", res.Error, res.RowsAffected)
		}
		time.Sleep(700 * time.Millisecond)
		swept := make(chan error, 1)
		go func() { n, err := svc.Sweep(ctx); swept <- errors.Join(err, wantZero(n)) }()
		select {
		case err := <-swept:
			t.Fatalf("the sweep ended (%v) while the payment held the order", err)
		case <-time.After(300 * time.Millisecond):
		}
		if err := tx.Commit().Error; err != nil {
			t.Fatal(err)
		}
		if err := <-swept; err != nil {
			t.Errorf("sweep after the payment: %v", err)
		}
		wantStatus(t, db, p.ID, stock.StatusPaid)
		if n := stockOf(t, db, 2); n != 1 {
			t.Errorf("stock of the paid product = %d, want 1", n)
		}
		verified(t, db)
	})
}

func wantZero(n int) error {
	if n != 0 {
		return errors.New("the sweep returned units of a paid order")
	}
	return nil
}

// A paid order cannot be cancelled, another buyer's order is not found, and
// an order whose window has ended is expired, not cancelled.
func TestCancelRefused(t *testing.T) {
	pools(t, func(t *testing.T, open func(options) (*stock.Service, *testenv.DB, *lock.Redis)) {
		ctx := context.Background()
		svc, db, _ := open(options{})
		p, err := svc.PlaceOrder(ctx, 2, 7, "")
		if err != nil {
			t.Fatal(err)
		}
		if r, err := pay(ctx, svc, p, "pay-2"); err != nil || r.Outcome != stock.OutcomeApplied {
			t.Fatal(r, err)
		}
		if _, err := svc.Cancel(ctx, 7, p.ID); !errors.Is(err, stock.ErrOrderPaid) {
			t.Errorf("cancel after the payment: %v, want ErrOrderPaid", err)
		}
		if _, err := svc.Cancel(ctx, 8, p.ID); !errors.Is(err, stock.ErrOrderNotFound) {
			t.Errorf("another buyer cancels: %v, want ErrOrderNotFound", err)
		}
		q, err := svc.PlaceOrder(ctx, 3, 7, "")
		if err != nil {
			t.Fatal(err)
		}
		lapse(t, db, q.ID)
		if _, err := svc.Cancel(ctx, 7, q.ID); !errors.Is(err, stock.ErrOrderExpired) {
			t.Errorf("cancel after pay_by: %v, want ErrOrderExpired", err)
		}
		wantStatus(t, db, p.ID, stock.StatusPaid)
		if n := stockOf(t, db, 2); n != 1 {
			t.Errorf("stock of the paid product = %d, want 1", n)
		}
		verified(t, db)
	})
}

// Two replicas sweep the same lapsed reservations at once. The first holds
// the SKU's lock with its transaction open (at its COMMIT) while the
// second starts: the second finds the shard claimed, or the SKU's lock
// held, and skips it until it is free, then finds nothing left. Every unit
// goes back once. The same again with a lock that excludes
// nothing (lock.None): the product row's lock and the conditional update
// alone make the second find nothing.
func TestTwoReplicasSweep(t *testing.T) {
	for _, locks := range []string{"redis", "none"} {
		t.Run(locks, func(t *testing.T) {
			ctx := context.Background()
			db := testenv.MySQL(t)
			rdb, prefix := testenv.Redis(t)
			if err := stock.NewCatalog(db.Gorm).Seed(ctx, 1, 50); err != nil {
				t.Fatal(err)
			}
			var l stock.Locker = lock.None{}
			if locks == "redis" {
				l = lock.NewRedis(rdb, lock.RedisOptions{Prefix: prefix, TTL: 2 * time.Second, Wait: 5 * time.Second})
			}
			h := newHeld()
			a := newService(db.Gorm, l, options{Settings: stock.Settings{PayWindow: payWindow, Fencing: true}, Hooks: stock.Hooks{BeforeReturn: h.hook}})
			b := newService(db.Gorm, l, options{Settings: stock.Settings{PayWindow: payWindow, Fencing: true}})
			ids := lapsedReservations(t, a, db, 1, 40)
			first := make(chan int, 1)
			go func() {
				n, err := a.Sweep(ctx)
				if err != nil {
					t.Error(err)
				}
				first <- n
			}()
			<-h.at
			second := make(chan int, 1)
			go func() {
				n, err := b.Sweep(ctx)
				if err != nil {
					t.Error(err)
				}
				second <- n
			}()
			time.Sleep(300 * time.Millisecond)
			close(h.let)
			if n, m := <-first, <-second; n+m != 40 || m != 0 {
				t.Errorf("the sweeps returned %d and %d units, want 40 and 0", n, m)
			}
			wantSettled(t, db, 1, 50, ids, stock.StatusExpired)
		})
	}
}

// A sweep killed in the middle of its transaction — its orders flipped and
// its units added back, uncommitted, when its connection dies, as it does
// with its process — has changed nothing: MySQL rolls it back. The next
// sweep returns every unit, once.
func TestSweepKilledMidTransaction(t *testing.T) {
	ctx := context.Background()
	db := testenv.MySQL(t)
	rdb, prefix := testenv.Redis(t)
	if err := stock.NewCatalog(db.Gorm).Seed(ctx, 1, 5); err != nil {
		t.Fatal(err)
	}
	l := lock.NewRedis(rdb, lock.RedisOptions{Prefix: prefix, TTL: 2 * time.Second, Wait: 5 * time.Second})
	h := newHeld()
	orders, err := mysqldb.OpenOrders(db.DSN, 4)
	if err != nil {
		t.Fatal(err)
	}
	svc := newService(orders, l, options{Settings: stock.Settings{PayWindow: payWindow, Fencing: true}, Hooks: stock.Hooks{BeforeReturn: h.hook}})
	ids := lapsedReservations(t, svc, db, 1, 3)
	killed := make(chan error, 1)
	go func() { _, err := svc.Sweep(ctx); killed <- err }()
	<-h.at
	// The sweep's transaction holds the product's row: find its session
	// and kill it, as the death of its process would. Of this test's
	// database: the server's other tests have transactions too, and one of
	// theirs killed instead let the sweep commit.
	var thread int64
	if err := db.Gorm.Raw("SELECT t.trx_mysql_thread_id FROM information_schema.INNODB_TRX t " +
		"JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id WHERE t.trx_rows_modified > 0 AND p.DB = DATABASE()").Scan(&thread).Error; err != nil || thread == 0 {
		t.Fatalf("the sweep's transaction: thread %d, %v", thread, err)
	}
	if err := db.Gorm.Exec("KILL ?", thread).Error; err != nil {
		t.Fatal(err)
	}
	var rows int64
	for deadline := time.Now().Add(5 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if err := db.Gorm.Raw("SELECT COUNT(*) FROM information_schema.INNODB_TRX WHERE trx_mysql_thread_id = ?", thread).Scan(&rows).Error; err != nil {
			t.Fatal(err)
		}
		if rows == 0 || time.Now().After(deadline) {
			break
		}
	}
	if n := stockOf(t, db, 1); n != 2 {
		t.Errorf("stock after the killed sweep = %d, want 2: nothing given back", n)
	}
	// The process would be gone; here the sweep carries on to its COMMIT,
	// on a dead connection, and gives up the SKU's lock, as the lease's
	// expiry would.
	close(h.let)
	if err := <-killed; err == nil {
		t.Error("the killed sweep reported no error")
	}
	for _, id := range ids {
		wantStatus(t, db, id, stock.StatusReserved)
	}
	sweeper := newService(db.Gorm, l, options{Settings: stock.Settings{PayWindow: payWindow, Fencing: true}})
	if n, err := sweeper.Sweep(ctx); err != nil || n != 3 {
		t.Errorf("the next sweep = %d, %v; want 3", n, err)
	}
	wantSettled(t, db, 1, 5, ids, stock.StatusExpired)
}

// SHOP_USER_LIMIT counts active orders: a reservation that expired or was
// cancelled frees its place, for another product or the same one again.
func TestUserLimitAcrossReorders(t *testing.T) {
	pools(t, func(t *testing.T, open func(options) (*stock.Service, *testenv.DB, *lock.Redis)) {
		ctx := context.Background()
		svc, db, _ := open(options{Settings: stock.Settings{UserLimit: 1}})
		o, err := svc.PlaceOrder(ctx, 1, 7, "")
		if err != nil {
			t.Fatal(err)
		}
		if _, err := svc.PlaceOrder(ctx, 2, 7, ""); !errors.Is(err, stock.ErrUserLimit) {
			t.Fatalf("second order: %v, want ErrUserLimit", err)
		}
		lapse(t, db, o.ID)
		if n, err := svc.Sweep(ctx); err != nil || n != 1 {
			t.Fatalf("sweep = %d, %v", n, err)
		}
		checkCounterOf(t, db, 7, 0)
		p, err := svc.PlaceOrder(ctx, 2, 7, "")
		if err != nil {
			t.Fatalf("order after expiry: %v", err)
		}
		checkCounterOf(t, db, 7, 1)
		if _, err := svc.Cancel(ctx, 7, p.ID); err != nil {
			t.Fatal(err)
		}
		checkCounterOf(t, db, 7, 0)
		q, err := svc.PlaceOrder(ctx, 1, 7, "")
		if err != nil {
			t.Fatalf("order of the first product again: %v", err)
		}
		if r, err := pay(ctx, svc, q, "pay-q"); err != nil || r.Outcome != stock.OutcomeApplied {
			t.Fatal(r, err)
		}
		if _, err := svc.PlaceOrder(ctx, 3, 7, ""); !errors.Is(err, stock.ErrUserLimit) {
			t.Errorf("order beside a paid one: %v, want ErrUserLimit", err)
		}
		checkCounterOf(t, db, 7, 1)
		verified(t, db)
	})
}

// checkCounterOf fails unless user's counter holds want, the user's active
// orders in MySQL.
func checkCounterOf(t *testing.T, db *testenv.DB, user int64, want int) {
	t.Helper()
	var active int
	if err := db.Gorm.Raw("SELECT COUNT(*) FROM orders WHERE user_id = ? AND status IN ('reserved', 'paid')", user).Scan(&active).Error; err != nil {
		t.Fatal(err)
	}
	if n, ok := counterOf(t, db, user); !ok || n != want || active != want {
		t.Errorf("user %d: counter %d (exists %v), active orders %d; want %d", user, n, ok, active, want)
	}
}
