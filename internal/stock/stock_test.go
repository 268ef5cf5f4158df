package stock_test

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"shop/internal/lock"
	"shop/internal/stock"
	"shop/internal/testenv"
	"shop/internal/verify"
)

// fleet is several replicas of the order path on one database: each has its
// own connection pool and, in local mode, its own lock table.
type fleet struct {
	db       *testenv.DB
	replicas []*stock.Service
}

type fleetConfig struct {
	replicas int
	lockMode string // redis, local, none
	update   stock.Update
	fencing  bool
	batch    int // Options.Batch
	hook     func(ctx context.Context, sku int64) func()
}

func newFleet(t *testing.T, db *testenv.DB, rdb *redis.Client, prefix string, c fleetConfig) *fleet {
	t.Helper()
	f := &fleet{db: db}
	for range c.replicas {
		var locker stock.Locker
		switch c.lockMode {
		case "redis":
			locker = lock.NewRedis(rdb, lock.RedisOptions{Prefix: prefix, TTL: 5 * time.Second, Wait: 30 * time.Second})
		case "local":
			locker = lock.NewLocal(30 * time.Second)
		case "none":
			locker = lock.None{}
		default:
			t.Fatalf("unknown lock mode %q", c.lockMode)
		}
		f.replicas = append(f.replicas, newService(db.Open(t), locker,
			options{Settings: stock.Settings{Update: c.update, Fencing: c.fencing, Batch: c.batch}, Hooks: stock.Hooks{BeforeWrite: c.hook}}))
	}
	return f
}

// rendezvous returns a BeforeWrite hook that holds each buyer between its
// read and its write until another buyer of the same SKU has read too, or
// until patience runs out. Any design that lets two buyers of one SKU read
// before either writes is then caught every run; a design that excludes them
// just waits out the patience.
func rendezvous(patience time.Duration) func(context.Context, int64) func() {
	var (
		mu      sync.Mutex
		waiting = map[int64]chan struct{}{}
	)
	return func(ctx context.Context, sku int64) func() {
		mu.Lock()
		if ch, ok := waiting[sku]; ok {
			delete(waiting, sku)
			mu.Unlock()
			close(ch)
			return nil
		}
		ch := make(chan struct{})
		waiting[sku] = ch
		mu.Unlock()
		select {
		case <-ch:
		case <-time.After(patience):
			mu.Lock()
			if waiting[sku] == ch {
				delete(waiting, sku)
			}
			mu.Unlock()
		case <-ctx.Done():
		}
		return nil
	}
}

type outcome struct {
	created, soldOut, other int
	firstOther              error
}

// sellOut seeds skus products of one unit and sends buyers buyers at each,
// all at once, buyer j of a SKU through replica j mod len(replicas).
func (f *fleet) sellOut(t *testing.T, skus, buyers int) outcome {
	t.Helper()
	if err := stock.NewCatalog(f.db.Gorm).Seed(context.Background(), skus, 1); err != nil {
		t.Fatal(err)
	}
	var orders []purchase
	for sku := 1; sku <= skus; sku++ {
		for j := range buyers {
			orders = append(orders, purchase{f.replicas[j%len(f.replicas)], int64(sku), int64(sku*1000 + j)})
		}
	}
	return atOnce(orders)
}

// sellHot seeds one product of units and sends buyers buyers at it, all at
// once, buyer j through replica j mod len(replicas).
func (f *fleet) sellHot(t *testing.T, units, buyers int) outcome {
	t.Helper()
	if err := stock.NewCatalog(f.db.Gorm).Seed(context.Background(), 1, units); err != nil {
		t.Fatal(err)
	}
	var orders []purchase
	for j := range buyers {
		orders = append(orders, purchase{f.replicas[j%len(f.replicas)], 1, int64(j + 1)})
	}
	return atOnce(orders)
}

// purchase is one order sent through one replica.
type purchase struct {
	svc       *stock.Service
	sku, user int64
}

// atOnce sends the orders together and tallies the answers.
func atOnce(orders []purchase) outcome {
	var (
		mu  sync.Mutex
		out outcome
		wg  sync.WaitGroup
	)
	start := make(chan struct{})
	for _, p := range orders {
		wg.Go(func() {
			<-start
			_, err := p.svc.PlaceOrder(context.Background(), p.sku, p.user, "")
			mu.Lock()
			defer mu.Unlock()
			out.add(err)
		})
	}
	close(start)
	wg.Wait()
	return out
}

func (out *outcome) add(err error) {
	switch {
	case err == nil:
		out.created++
	case errors.Is(err, stock.ErrSoldOut):
		out.soldOut++
	default:
		out.other++
		if out.firstOther == nil {
			out.firstOther = err
		}
	}
}

// stats sums the replicas' transaction counts.
func (f *fleet) stats() (batches, orders uint64) {
	for _, svc := range f.replicas {
		st := svc.Stats()
		batches += st.Batches
		orders += st.Orders
	}
	return batches, orders
}

// report is what shop verify finds in db.
func report(t *testing.T, db *testenv.DB) verify.Report {
	t.Helper()
	r, err := verify.Sale(context.Background(), db.Gorm, nil)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// experiment is the source articles' table: which designs must hold and which must
// oversell.
func experiment() []struct {
	name     string
	cfg      fleetConfig
	wantSafe bool
} {
	return []struct {
		name     string
		cfg      fleetConfig
		wantSafe bool
	}{
		{"redis lock, naive write, 3 replicas", fleetConfig{replicas: 3, lockMode: "redis", update: stock.Naive}, true},
		{"redis lock, naive write, fenced, 3 replicas", fleetConfig{replicas: 3, lockMode: "redis", update: stock.Naive, fencing: true}, true},
		{"local lock, naive write, 1 replica", fleetConfig{replicas: 1, lockMode: "local", update: stock.Naive}, true},
		{"local lock, naive write, 3 replicas", fleetConfig{replicas: 3, lockMode: "local", update: stock.Naive}, false},
		{"no lock, naive write, 3 replicas", fleetConfig{replicas: 3, lockMode: "none", update: stock.Naive}, false},
		{"no lock, guarded write, 3 replicas", fleetConfig{replicas: 3, lockMode: "none", update: stock.Guarded}, true},
	}
}

// TestExperiment is the source articles' experiment: many SKUs of one unit, four
// buyers each, at once, through one or three replicas; one order per lock
// hold, and coalesced.
func TestExperiment(t *testing.T) {
	const skus, buyers = 40, 4
	var tests []struct {
		name     string
		cfg      fleetConfig
		wantSafe bool
	}
	for _, batch := range []int{1, 0} {
		for _, tt := range experiment() {
			tt.cfg.batch = batch
			tt.name = fmt.Sprintf("%s, batch %d", tt.name, cmp.Or(batch, stock.DefaultBatch))
			tests = append(tests, tt)
		}
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			db := testenv.MySQL(t)
			rdb, prefix := testenv.Redis(t)
			tt.cfg.hook = rendezvous(time.Second)
			f := newFleet(t, db, rdb, prefix, tt.cfg)
			out := f.sellOut(t, skus, buyers)
			r := report(t, db)
			t.Logf("created %d, sold out %d, other %d; %s", out.created, out.soldOut, out.other, r)

			if out.other > 0 {
				t.Fatalf("%d orders failed unexpectedly, first: %v", out.other, out.firstOther)
			}
			if !tt.wantSafe {
				if r.OK() {
					t.Fatal("verify found nothing wrong, but this design must oversell")
				}
				if r.Oversold < skus/2 {
					t.Errorf("oversold %d units, want at least one on most of the %d SKUs", r.Oversold, skus)
				}
				return
			}
			if !r.OK() {
				t.Fatalf("invariants broken:\n%s", r)
			}
			if out.created != skus || out.soldOut != skus*(buyers-1) {
				t.Errorf("created %d, sold out %d; want %d and %d", out.created, out.soldOut, skus, skus*(buyers-1))
			}
			if r.Orders != skus || r.Stock != 0 {
				t.Errorf("MySQL has %d orders and %d units left; want %d and 0", r.Orders, r.Stock, skus)
			}
		})
	}
}

// TestHotSKUExperiment is the experiment on one product of many units,
// with coalescing on: batches of one SKU's buyers must be as exclusive as
// single orders were, and the designs that oversold still do.
func TestHotSKUExperiment(t *testing.T) {
	const units, buyers = 30, 120
	for _, tt := range experiment() {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			db := testenv.MySQL(t)
			rdb, prefix := testenv.Redis(t)
			tt.cfg.hook = rendezvous(200 * time.Millisecond)
			f := newFleet(t, db, rdb, prefix, tt.cfg)
			out := f.sellHot(t, units, buyers)
			r := report(t, db)
			batches, orders := f.stats()
			t.Logf("created %d, sold out %d, other %d; %d orders in %d transactions; %s",
				out.created, out.soldOut, out.other, orders, batches, r)

			if out.other > 0 {
				t.Fatalf("%d orders failed unexpectedly, first: %v", out.other, out.firstOther)
			}
			if orders <= batches {
				t.Errorf("%d orders in %d transactions: nothing was coalesced", orders, batches)
			}
			if !tt.wantSafe {
				if r.OK() || r.Oversold == 0 {
					t.Fatalf("verify found nothing wrong, but this design must oversell:\n%s", r)
				}
				return
			}
			if !r.OK() || out.created != units || out.soldOut != buyers-units || r.Orders != units || r.Stock != 0 {
				t.Fatalf("created %d, sold out %d; want %d and %d:\n%s", out.created, out.soldOut, units, buyers-units, r)
			}
		})
	}
}

// TestFencingStopsPausedHolder is the pause in Kleppmann's critique of
// Redis locks: holder A reads, is stopped (its watchdog with it) past its
// TTL, B takes the lock and sells the unit, then A wakes up and writes.
func TestFencingStopsPausedHolder(t *testing.T) {
	for _, fencing := range []bool{true, false} {
		t.Run(fmt.Sprintf("fencing=%v", fencing), func(t *testing.T) {
			t.Parallel()
			db, rdb, prefix := oneUnit(t)
			err := stopHolder(t, db, rdb, prefix, options{Settings: stock.Settings{Update: stock.Naive, Fencing: fencing}},
				func(time.Duration) <-chan time.Time { return nil }, // stopped: no renewals
				func(context.Context) func() { return nil })
			checkStaleWriter(t, db, fencing, "A", err, stock.ErrStaleFence, stock.ErrBusy)
		})
	}
}

// stopHolder is the stopped holder's interleaving: A reads product 1 under a
// 200ms lease whose watchdog sleeps on after, and stops before its write
// until B, with a lock of its own, has bought the unit; then its
// BeforeWrite hook returns resumed's func, and A writes what it read. It
// returns A's error.
func stopHolder(t *testing.T, db *testenv.DB, rdb *redis.Client, prefix string, opt options,
	after func(time.Duration) <-chan time.Time, resumed func(ctx context.Context) func()) error {
	t.Helper()
	ctx := context.Background()
	read, resume := make(chan struct{}), make(chan struct{})
	lockA := lock.NewRedis(rdb, lock.RedisOptions{Prefix: prefix, TTL: 200 * time.Millisecond, After: after})
	opt.BeforeWrite = func(ctx context.Context, _ int64) func() {
		close(read)
		<-resume
		return resumed(ctx)
	}
	a := newService(db.Open(t), lockA, opt)
	lockB := lock.NewRedis(rdb, lock.RedisOptions{Prefix: prefix, TTL: 5 * time.Second, Wait: 5 * time.Second})
	b := newService(db.Open(t), lockB, options{Settings: stock.Settings{Update: opt.Update, Fencing: opt.Fencing}})

	errA := make(chan error, 1)
	go func() {
		_, err := a.PlaceOrder(ctx, 1, 100, "")
		errA <- err
	}()
	<-read
	// A's lease runs out while A is stopped; B's Obtain waits for it.
	if _, err := b.PlaceOrder(ctx, 1, 200, ""); err != nil {
		t.Fatalf("B: %v", err)
	}
	close(resume)
	return <-errA
}

// TestStaleWriteOfAWakingHolderIsReportedAsSuch is the stopped holder as
// the demo stops it (internal/failpoint): its whole process stops between
// its read and its write, watchdog included, and runs again only once its
// write has been refused — so its watchdog finds the lease lost a moment
// after MySQL refused the write, before the order's error is classified.
// The refusal is what happened; "lease lost" would hide it.
func TestStaleWriteOfAWakingHolderIsReportedAsSuch(t *testing.T) {
	for _, batch := range []int{1, 0} {
		t.Run(fmt.Sprintf("batch=%d", batch), func(t *testing.T) {
			t.Parallel()
			db, rdb, prefix := oneUnit(t)
			thaw := make(chan struct{})
			err := stopHolder(t, db, rdb, prefix, options{Settings: stock.Settings{Update: stock.Naive, Fencing: true, Batch: batch}},
				func(time.Duration) <-chan time.Time { // stopped until thawed
					ch := make(chan time.Time, 1)
					go func() { <-thaw; ch <- time.Now() }()
					return ch
				},
				func(ctx context.Context) func() {
					return func() {
						close(thaw)
						<-ctx.Done() // the watchdog has found the lease lost
					}
				})
			checkStaleWriter(t, db, true, "A", err, stock.ErrStaleFence, stock.ErrBusy)
		})
	}
}

// TestFencingStopsReaderOfUncommittedWrite is the other interleaving of a
// pause: holder A's naive write is in MySQL, uncommitted, when A stops; B
// takes the lock, reads the old stock (a plain read does not wait for A's row
// lock) and its write waits for A's; A wakes and commits. B's token is newer
// than the fence A wrote, so a check of the token alone would let B's stale
// read-modify-write through; the fence it read no longer matches.
func TestFencingStopsReaderOfUncommittedWrite(t *testing.T) {
	for _, fencing := range []bool{true, false} {
		t.Run(fmt.Sprintf("fencing=%v", fencing), func(t *testing.T) {
			t.Parallel()
			ctx := context.Background()
			db, rdb, prefix := oneUnit(t)
			lockB := lock.NewRedis(rdb, lock.RedisOptions{Prefix: prefix})
			// A held token 1; tokens 2..5 went to holders that sold nothing.
			if err := rdb.Set(ctx, lockB.FenceKey(stock.LockKey(1)), 5, 0).Err(); err != nil {
				t.Fatal(err)
			}
			a := db.Gorm.Begin()
			defer a.Rollback()
			if err := a.Exec("UPDATE products SET stock = 0, fence = 1 WHERE id = 1").Error; err != nil {
				t.Fatal(err)
			}
			if err := a.Create(&stock.Order{SKUID: 1, UserID: 100, Fence: 1, CreatedAt: time.Now().UTC()}).Error; err != nil {
				t.Fatal(err)
			}

			read := make(chan struct{})
			b := newService(db.Open(t), lockB, options{Settings: stock.Settings{Update: stock.Naive, Fencing: fencing}, Hooks: stock.Hooks{BeforeWrite: func(context.Context, int64) func() { close(read); return nil }}})
			errB := make(chan error, 1)
			go func() {
				_, err := b.PlaceOrder(ctx, 1, 200, "")
				errB <- err
			}()
			<-read
			waitForLockWait(t, db, errB)
			if err := a.Commit().Error; err != nil {
				t.Fatal(err)
			}
			err := <-errB
			checkStaleWriter(t, db, fencing, "B", err, stock.ErrSoldOut)
		})
	}
}

// oneUnit returns a fresh database holding product 1 with one unit, and a
// Redis client with a key prefix of the test's own.
func oneUnit(t *testing.T) (*testenv.DB, *redis.Client, string) {
	t.Helper()
	db := testenv.MySQL(t)
	rdb, prefix := testenv.Redis(t)
	if err := stock.NewCatalog(db.Gorm).Seed(context.Background(), 1, 1); err != nil {
		t.Fatal(err)
	}
	return db, rdb, prefix
}

// checkStaleWriter checks how the order of the holder whose write was stale
// ended: with fencing, refused with every error in want and one order in
// MySQL; without, gone through and the oversell reported by Verify.
func checkStaleWriter(t *testing.T, db *testenv.DB, fencing bool, who string, err error, want ...error) {
	t.Helper()
	r := report(t, db)
	t.Logf("%s: %v; %s", who, err, r)
	if !fencing {
		if err != nil {
			t.Errorf("%s without fencing: %v, want its stale write to go through", who, err)
		}
		if r.OK() || r.Oversold != 1 {
			t.Errorf("want the oversell reported (1 unit):\n%s", r)
		}
		return
	}
	for _, w := range want {
		if !errors.Is(err, w) {
			t.Errorf("%s's write = %v, want %v", who, err, w)
		}
	}
	if !r.OK() || r.Orders != 1 {
		t.Errorf("want one order and every invariant holding:\n%s", r)
	}
}

// waitForLockWait returns the connection id of a statement on db's database
// that is running an UPDATE of products or a locking read of it, which here
// can only be waiting for a row lock, once there is one; it fails the test if
// the call that should wait ends first (ended may be nil). (INNODB_TRX would
// say LOCK WAIT, but MariaDB refreshes that table lazily.)
func waitForLockWait(t *testing.T, db *testenv.DB, ended <-chan error) int64 {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
		select {
		case err := <-ended:
			t.Fatalf("ended without waiting for the row lock: %v", err)
		default:
		}
		var ids []int64
		err := db.Gorm.Raw(`SELECT ID FROM information_schema.PROCESSLIST
			WHERE DB = DATABASE() AND (INFO LIKE 'UPDATE products%' OR INFO LIKE 'SELECT % FROM %products% FOR UPDATE')`).
			Scan(&ids).Error
		if err != nil {
			t.Fatal(err)
		}
		if len(ids) > 0 {
			return ids[0]
		}
	}
	t.Fatal("no UPDATE waited for the row lock")
	return 0
}
