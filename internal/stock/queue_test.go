package stock_test

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"

	"shop/internal/lock"
	"shop/internal/stock"
	"shop/internal/testenv"
)

// The tests below queue orders behind a lock the test holds, so that they
// are certain to be placed together when it lets go.

// lined is a Service on products 1..n with units each, with the lock it
// takes (waiting long, so that queued orders stay queued while the test
// holds a SKU's lock) and the Redis behind it. The Service has a pool of
// its own; db.Gorm is the test's.
func lined(t *testing.T, db *testenv.DB, n, units int, opt options, lockOpt lock.RedisOptions) (*stock.Service, *lock.Redis, *redis.Client) {
	t.Helper()
	rdb, prefix := testenv.Redis(t)
	if err := stock.NewCatalog(db.Gorm).Seed(context.Background(), n, units); err != nil {
		t.Fatal(err)
	}
	lockOpt.Prefix = prefix
	if lockOpt.TTL == 0 {
		lockOpt.TTL = 2 * time.Second
	}
	lockOpt.Wait = 20 * time.Second
	l := lock.NewRedis(rdb, lockOpt)
	return newService(db.Open(t), l, opt), l, rdb
}

type result struct {
	order stock.Order
	err   error
}

// place sends one order and returns where its answer arrives.
func place(ctx context.Context, svc *stock.Service, sku, user int64, key string) <-chan result {
	ch := make(chan result, 1)
	go func() {
		o, err := svc.PlaceOrder(ctx, sku, user, key)
		ch <- result{o, err}
	}()
	return ch
}

// queue sends the orders one after the other, each once the one before is
// queued, so that they queue in this order.
func queue(t *testing.T, ctx context.Context, svc *stock.Service, sku int64, users []int64, keys []string) []<-chan result {
	t.Helper()
	var answers []<-chan result
	for i, user := range users {
		key := ""
		if keys != nil {
			key = keys[i]
		}
		queued := svc.Stats().Queued
		answers = append(answers, place(ctx, svc, sku, user, key))
		waitQueued(t, svc, queued+1)
	}
	return answers
}

// waitQueued waits until n orders are queued.
func waitQueued(t *testing.T, svc *stock.Service, n int) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for svc.Stats().Queued < n {
		if time.Now().After(deadline) {
			t.Fatalf("%d orders queued, want %d", svc.Stats().Queued, n)
		}
		time.Sleep(time.Millisecond)
	}
}

// hold takes the SKU's lock as another process would.
func hold(t *testing.T, l *lock.Redis, sku int64) *lock.Lease {
	t.Helper()
	lease, err := l.Obtain(context.Background(), stock.LockKey(sku))
	if err != nil {
		t.Fatal(err)
	}
	return lease
}

func letGo(t *testing.T, lease *lock.Lease) {
	t.Helper()
	if err := lease.Release(context.Background()); err != nil {
		t.Fatal(err)
	}
}

// checkOrder fails unless o is an order of user for sku, and MySQL holds it
// under o.ID for that very buyer.
func checkOrder(t *testing.T, db *testenv.DB, o stock.Order, sku, user int64) {
	t.Helper()
	if o.SKUID != sku || o.UserID != user || o.ID == 0 {
		t.Errorf("order = %+v, want one of user %d for sku %d", o, user, sku)
		return
	}
	var got stock.Order
	if err := db.Gorm.Take(&got, o.ID).Error; err != nil {
		t.Errorf("order %d of user %d: %v", o.ID, user, err)
		return
	}
	if got.SKUID != sku || got.UserID != user {
		t.Errorf("answered order %d to user %d for sku %d, but MySQL has it for user %d, sku %d",
			o.ID, user, sku, got.UserID, got.SKUID)
	}
}

func TestBatchSellsStockInArrivalOrder(t *testing.T) {
	ctx := context.Background()
	db := testenv.MySQL(t)
	svc, l, _ := lined(t, db, 1, 3, options{Settings: stock.Settings{Fencing: true}}, lock.RedisOptions{})

	holder := hold(t, l, 1)
	users := []int64{11, 12, 13, 14, 15, 16}
	answers := queue(t, ctx, svc, 1, users, nil)
	letGo(t, holder)
	for i, ch := range answers {
		r := <-ch
		switch {
		case i < 3 && r.err != nil:
			t.Errorf("buyer %d of 3 units: %v", i+1, r.err)
		case i < 3:
			checkOrder(t, db, r.order, 1, users[i])
		case !errors.Is(r.err, stock.ErrSoldOut):
			t.Errorf("buyer %d of 3 units: %v, want ErrSoldOut", i+1, r.err)
		}
	}
	if st := svc.Stats(); st.Batches != 1 || st.Orders != 6 {
		t.Errorf("stats %+v: want the six orders in one transaction", st)
	}
	if r := report(t, db); !r.OK() || r.Orders != 3 || r.Stock != 0 {
		t.Errorf("want three orders and no stock left:\n%s", r)
	}
}

func TestBatchRefusesRepeatBuyersAndReplaysKeys(t *testing.T) {
	ctx := context.Background()
	db := testenv.MySQL(t)
	svc, l, _ := lined(t, db, 1, 10, options{}, lock.RedisOptions{})

	earlier, err := svc.PlaceOrder(ctx, 1, 7, "")
	if err != nil {
		t.Fatal(err)
	}
	holder := hold(t, l, 1)
	answers := queue(t, ctx, svc, 1,
		[]int64{7, 8, 8, 9, 9, 11},
		[]string{"", "", "", "key-9", "key-9", "key-9"})
	letGo(t, holder)
	var got []result
	for _, ch := range answers {
		got = append(got, <-ch)
	}
	if !errors.Is(got[0].err, stock.ErrAlreadyOrdered) {
		t.Errorf("buyer who ordered before the batch: %v, want ErrAlreadyOrdered", got[0].err)
	}
	if got[1].err != nil {
		t.Errorf("first order of user 8: %v", got[1].err)
	} else {
		checkOrder(t, db, got[1].order, 1, 8)
	}
	if !errors.Is(got[2].err, stock.ErrAlreadyOrdered) {
		t.Errorf("second order of user 8 in the same batch: %v, want ErrAlreadyOrdered", got[2].err)
	}
	first, again := got[3], got[4]
	if first.err != nil || again.err != nil {
		t.Fatalf("key-9 twice in one batch: %v, %v", first.err, again.err)
	}
	checkOrder(t, db, first.order, 1, 9)
	if first.order.Replayed || !again.order.Replayed || again.order.ID != first.order.ID {
		t.Errorf("key-9 twice in one batch: %+v then %+v, want one order, then its replay", first.order, again.order)
	}
	// A key belongs to its buyer: user 11's key-9 is not user 9's.
	if got[5].err != nil || got[5].order.Replayed {
		t.Errorf("key-9 of another user: %+v, %v; want an order of its own", got[5].order, got[5].err)
	} else {
		checkOrder(t, db, got[5].order, 1, 11)
	}
	if st := svc.Stats(); st.Batches != 2 {
		t.Errorf("stats %+v: want the earlier order's transaction and the batch's", st)
	}

	// Across batches: the key replays, whatever else is in the batch; and
	// a key that one buyer's refused order carried is free for another's.
	holder = hold(t, l, 1)
	answers = queue(t, ctx, svc, 1, []int64{12, 9, 7, 13}, []string{"", "key-9", "shared", "shared"})
	letGo(t, holder)
	if r := <-answers[0]; r.err != nil {
		t.Errorf("user 12: %v", r.err)
	}
	if r := <-answers[1]; r.err != nil || !r.order.Replayed || r.order.ID != first.order.ID {
		t.Errorf("key-9 in a later batch: %+v, %v; want the replay of order %d", r.order, r.err, first.order.ID)
	}
	if r := <-answers[2]; !errors.Is(r.err, stock.ErrAlreadyOrdered) {
		t.Errorf("user 7 again, under a key: %v, want ErrAlreadyOrdered", r.err)
	}
	if r := <-answers[3]; r.err != nil || r.order.Replayed {
		t.Errorf("user 13 under the key of user 7's refused order: %+v, %v; want an order of its own", r.order, r.err)
	} else {
		checkOrder(t, db, r.order, 1, 13)
	}
	if r := report(t, db); !r.OK() || r.Orders != 6 || r.Stock != 4 || earlier.ID == first.order.ID {
		t.Errorf("want the orders of users 7, 8, 9, 11, 12 and 13 only:\n%s", r)
	}
}

func TestBatchLostLeaseWritesNothing(t *testing.T) {
	ctx := context.Background()
	db := testenv.MySQL(t)
	var rdb *redis.Client
	var l *lock.Redis
	svc, l, rdb := lined(t, db, 1, 5, options{Hooks: stock.Hooks{BeforeWrite: func(ctx context.Context, sku int64) func() {
		rdb.Del(ctx, l.Key(stock.LockKey(sku))) // the lock vanishes (a failover, say)
		<-ctx.Done()                            // the watchdog notices within TTL/3
		return nil
	}}}, lock.RedisOptions{TTL: 150 * time.Millisecond})

	holder := hold(t, l, 1)
	answers := queue(t, ctx, svc, 1, []int64{1, 2, 3}, nil)
	letGo(t, holder)
	for i, ch := range answers {
		if r := <-ch; !errors.Is(r.err, stock.ErrBusy) || !errors.Is(r.err, lock.ErrNotHeld) {
			t.Errorf("buyer %d: %+v, %v; want ErrBusy wrapping ErrNotHeld", i+1, r.order, r.err)
		}
	}
	if st := svc.Stats(); st.Batches != 1 || st.Orders != 3 {
		t.Errorf("stats %+v: want one transaction of three orders", st)
	}
	if r := report(t, db); r.Orders != 0 || r.Stock != 5 {
		t.Errorf("the batch of a lost lease was not rolled back:\n%s", r)
	}
}

func TestBatchBuyerLeavesQueue(t *testing.T) {
	ctx := context.Background()
	db := testenv.MySQL(t)
	svc, l, _ := lined(t, db, 1, 5, options{}, lock.RedisOptions{})

	holder := hold(t, l, 1)
	leaving, leave := context.WithCancel(ctx)
	defer leave()
	answers := queue(t, leaving, svc, 1, []int64{1}, nil)
	answers = append(answers, queue(t, ctx, svc, 1, []int64{2}, nil)...)
	leave()
	if r := <-answers[0]; !errors.Is(r.err, stock.ErrBusy) || !errors.Is(r.err, context.Canceled) {
		t.Errorf("buyer who left: %+v, %v; want ErrBusy wrapping context.Canceled", r.order, r.err)
	}
	waitQueued(t, svc, 1)
	if n := svc.Stats().Queued; n != 1 {
		t.Errorf("%d orders queued after one left, want 1", n)
	}
	letGo(t, holder)
	if r := <-answers[1]; r.err != nil {
		t.Errorf("buyer who stayed: %v", r.err)
	} else {
		checkOrder(t, db, r.order, 1, 2)
	}
	if st := svc.Stats(); st.Orders != 1 {
		t.Errorf("stats %+v: the buyer who left was placed", st)
	}
	if r := report(t, db); !r.OK() || r.Orders != 1 || r.Stock != 4 {
		t.Errorf("want the order of the buyer who stayed only:\n%s", r)
	}
}

// A hot SKU's waiting orders take one slot between them: with two slots, a
// cold SKU's order goes through while a hundred wait for the hot one.
func TestBatchColdSKUNotStuckBehindHot(t *testing.T) {
	ctx := context.Background()
	db := testenv.MySQL(t)
	svc, l, _ := lined(t, db, 2, 200, options{Settings: stock.Settings{Concurrency: 2}}, lock.RedisOptions{})

	holder := hold(t, l, 1)
	var hot []<-chan result
	for user := int64(1); user <= 100; user++ {
		hot = append(hot, place(ctx, svc, 1, user, ""))
	}
	waitQueued(t, svc, 100)
	cold, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	o, err := svc.PlaceOrder(cold, 2, 1, "")
	if err != nil {
		t.Fatalf("cold SKU while the hot one waits: %v", err)
	}
	checkOrder(t, db, o, 2, 1)
	if n := svc.Stats().Queued; n != 100 {
		t.Errorf("%d hot orders queued when the cold one was placed, want all 100 still waiting", n)
	}
	letGo(t, holder)
	for i, ch := range hot {
		if r := <-ch; r.err != nil {
			t.Errorf("hot buyer %d: %v", i+1, r.err)
		}
	}
	if r := report(t, db); !r.OK() || r.Orders != 101 {
		t.Errorf("want 101 orders:\n%s", r)
	}
}

// Under innodb_autoinc_lock_mode=2 (MySQL 8's default) concurrent INSERTs
// take ids from one counter without a table lock, and with
// auto_increment_increment above 1 (as Galera sets it) one INSERT's ids are
// not consecutive at all. Eight SKUs' batches insert at once on such a
// server and session; every buyer must be answered with the id MySQL gave
// their own row.
func TestBatchIdsUnderAutoincLockMode2(t *testing.T) {
	ctx := context.Background()
	db := testenv.MySQLFrom(t, testenv.MySQLAutoinc2Env)
	var mode int
	if err := db.Gorm.Raw("SELECT @@innodb_autoinc_lock_mode").Scan(&mode).Error; err != nil || mode != 2 {
		t.Fatalf("innodb_autoinc_lock_mode = %d (%v), want 2: start the server with --innodb-autoinc-lock-mode=2", mode, err)
	}
	const skus, buyers = 8, 100
	opt := options{Settings: stock.Settings{Batch: buyers}, Hooks: stock.Hooks{BeforeWrite: barrier(skus, 5*time.Second)}}
	_, l, _ := lined(t, db, skus, buyers, opt, lock.RedisOptions{})
	cfg, err := mysql.ParseDSN(db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	cfg.Params["auto_increment_increment"] = "3"
	stepped := &testenv.DB{DSN: cfg.FormatDSN()}
	svc := newService(stepped.Open(t), l, opt)

	var holders []*lock.Lease
	answers := map[int64][]<-chan result{}
	for sku := int64(1); sku <= skus; sku++ {
		holders = append(holders, hold(t, l, sku))
		for i := range int64(buyers) {
			answers[sku] = append(answers[sku], place(ctx, svc, sku, sku*1000+i, ""))
		}
	}
	waitQueued(t, svc, skus*buyers)
	for _, h := range holders {
		letGo(t, h)
	}
	interleaved := 0
	for sku, chs := range answers {
		var ids []int64
		for i, ch := range chs {
			r := <-ch
			if r.err != nil {
				t.Fatalf("sku %d buyer %d: %v", sku, i, r.err)
			}
			checkOrder(t, db, r.order, sku, sku*1000+int64(i))
			ids = append(ids, r.order.ID)
		}
		if slices.Max(ids)-slices.Min(ids) != 3*(buyers-1) {
			interleaved++
		}
	}
	if st := svc.Stats(); st.Batches != skus {
		t.Errorf("stats %+v: want one transaction per SKU", st)
	}
	if r := report(t, db); !r.OK() || r.Orders != skus*buyers {
		t.Fatalf("want every buyer's order:\n%s", r)
	}
	t.Logf("%d of %d batches got ids interleaved with another's", interleaved, skus)
}

// barrier returns a BeforeWrite hook that holds each caller until n have
// arrived, or until patience runs out.
func barrier(n int, patience time.Duration) func(context.Context, int64) func() {
	var (
		mu      sync.Mutex
		arrived int
		all     = make(chan struct{})
	)
	return func(ctx context.Context, _ int64) func() {
		mu.Lock()
		if arrived++; arrived%n == 0 {
			close(all)
			all = make(chan struct{})
			mu.Unlock()
			return nil
		}
		wait := all
		mu.Unlock()
		select {
		case <-wait:
		case <-time.After(patience):
		case <-ctx.Done():
		}
		return nil
	}
}

// A replica that found a product sold out refuses it from memory — not even
// a stock raised behind its back is seen — until told to forget.
func TestSoldOutRemembered(t *testing.T) {
	ctx := context.Background()
	db := testenv.MySQL(t)
	svc, _, _ := lined(t, db, 2, 1, options{}, lock.RedisOptions{})
	if _, err := svc.PlaceOrder(ctx, 1, 1, ""); err != nil {
		t.Fatal(err)
	}
	if _, err := svc.PlaceOrder(ctx, 1, 2, ""); !errors.Is(err, stock.ErrSoldOut) {
		t.Fatalf("second buyer of one unit: %v, want ErrSoldOut", err)
	}
	if err := db.Gorm.Exec("UPDATE products SET stock = 1 WHERE id = 1").Error; err != nil {
		t.Fatal(err)
	}
	before := svc.Stats()
	if _, err := svc.PlaceOrder(ctx, 1, 3, ""); !errors.Is(err, stock.ErrSoldOut) {
		t.Errorf("after a change behind its back: %v, want ErrSoldOut from memory", err)
	}
	if after := svc.Stats(); after != before {
		t.Errorf("a refusal from memory ran a transaction: stats %+v, then %+v", before, after)
	}
	svc.ForgetSoldOut(2) // another product: no effect on this one
	if _, err := svc.PlaceOrder(ctx, 1, 3, ""); !errors.Is(err, stock.ErrSoldOut) {
		t.Errorf("after forgetting another product: %v, want ErrSoldOut", err)
	}
	svc.ForgetSoldOut(1)
	o, err := svc.PlaceOrder(ctx, 1, 3, "")
	if err != nil {
		t.Fatalf("after ForgetSoldOut: %v", err)
	}
	checkOrder(t, db, o, 1, 3)
}

// Orders waiting while another replica sells the last unit are refused
// when it lets go, without a transaction of their own and without a read:
// that replica announced the sell-out before it released the lock, as the
// order path does (a waiter reads no stock; with nothing heard its
// transaction finds the product sold out, under the lock).
func TestBatchWaitersLearnSoldOutWithoutATransaction(t *testing.T) {
	ctx := context.Background()
	db := testenv.MySQL(t)
	rdb, prefix := testenv.Redis(t)
	if err := stock.NewCatalog(db.Gorm).Seed(ctx, 1, 1); err != nil {
		t.Fatal(err)
	}
	// Releases wake the waiters, and nothing else does: a retry on a timer
	// could take the lock between the sale and the release's message.
	opt := lock.RedisOptions{Prefix: prefix, TTL: 2 * time.Second, Wait: 20 * time.Second,
		Subscriber: rdb, MinBackoff: time.Hour, MaxBackoff: time.Hour}
	l := lock.NewRedis(rdb, opt)
	t.Cleanup(func() { l.Close() })
	other := lock.NewRedis(rdb, opt) // another replica's
	t.Cleanup(func() { other.Close() })
	svc := newService(db.Open(t), l, options{})

	holder := hold(t, other, 1)
	answers := queue(t, ctx, svc, 1, []int64{1, 2, 3}, nil)
	for deadline := time.Now().Add(10 * time.Second); l.Stats().Waiting < 1; time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the queue never found the lock held")
		}
	}
	// The holder sells the unit, as another replica's order would.
	if err := db.Gorm.Transaction(func(tx *gorm.DB) error {
		if err := tx.Exec("UPDATE products SET stock = stock - 1 WHERE id = 1").Error; err != nil {
			return err
		}
		return tx.Create(&stock.Order{SKUID: 1, UserID: 99, CreatedAt: time.Now()}).Error
	}); err != nil {
		t.Fatal(err)
	}
	svc.SoldOutElsewhere(1, holder.Fence()) // heard before the release, as it is announced
	letGo(t, holder)
	for i, ch := range answers {
		if r := <-ch; !errors.Is(r.err, stock.ErrSoldOut) {
			t.Errorf("buyer %d: %+v, %v; want ErrSoldOut", i+1, r.order, r.err)
		}
	}
	if st := svc.Stats(); st.Batches != 0 {
		t.Errorf("stats %+v: the waiters ran a transaction to learn it", st)
	}
	if r := report(t, db); !r.OK() || r.Orders != 1 {
		t.Errorf("want the holder's order only:\n%s", r)
	}
}

// Another replica's finding that a product sold out, with its fencing
// token, is refused from memory without a statement, until a raise under a
// later token; a finding older than that raise, heard after it, is not
// believed.
func TestSoldOutElsewhereRefusedWithoutAStatement(t *testing.T) {
	ctx := context.Background()
	db := testenv.MySQL(t)
	svc, _, _ := lined(t, db, 1, 2, options{}, lock.RedisOptions{})
	spy := &statements{Interface: logger.Discard}
	traced := newService(db.Open(t).Session(&gorm.Session{Logger: spy}), lock.NewLocal(time.Second), options{})
	for _, s := range []*stock.Service{svc, traced} {
		s.SoldOutElsewhere(1, 5)
	}
	if _, err := traced.PlaceOrder(ctx, 1, 1, ""); !errors.Is(err, stock.ErrSoldOut) {
		t.Fatalf("after another replica found it sold out: %v, want ErrSoldOut", err)
	}
	if len(spy.sql) > 0 {
		t.Errorf("a product sold out elsewhere ran %q", spy.sql)
	}
	svc.Raised(1, 7)
	svc.SoldOutElsewhere(1, 6) // found before the raise, heard after it
	o, err := svc.PlaceOrder(ctx, 1, 1, "")
	if err != nil {
		t.Fatalf("after a raise under a later token: %v", err)
	}
	checkOrder(t, db, o, 1, 1)
}

// A batch that wants more units than are left takes what is left in the
// fast attempt's one UPDATE — no locking read, no second attempt — and the
// orders after the last unit are sold out; one transaction in all.
func TestBatchLargerThanStockTakesWhatIsLeft(t *testing.T) {
	ctx := context.Background()
	db := testenv.MySQL(t)
	rdb, prefix := testenv.Redis(t)
	if err := stock.NewCatalog(db.Gorm).Seed(ctx, 1, 2); err != nil {
		t.Fatal(err)
	}
	l := lock.NewRedis(rdb, lock.RedisOptions{Prefix: prefix, TTL: 2 * time.Second, Wait: 20 * time.Second})
	spy := &statements{Interface: logger.Discard}
	svc := newService(db.Open(t).Session(&gorm.Session{Logger: spy}), l, options{Settings: stock.Settings{Fencing: true}})

	holder := hold(t, l, 1)
	answers := queue(t, ctx, svc, 1, []int64{1, 2, 3, 4}, nil)
	spy.mu.Lock()
	spy.sql = nil // the reads before the lock
	spy.mu.Unlock()
	letGo(t, holder)
	for i, ch := range answers {
		r := <-ch
		switch {
		case i < 2 && r.err != nil:
			t.Errorf("buyer %d: %v, want an order", i+1, r.err)
		case i < 2:
			checkOrder(t, db, r.order, 1, int64(i+1))
		case !errors.Is(r.err, stock.ErrSoldOut):
			t.Errorf("buyer %d: %+v, %v; want ErrSoldOut", i+1, r.order, r.err)
		}
	}
	if st := svc.Stats(); st.Batches != 1 {
		t.Errorf("stats %+v: want one transaction", st)
	}
	if q := spy.touching("FOR UPDATE"); len(q) > 0 {
		t.Errorf("the batch ran a careful attempt: %q", q)
	}
	if r := report(t, db); !r.OK() || r.Orders != 2 {
		t.Errorf("want 2 orders:\n%s", r)
	}
}
