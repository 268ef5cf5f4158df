package stock_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"gorm.io/gorm"

	"shop/internal/lock"
	"shop/internal/notify"
	"shop/internal/stock"
	"shop/internal/testenv"
)

// meter counts the statements MariaDB ran on the one connection of a pool,
// by the server's own count (the session's Questions).
type meter struct {
	t    *testing.T
	pool *gorm.DB
	conn int64 // the connection counted: a new one would count from zero
	at   int64 // the count at the last look, which that look is part of
}

func newMeter(t *testing.T, pool *gorm.DB) *meter {
	t.Helper()
	m := &meter{t: t, pool: pool}
	m.conn, m.at = m.look()
	if n := m.ran(); n != 0 {
		t.Fatalf("two looks in a row counted %d statements between them, want none", n)
	}
	return m
}

func (m *meter) look() (conn, questions int64) {
	m.t.Helper()
	var r struct {
		Conn      int64
		Questions int64
	}
	q := "SELECT CONNECTION_ID() AS conn, VARIABLE_VALUE AS questions FROM information_schema.SESSION_STATUS WHERE VARIABLE_NAME = 'QUESTIONS'"
	if err := m.pool.Raw(q).Scan(&r).Error; err != nil {
		m.t.Fatal(err)
	}
	return r.Conn, r.Questions
}

// ran returns the statements run on the pool since the last call, the
// meter's own looks left out.
func (m *meter) ran() int64 {
	m.t.Helper()
	conn, n := m.look()
	if conn != m.conn {
		m.t.Fatalf("the pool moved from connection %d to %d, whose count starts again", m.conn, conn)
	}
	ran := n - m.at - 1
	m.at = n
	return ran
}

// metered is a replica whose order transactions and reads each go through a
// pool of one connection, so that each pool's statements are counted.
type metered struct {
	svc           *stock.Service
	orders, reads *meter
}

func newMetered(t *testing.T, db *testenv.DB, locks stock.Locker, o options) metered {
	t.Helper()
	orders, reads := db.OpenOrders(t, 1), db.OpenReads(t, 1)
	o.Concurrency, o.Reads = 1, reads
	return metered{newService(orders, locks, o), newMeter(t, orders), newMeter(t, reads)}
}

// ran returns the statements the replica ran since the last call.
func (m metered) ran() (orders, reads int64) { return m.orders.ran(), m.reads.ran() }

// hearing is an Announcer that every replica hears at once, as the channel
// carries an announcement to each (notify).
type hearing struct {
	mu       sync.Mutex
	replicas []*stock.Service
}

func (f *hearing) Announce(_ context.Context, e notify.Event) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, svc := range f.replicas {
		svc.Hear(e)
	}
	return nil
}

func (f *hearing) join(svc *stock.Service) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.replicas = append(f.replicas, svc)
}

// crowd places an order of sku for each of users on svc at once, and
// fails unless each is refused with want.
func crowd(t *testing.T, svc *stock.Service, sku int64, users []int64, want error) {
	t.Helper()
	var answers []<-chan result
	for _, user := range users {
		answers = append(answers, place(context.Background(), svc, sku, user, ""))
	}
	for i, ch := range answers {
		if r := <-ch; !errors.Is(r.err, want) {
			t.Errorf("buyer %d: %+v, %v; want %v", users[i], r.order, r.err, want)
		}
	}
}

// users returns n buyers from first on.
func users(first int64, n int) []int64 {
	u := make([]int64, n)
	for i := range u {
		u[i] = first + int64(i)
	}
	return u
}

// A flash sale's peak — many products, each sold once, several buyers each
// over two replicas, all at once — reads no stock before the lock: a product
// with stock goes straight to its lock, and the losing buyers learn of the
// sell-out from the replica that sold the last unit, which announced it
// before it released the lock. MariaDB's own count of each pool's
// statements says so.
func TestSellOutReadsNoStockBeforeTheLock(t *testing.T) {
	const products, buyers = 12, 3
	ctx := context.Background()
	db := testenv.MySQL(t)
	rdb, prefix := testenv.Redis(t)
	if err := stock.NewCatalog(db.Gorm).Seed(ctx, products, 1); err != nil {
		t.Fatal(err)
	}
	f := &hearing{}
	var replicas []metered
	for range 2 {
		l := lock.NewRedis(rdb, lock.RedisOptions{Prefix: prefix, TTL: 2 * time.Second, Wait: 20 * time.Second, Subscriber: rdb})
		t.Cleanup(func() { l.Close() })
		// WaitRead out of reach: the waiters here hear the sell-out, and a
		// wait the loaded machine draws out must not read.
		r := newMetered(t, db, l, options{Settings: stock.Settings{Fencing: true, Returning: true, WaitRead: time.Hour}, Announcer: f})
		f.join(r.svc)
		replicas = append(replicas, r)
	}

	answers := make([][]<-chan result, products)
	for p := range products {
		sku := int64(p + 1)
		for b := range buyers {
			svc := replicas[b%len(replicas)].svc
			answers[p] = append(answers[p], place(ctx, svc, sku, sku*10+int64(b), ""))
		}
	}
	for p := range answers {
		sold := 0
		for _, ch := range answers[p] {
			switch r := <-ch; {
			case r.err == nil:
				sold++
			case !errors.Is(r.err, stock.ErrSoldOut):
				t.Errorf("sku %d: %v, want an order or ErrSoldOut", p+1, r.err)
			}
		}
		if sold != 1 {
			t.Errorf("sku %d: %d sold, want its one unit", p+1, sold)
		}
	}

	var orders, reads int64
	for _, r := range replicas {
		o, rd := r.ran()
		orders, reads = orders+o, reads+rd
	}
	t.Logf("%d requests: %d statements in order transactions, %d reads (%.2f statements per request)",
		products*buyers, orders, reads, float64(orders+reads)/float64(products*buyers))
	if reads != 0 {
		t.Errorf("the drains read the stock before the lock %d times, want none", reads)
	}
	if r := report(t, db); !r.OK() || r.Orders != products || r.Stock != 0 {
		t.Errorf("want every unit sold once\n%s", r)
	}
}

// A waiter that hears no sell-out — the replica that sold the last unit
// announced nothing, and a holder lost since keeps the lock until its lease
// runs out — reads the stock once it has waited Settings.WaitRead, and is
// refused sold out then, not at its deadline; the lost holder's lock is
// left as it was.
func TestWaiterReadsTheStockOfAProductSoldBehindAHeldLock(t *testing.T) {
	ctx := context.Background()
	db := testenv.MySQL(t)
	rdb, prefix := testenv.Redis(t)
	if err := stock.NewCatalog(db.Gorm).Seed(ctx, 1, 1); err != nil {
		t.Fatal(err)
	}
	// Without wake-on-release (as Redlock's), the lock asks after each
	// retry whether to go on waiting; with it, after each release heard.
	newLocks := func() *lock.Redis {
		l := lock.NewRedis(rdb, lock.RedisOptions{Prefix: prefix, TTL: time.Minute, Wait: time.Minute})
		t.Cleanup(func() { l.Close() })
		return l
	}
	seller := newService(db.Open(t), newLocks(), options{Settings: stock.Settings{Fencing: true}})
	if r := <-place(ctx, seller, 1, 10, ""); r.err != nil {
		t.Fatalf("the first buyer: %v, want the unit", r.err)
	}
	held, err := newLocks().Obtain(ctx, stock.LockKey(1))
	if err != nil {
		t.Fatal(err)
	}
	waiter := newService(db.Open(t), newLocks(), options{Settings: stock.Settings{Fencing: true, WaitRead: 100 * time.Millisecond}})
	deadline, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	if r := <-place(deadline, waiter, 1, 11, ""); !errors.Is(r.err, stock.ErrSoldOut) {
		t.Errorf("a buyer behind the held lock: %v, want ErrSoldOut before its deadline", r.err)
	}
	if err := held.Context().Err(); err != nil {
		t.Errorf("the holder's lease: %v, want it still held", err)
	}
	if err := held.Release(ctx); err != nil {
		t.Errorf("release the holder's lease: %v", err)
	}
	if r := report(t, db); !r.OK() || r.Orders != 1 || r.Stock != 0 {
		t.Errorf("want the one unit sold once\n%s", r)
	}
}

// A crowd that comes before a sale opens, or after it ends, is refused from
// the window this replica found, without a statement or the lock: only the
// first order, which finds no window in memory, takes the lock, and its
// transaction refuses it and tells the window.
func TestCrowdOutsideTheWindowRefusedFromMemory(t *testing.T) {
	ctx := context.Background()
	db := testenv.MySQL(t)
	rdb, prefix := testenv.Redis(t)
	opens := time.Date(2030, 1, 2, 10, 0, 0, 0, time.UTC)
	closes := opens.Add(time.Hour)
	if err := stock.NewCatalog(db.Gorm).SeedWindow(ctx, 1, 10, stock.Window{StartsAt: &opens, EndsAt: &closes}); err != nil {
		t.Fatal(err)
	}
	locks := &countingLocker{Locker: lock.NewRedis(rdb, lock.RedisOptions{Prefix: prefix, Wait: 5 * time.Second})}
	clk := newClock(opens.Add(-time.Minute))
	r := newMetered(t, db, locks, options{Settings: stock.Settings{Fencing: true}, Now: clk.now})

	for _, phase := range []struct {
		name  string
		at    time.Time
		want  error
		first int64 // the first buyer; the crowd are the next 20
	}{
		{"before the sale", opens.Add(-time.Minute), stock.ErrSaleNotStarted, 100},
		{"after the sale", closes.Add(time.Minute), stock.ErrSaleEnded, 200},
	} {
		clk.set(phase.at)
		first := phase.first
		if _, err := r.svc.PlaceOrder(ctx, 1, first, ""); !errors.Is(err, phase.want) {
			t.Fatalf("%s: the first order: %v, want %v", phase.name, err, phase.want)
		}
		r.ran()
		drains := locks.drains.Load()
		crowd(t, r.svc, 1, users(first+1, 20), phase.want)
		if orders, reads := r.ran(); orders != 0 || reads != 0 {
			t.Errorf("%s: the crowd cost %d statements in transactions and %d reads, want none", phase.name, orders, reads)
		}
		if n := locks.drains.Load() - drains; n != 0 {
			t.Errorf("%s: the crowd took the lock %d times, want none", phase.name, n)
		}
	}
	if r := report(t, db); !r.OK() || r.Orders != 0 || r.Stock != 10 {
		t.Errorf("want nothing sold\n%s", r)
	}
}

// A window remembered is forgotten when its change is heard, at once, and
// on the replica that changed it; one whose change was not heard refuses
// by it for SoldOutHeardTTL at most, as a sell-out heard from another
// replica is believed.
func TestRememberedWindowForgottenOnChange(t *testing.T) {
	ctx := context.Background()
	db := testenv.MySQL(t)
	rdb, prefix := testenv.Redis(t)
	opens := time.Now().Add(time.Hour).UTC()
	if err := stock.NewCatalog(db.Gorm).SeedWindow(ctx, 3, 10, stock.Window{StartsAt: &opens}); err != nil {
		t.Fatal(err)
	}
	l := lock.NewRedis(rdb, lock.RedisOptions{Prefix: prefix, TTL: 2 * time.Second, Wait: 5 * time.Second})
	t.Cleanup(func() { l.Close() })
	clk := newClock(time.Now())
	a := newService(db.Open(t), l, options{Settings: stock.Settings{Fencing: true}})
	b := newService(db.Open(t), l, options{Settings: stock.Settings{Fencing: true}, Now: clk.now})
	learn := func(svc *stock.Service, sku, user int64) {
		t.Helper()
		for range 2 { // the second is refused from memory
			if _, err := svc.PlaceOrder(ctx, sku, user, ""); !errors.Is(err, stock.ErrSaleNotStarted) {
				t.Fatalf("sku %d before the sale: %v, want ErrSaleNotStarted", sku, err)
			}
		}
	}
	open := func(sku int64) {
		t.Helper()
		now := time.Now().Add(-time.Minute)
		if _, err := a.ChangeProduct(ctx, sku, stock.Change{SaleStartsAt: stock.Bound{Set: true, At: &now}}); err != nil {
			t.Fatal(err)
		}
	}
	sells := func(svc *stock.Service, sku, user int64, after string) {
		t.Helper()
		o, err := svc.PlaceOrder(ctx, sku, user, "")
		if err != nil {
			t.Fatalf("sku %d %s: %v, want it sold", sku, after, err)
		}
		checkOrder(t, db, o, sku, user)
	}

	learn(a, 1, 1)
	open(1)
	sells(a, 1, 2, "on the replica that opened the sale")

	learn(b, 2, 1)
	open(2)
	b.Hear(notify.Event{Kind: notify.Changed, SKU: 2})
	sells(b, 2, 2, "once the change was heard")

	learn(b, 3, 1)
	open(3)
	clk.set(clk.now().Add(stock.SoldOutHeardTTL))
	sells(b, 3, 2, "SoldOutHeardTTL after the window was learned, the change not heard")
}

// A crowd after the sell-out is refused from memory on the replica that
// sold the last unit and on the one that heard it, without a statement or
// the lock. Once the finding heard lapses (SoldOutHeardTTL) that replica
// reads the stock once before the lock, as it knew the product gone until
// lately, and remembers the finding as its own.
func TestCrowdAfterSellOutRefusedFromMemory(t *testing.T) {
	ctx := context.Background()
	db := testenv.MySQL(t)
	rdb, prefix := testenv.Redis(t)
	if err := stock.NewCatalog(db.Gorm).Seed(ctx, 1, 1); err != nil {
		t.Fatal(err)
	}
	locks := &countingLocker{Locker: lock.NewRedis(rdb, lock.RedisOptions{Prefix: prefix, TTL: 2 * time.Second, Wait: 5 * time.Second})}
	f := &hearing{}
	clk := newClock(time.Now())
	a := newMetered(t, db, locks, options{Settings: stock.Settings{Fencing: true}, Announcer: f})
	b := newMetered(t, db, locks, options{Settings: stock.Settings{Fencing: true}, Announcer: f, Now: clk.now})
	f.join(a.svc)
	f.join(b.svc)
	if _, err := a.svc.PlaceOrder(ctx, 1, 1, ""); err != nil {
		t.Fatal(err)
	}
	a.ran()
	drains := locks.drains.Load()

	quiet := func(r metered, name string, wantReads int64) {
		t.Helper()
		if orders, reads := r.ran(); orders != 0 || reads != wantReads {
			t.Errorf("%s: %d statements in transactions and %d reads, want none and %d", name, orders, reads, wantReads)
		}
		if n := locks.drains.Load() - drains; n != 0 {
			t.Errorf("%s: the crowd took the lock %d times, want none", name, n)
		}
	}
	crowd(t, a.svc, 1, users(10, 10), stock.ErrSoldOut)
	quiet(a, "the replica that sold the last unit", 0)
	crowd(t, b.svc, 1, users(20, 10), stock.ErrSoldOut)
	quiet(b, "the replica that heard it", 0)

	clk.set(clk.now().Add(stock.SoldOutHeardTTL))
	crowd(t, b.svc, 1, users(30, 10), stock.ErrSoldOut)
	quiet(b, "the replica whose finding heard lapsed", 1)
	crowd(t, b.svc, 1, users(40, 10), stock.ErrSoldOut)
	quiet(b, "the same replica after its own read", 0)
	if r := report(t, db); !r.OK() || r.Orders != 1 {
		t.Errorf("want the one unit sold\n%s", r)
	}
}
