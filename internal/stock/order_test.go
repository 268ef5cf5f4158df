package stock_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"shop/internal/lock"
	"shop/internal/mysqldb"
	"shop/internal/notify"
	"shop/internal/stock"
	"shop/internal/testenv"
	"shop/internal/verify"
)

// An idempotency key belongs to its buyer and is compared exactly: another
// buyer's order under the same key, or under the same key in another case,
// is an order of its own; only the same buyer's key on another product is
// a mismatch. On every path, alone and in a batch.
func TestIdempotencyKeysBelongToTheirBuyer(t *testing.T) {
	for _, path := range orderPaths {
		t.Run(path.name, func(t *testing.T) {
			ctx := context.Background()
			db := testenv.MySQL(t)
			svc, l, _ := lined(t, db, 2, 10, path.opt, lock.RedisOptions{})
			first, err := svc.PlaceOrder(ctx, 1, 1, "shared-key")
			if err != nil {
				t.Fatal(err)
			}
			// Three at once, in one batch where batches are.
			holder := hold(t, l, 2)
			answers := queue(t, ctx, svc, 2, []int64{2, 3, 1}, []string{"shared-key", "SHARED-KEY", "SHARED-KEY"})
			letGo(t, holder)
			for i, user := range []int64{2, 3, 1} {
				r := <-answers[i]
				if r.err != nil || r.order.Replayed {
					t.Errorf("user %d, a key user 1 used in another case or on another product: %+v, %v; want an order of its own", user, r.order, r.err)
					continue
				}
				checkOrder(t, db, r.order, 2, user)
			}
			if _, err := svc.PlaceOrder(ctx, 2, 1, "shared-key"); !errors.Is(err, stock.ErrIdempotencyMismatch) {
				t.Errorf("user 1's own key on another product: %v, want ErrIdempotencyMismatch", err)
			}
			if o, err := svc.PlaceOrder(ctx, 1, 1, "shared-key"); err != nil || !o.Replayed || o.ID != first.ID {
				t.Errorf("user 1's key again: %+v, %v; want the replay of order %d", o, err, first.ID)
			}
			if r := report(t, db); !r.OK() || r.Orders != 4 {
				t.Errorf("want the four orders:\n%s", r)
			}
		})
	}
}

// When several rules refuse an order, every path answers with the same one:
// the replay first, then the product's rules (window, stock), then the
// buyer's (an order held, the limit). The careful judgement and the fast
// attempt's statements agree, alone and in a batch, guarded and naive.
func TestRulesApplyInOneOrder(t *testing.T) {
	past := time.Now().Add(-time.Hour)
	for _, path := range orderPaths {
		t.Run(path.name, func(t *testing.T) {
			ctx := context.Background()
			opt := path.opt
			opt.UserLimit = 1
			opt.SoldOutTTL = -1 // judged by MySQL, not from memory
			svc, db, _ := seeded(t, 4, 1, opt)
			order := func(sku, user int64, key string) (stock.Order, error) {
				t.Helper()
				return svc.PlaceOrder(ctx, sku, user, key)
			}
			// User 7 buys the one unit of product 1 under key k7, and so
			// reaches the limit of one order.
			bought, err := order(1, 7, "k7")
			if err != nil {
				t.Fatal(err)
			}
			// Product 2 closes; product 3 sells out to user 8.
			if err := db.Gorm.Exec("UPDATE products SET sale_ends_at = ? WHERE id = 2", past).Error; err != nil {
				t.Fatal(err)
			}
			if _, err := order(3, 8, ""); err != nil {
				t.Fatal(err)
			}
			for _, tt := range []struct {
				name      string
				sku, user int64
				key       string
				want      error
			}{
				{"a replay of an order of a sold-out product", 1, 7, "k7", nil},
				{"sold out, and ordered by the buyer already", 1, 7, "", stock.ErrSoldOut},
				{"sold out, and the buyer at the limit", 3, 7, "", stock.ErrSoldOut},
				{"the sale ended, and the buyer at the limit", 2, 7, "", stock.ErrSaleEnded},
				{"the sale ended, and sold out", 2, 8, "", stock.ErrSaleEnded},
				{"the buyer at the limit, with stock left", 4, 7, "", stock.ErrUserLimit},
			} {
				o, err := order(tt.sku, tt.user, tt.key)
				switch {
				case tt.want == nil && (err != nil || o.ID != bought.ID):
					t.Errorf("%s: %+v, %v; want order %d replayed", tt.name, o, err, bought.ID)
				case tt.want != nil && !errors.Is(err, tt.want):
					t.Errorf("%s: %v; want %v", tt.name, err, tt.want)
				}
			}

			// The same rules inside one transaction: a buyer who takes the
			// last unit and then asks again, in the same batch, is told
			// the product is sold out.
			db2 := testenv.MySQL(t)
			svc2, l, _ := lined(t, db2, 1, 1, path.opt, lock.RedisOptions{})
			holder := hold(t, l, 1)
			answers := queue(t, ctx, svc2, 1, []int64{7, 7}, nil)
			letGo(t, holder)
			if r := <-answers[0]; r.err != nil {
				t.Errorf("the last unit: %v", r.err)
			}
			if r := <-answers[1]; !errors.Is(r.err, stock.ErrSoldOut) {
				t.Errorf("the same buyer again, the product sold out: %v; want ErrSoldOut", r.err)
			}
		})
	}
}

// A buyer queued behind a lock until less than MinTimeLeft is left before
// its deadline is answered busy and not placed, so that its deadline does
// not cut the batch's transaction short; the buyers beside it are placed.
func TestBuyerNearItsDeadlineIsNotTaken(t *testing.T) {
	ctx := context.Background()
	db := testenv.MySQL(t)
	svc, l, _ := lined(t, db, 1, 10, options{}, lock.RedisOptions{})
	holder := hold(t, l, 1)
	short, cancel := context.WithTimeout(ctx, stock.MinTimeLeft+500*time.Millisecond)
	defer cancel()
	a := queue(t, ctx, svc, 1, []int64{1}, nil)[0]
	b := place(short, svc, 1, 2, "")
	waitQueued(t, svc, 2)
	c := queue(t, ctx, svc, 1, []int64{3}, nil)[0]
	time.Sleep(time.Until(mustDeadline(t, short).Add(-stock.MinTimeLeft / 2)))
	letGo(t, holder)
	if r := <-b; !errors.Is(r.err, stock.ErrBusy) {
		t.Errorf("buyer with %s left: %+v, %v; want ErrBusy", stock.MinTimeLeft/2, r.order, r.err)
	}
	for i, ch := range []<-chan result{a, c} {
		if r := <-ch; r.err != nil {
			t.Errorf("buyer %d beside it: %v", []int64{1, 3}[i], r.err)
		}
	}
	if r := report(t, db); !r.OK() || r.Orders != 2 {
		t.Errorf("want the orders of users 1 and 3:\n%s", r)
	}
	if n := userOrders(t, db, 2); n != 0 {
		t.Errorf("user 2 has %d orders, want none", n)
	}
}

func mustDeadline(t *testing.T, ctx context.Context) time.Time {
	t.Helper()
	d, ok := ctx.Deadline()
	if !ok {
		t.Fatal("no deadline")
	}
	return d
}

// A batch's transaction ends at the earliest deadline of its buyers, not a
// moment later: here its UPDATE waits for a row lock the test holds, and
// every buyer is answered busy by then, with nothing written.
func TestBatchEndsAtItsEarliestDeadline(t *testing.T) {
	ctx := context.Background()
	db := testenv.MySQL(t)
	svc, l, _ := lined(t, db, 1, 10, options{}, lock.RedisOptions{})
	row := db.Gorm.Begin()
	defer row.Rollback()
	if err := row.Exec("SELECT id FROM products WHERE id = 1 FOR UPDATE").Error; err != nil {
		t.Fatal(err)
	}
	holder := hold(t, l, 1)
	early, cancel := context.WithTimeout(ctx, 2*stock.MinTimeLeft)
	defer cancel()
	late, cancelLate := context.WithTimeout(ctx, time.Minute)
	defer cancelLate()
	answers := []<-chan result{place(late, svc, 1, 1, "")}
	waitQueued(t, svc, 1)
	answers = append(answers, place(early, svc, 1, 2, ""))
	waitQueued(t, svc, 2)
	letGo(t, holder)
	deadline := mustDeadline(t, early)
	for i, ch := range answers {
		r := <-ch
		late := time.Since(deadline)
		if !errors.Is(r.err, stock.ErrBusy) || errors.Is(r.err, stock.ErrOutcomeUnknown) {
			t.Errorf("buyer %d: %v; want ErrBusy", i+1, r.err)
		}
		// The transaction is cut at the deadline; the answer follows at
		// once. A second is room for a loaded machine, well below the
		// lock wait that the statement would otherwise run into.
		if late > time.Second {
			t.Errorf("buyer %d answered %s after the batch's earliest deadline", i+1, late)
		}
	}
	if err := row.Rollback().Error; err != nil {
		t.Fatal(err)
	}
	if r := report(t, db); !r.OK() || r.Orders != 0 || r.Stock != 10 {
		t.Errorf("a batch cut short wrote:\n%s", r)
	}
}

// A COMMIT that MySQL carries out but whose answer does not come (a stalled
// network, an fsync that hangs) is given up on within the orders' pool's
// read timeout: every buyer of the batch is answered within the order
// budget — a buyer with a key with its order, the others
// ErrOutcomeUnknown — and MySQL holds exactly the orders: each acknowledged
// one, and no other but those of unknown outcome.
func TestStalledCommitAnsweredInTime(t *testing.T) {
	for _, batch := range []int{1, 0} {
		t.Run(map[int]string{1: "alone", 0: "batch"}[batch], func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db := testenv.MySQL(t)
			_, l, _ := lined(t, db, 1, 10, options{}, lock.RedisOptions{})
			orders, p := throughProxy(t, db)
			svc := newService(orders, l, options{Settings: stock.Settings{Batch: batch}, Reads: db.Gorm})

			users, keys := []int64{7, 8, 9}, []string{"", "key-8", ""}
			holder := hold(t, l, 1)
			start := time.Now()
			var answers []<-chan result
			for i, user := range users {
				// The budget the HTTP API gives an order up to its COMMIT.
				bctx, cancel := context.WithTimeout(ctx, stock.TurnTimeout)
				defer cancel()
				answers = append(answers, place(bctx, svc, 1, user, keys[i]))
				waitQueued(t, svc, i+1)
			}
			held, release := p.HoldReply(testenv.MySQLQuery("COMMIT"))
			defer release(false)
			letGo(t, holder)
			<-held
			acked := 0
			budget := stock.TurnTimeout + mysqldb.OrdersIOTimeout + stock.InvalidateTimeout
			for i, ch := range answers {
				var r result
				select {
				case r = <-ch:
				case <-time.After(time.Until(start.Add(budget))):
					t.Fatalf("user %d not answered within the order budget of %s", users[i], budget)
				}
				took := time.Since(start)
				t.Logf("user %d after %s: %+v, %v", users[i], took.Round(time.Millisecond), r.order, r.err)
				switch {
				case r.err == nil:
					acked++
					checkOrder(t, db, r.order, 1, users[i])
				case !errors.Is(r.err, stock.ErrOutcomeUnknown):
					t.Errorf("user %d, COMMIT stalled: %v; want its order or ErrOutcomeUnknown", users[i], r.err)
				}
			}
			// Alone, only user 7's COMMIT stalls, and users 8 and 9 are
			// placed after it; in a batch, the one COMMIT of all three
			// stalls, and user 8's key finds its order.
			want := map[int]int{1: 2, 0: 1}[batch]
			if acked != want {
				t.Errorf("%d orders acknowledged, want %d", acked, want)
			}
			if r := report(t, db); !r.OK() || r.Orders != 3 {
				t.Errorf("want the three orders, committed:\n%s", r)
			}
		})
	}
}

// A fenced naive write refused because the row changed after it was read
// (an older holder's write landing late) leaves a stock above zero but below
// the batch's: that is a batch to place again (ErrBusy), not a sold-out
// product — and the Service does not remember the product as sold out.
func TestPartialStockIsNotSoldOut(t *testing.T) {
	ctx := context.Background()
	db := testenv.MySQL(t)
	var once sync.Once
	svc, l, _ := lined(t, db, 1, 5, options{Settings: stock.Settings{Update: stock.Naive, Fencing: true}, Hooks: stock.Hooks{BeforeWrite: func(ctx context.Context, sku int64) func() {
		once.Do(func() {
			if err := db.Gorm.Exec("UPDATE products SET stock = 1, initial_stock = 1, fence = 1 WHERE id = ?", sku).Error; err != nil {
				t.Error(err)
			}
		})
		return nil
	}}}, lock.RedisOptions{})
	holder := hold(t, l, 1)
	answers := queue(t, ctx, svc, 1, []int64{1, 2, 3}, nil)
	letGo(t, holder)
	for i, ch := range answers {
		if r := <-ch; !errors.Is(r.err, stock.ErrBusy) || errors.Is(r.err, stock.ErrSoldOut) {
			t.Errorf("buyer %d, 3 units taken where 1 is left: %v; want ErrBusy, not ErrSoldOut", i+1, r.err)
		}
	}
	if o, err := svc.PlaceOrder(ctx, 1, 4, ""); err != nil {
		t.Errorf("the unit left, right after: %v; want it sold", err)
	} else {
		checkOrder(t, db, o, 1, 4)
	}
}

// A buyer whose request ended after the batch took it is not placed, not
// even when the batch's first attempt runs into another order and the
// batch is placed again.
func TestBuyerWhoLeftIsNotPlacedOnRetry(t *testing.T) {
	ctx := context.Background()
	db := testenv.MySQL(t)
	leaving, leave := context.WithCancel(ctx)
	defer leave()
	var once sync.Once
	svc, l, _ := lined(t, db, 1, 10, options{Hooks: stock.Hooks{BeforeWrite: func(ctx context.Context, sku int64) func() {
		once.Do(func() {
			leave()
			// Another replica's order of user 1 commits meanwhile.
			if err := db.Gorm.Exec("INSERT INTO orders (sku_id, user_id) VALUES (1, 1)").Error; err != nil {
				t.Error(err)
			}
		})
		return nil
	}}}, lock.RedisOptions{})
	holder := hold(t, l, 1)
	a := queue(t, ctx, svc, 1, []int64{1}, nil)[0]
	b := place(leaving, svc, 1, 2, "")
	waitQueued(t, svc, 2)
	letGo(t, holder)
	if r := <-a; !errors.Is(r.err, stock.ErrAlreadyOrdered) {
		t.Errorf("user 1: %v; want ErrAlreadyOrdered", r.err)
	}
	if r := <-b; !errors.Is(r.err, stock.ErrBusy) || !errors.Is(r.err, context.Canceled) {
		t.Errorf("user 2, who left: %+v, %v; want ErrBusy, the request cancelled", r.order, r.err)
	}
	if n := userOrders(t, db, 2); n != 0 {
		t.Errorf("user 2, who left, has %d orders", n)
	}
	if stockOf(t, db, 1) != 10 {
		t.Errorf("stock %d, want 10: nothing sold", stockOf(t, db, 1))
	}
}

// When a turn's stock read fails, the orders queued when it began are
// answered busy; an order that came during the read is not: it gets a turn
// of its own, and is placed. A turn reads the stock of a product it knew
// sold out until lately only: here one whose units came back behind the
// service's back, after the memory lapsed.
func TestArrivalDuringAFailedReadIsSpared(t *testing.T) {
	ctx := context.Background()
	db := testenv.MySQL(t)
	_, l, _ := lined(t, db, 1, 10, options{}, lock.RedisOptions{})
	reads, p := throughProxy(t, db)
	clk := newClock(time.Now())
	svc := newService(db.Open(t), l, options{Reads: reads, Now: clk.now})
	setStock := func(n int) {
		t.Helper()
		if err := db.Gorm.Exec("UPDATE products SET stock = ? WHERE id = 1", n).Error; err != nil {
			t.Fatal(err)
		}
	}
	setStock(0)
	if _, err := svc.PlaceOrder(ctx, 1, 9, ""); !errors.Is(err, stock.ErrSoldOut) {
		t.Fatalf("with no stock: %v, want ErrSoldOut", err)
	}
	setStock(10)
	clk.set(clk.now().Add(stock.DefaultSoldOutTTL))
	held, release := p.HoldReply([]byte("SELECT stock, sale_starts_at"))
	defer release(false)
	first := place(ctx, svc, 1, 1, "")
	<-held
	second := queue(t, ctx, svc, 1, []int64{2}, nil)[0]
	release(false)
	if r := <-first; !errors.Is(r.err, stock.ErrBusy) {
		t.Errorf("the order queued when the read began: %v; want ErrBusy", r.err)
	}
	if r := <-second; r.err != nil {
		t.Errorf("the order that came during the read: %v; want it placed", r.err)
	} else {
		checkOrder(t, db, r.order, 1, 2)
	}
}

// blockingCache holds every announcement until it is let go.
type blockingCache struct {
	called chan int64
	letGo  chan struct{}
	once   sync.Once
}

func newBlockingCache(t *testing.T) *blockingCache {
	c := &blockingCache{called: make(chan int64, 10), letGo: make(chan struct{})}
	t.Cleanup(c.release)
	return c
}

func (c *blockingCache) Announce(ctx context.Context, e notify.Event) error {
	sku := e.SKU
	c.called <- sku
	<-c.letGo
	return nil
}

func (c *blockingCache) release() { c.once.Do(func() { close(c.letGo) }) }

// A buyer is answered only once the cache has been told of its order, alone
// and in a batch: a read right after a 201 never shows the old stock.
func TestAnsweredAfterTheCacheIsTold(t *testing.T) {
	for _, batch := range []int{1, 0} {
		t.Run(map[int]string{1: "alone", 0: "batch"}[batch], func(t *testing.T) {
			ctx := context.Background()
			db := testenv.MySQL(t)
			cache := newBlockingCache(t)
			svc, l, _ := lined(t, db, 1, 10, options{Settings: stock.Settings{Batch: batch}, Announcer: cache}, lock.RedisOptions{})
			holder := hold(t, l, 1)
			answers := queue(t, ctx, svc, 1, []int64{1, 2}, nil)
			letGo(t, holder)
			select {
			case <-cache.called:
			case <-time.After(10 * time.Second):
				t.Fatal("the cache was not told of the orders")
			}
			got := make([]*result, len(answers))
			for i, ch := range answers {
				select {
				case r := <-ch:
					got[i] = &r
					t.Errorf("buyer %d answered (%v) while the cache was still being told", i+1, r.err)
				case <-time.After(200 * time.Millisecond):
				}
			}
			cache.release()
			for i, ch := range answers {
				if got[i] == nil {
					r := <-ch
					got[i] = &r
				}
				if got[i].err != nil {
					t.Errorf("buyer %d: %v", i+1, got[i].err)
				}
			}
		})
	}
}

// On a MariaDB that refuses a locking read of a row changed since the
// transaction's snapshot (innodb_snapshot_isolation, ON by default from
// 11.6.2), no order fails for it: three replicas, 200 users each buying six
// products at once, with the user limit and without, on every path. Every
// buyer gets a rule's answer, never a failure, and the limit holds.
func TestOrdersUnderSnapshotIsolation(t *testing.T) {
	for _, path := range orderPaths {
		for _, limit := range []int{3, 0} {
			t.Run(fmt.Sprintf("%s, limit %d", path.name, limit), func(t *testing.T) {
				users := 200
				if path.opt.Update == stock.Naive || path.opt.Batch == 1 {
					users = 50 // the slower paths: fewer, to keep the suite short
				}
				db := testenv.MySQL(t)
				rdb, prefix := testenv.Redis(t)
				if err := stock.NewCatalog(db.Gorm).Seed(context.Background(), 6, 1000); err != nil {
					t.Fatal(err)
				}
				dsn := snapshotDSN(t, db)
				var replicas []*stock.Service
				for range 3 {
					l := lock.NewRedis(rdb, lock.RedisOptions{Prefix: prefix, TTL: 2 * time.Second, Wait: 10 * time.Second})
					opt := path.opt
					opt.UserLimit = limit
					// The reads' pool as a replica opens it, at the
					// server's isolation level.
					reads, err := mysqldb.Open(dsn, 8)
					if err != nil {
						t.Fatal(err)
					}
					t.Cleanup(func() {
						if sqlDB, err := reads.DB(); err == nil {
							sqlDB.Close()
						}
					})
					opt.Reads = reads
					replicas = append(replicas, newService((&testenv.DB{DSN: dsn}).Open(t), l, opt))
				}
				var (
					wg     sync.WaitGroup
					mu     sync.Mutex
					counts = map[string]int{}
					failed []string
				)
				for u := range users {
					for sku := int64(1); sku <= 6; sku++ {
						wg.Go(func() {
							svc := replicas[(u+int(sku))%3]
							_, err := svc.PlaceOrder(context.Background(), sku, int64(u+1), "")
							mu.Lock()
							defer mu.Unlock()
							switch {
							case err == nil:
								counts["placed"]++
							case errors.Is(err, stock.ErrUserLimit):
								counts["user_limit"]++
							default:
								if len(failed) < 5 {
									failed = append(failed, err.Error())
								}
								counts["failed"]++
							}
						})
					}
				}
				wg.Wait()
				t.Logf("%v", counts)
				if counts["failed"] > 0 {
					t.Errorf("%d orders failed, the first: %s", counts["failed"], strings.Join(failed, "; "))
				}
				want := 6 * users
				if limit > 0 {
					want = limit * users
				}
				if counts["placed"] != want {
					t.Errorf("%d orders placed, want %d", counts["placed"], want)
				}
				r := report(t, db)
				if limit > 0 {
					c, err := verify.UserLimit(context.Background(), db.Gorm, limit)
					if err != nil {
						t.Fatal(err)
					}
					r.Checks = append(r.Checks, c)
				}
				if !r.OK() || r.Orders != int64(want) {
					t.Errorf("want %d orders:\n%s", want, r)
				}
			})
		}
	}
}

// snapshotDSN is db's DSN with innodb_snapshot_isolation ON for every
// session, where the server has the variable (MariaDB from 10.6.18 and
// 10.11.8); elsewhere the test runs without it, and says so.
func snapshotDSN(t *testing.T, db *testenv.DB) string {
	t.Helper()
	var n int64
	err := db.Gorm.Raw("SELECT COUNT(*) FROM information_schema.GLOBAL_VARIABLES WHERE VARIABLE_NAME = 'INNODB_SNAPSHOT_ISOLATION'").Scan(&n).Error
	if err != nil {
		t.Fatal(err)
	}
	if n == 0 {
		t.Log("this server has no innodb_snapshot_isolation: the orders run without it")
		return db.DSN
	}
	cfg, err := mysql.ParseDSN(db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	cfg.Params["innodb_snapshot_isolation"] = "ON"
	return cfg.FormatDSN()
}

// The budgets fit in one another: a turn that waited the longest lock wait
// still has the time a buyer must have left to be taken into a transaction.
func TestLockWaitLeavesTimeForTheTransaction(t *testing.T) {
	if left := stock.TurnTimeout - stock.MaxLockWait; left <= stock.MinTimeLeft {
		t.Errorf("after the longest lock wait (%s) a turn has %s left, want more than %s", stock.MaxLockWait, left, stock.MinTimeLeft)
	}
}
