package stock_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"shop/internal/lock"
	"shop/internal/stock"
	"shop/internal/testenv"
)

// reserveLapsed inserts a reservation of a new buyer for each SKU of skus,
// whose payment window ended ago[i] before now by MySQL's clock, and takes
// its unit off the stock, as placing it would have.
func reserveLapsed(t *testing.T, db *testenv.DB, skus []int64, ago []time.Duration) {
	t.Helper()
	var q strings.Builder
	q.WriteString("INSERT INTO orders (sku_id, user_id, fence, created_at, status, pay_by) VALUES ")
	args := make([]any, 0, 3*len(skus))
	for i, sku := range skus {
		if i > 0 {
			q.WriteString(", ")
		}
		q.WriteString("(?, ?, 0, UTC_TIMESTAMP(6), 'reserved', UTC_TIMESTAMP(6) - INTERVAL ? MICROSECOND)")
		args = append(args, sku, 1000+int64(i), ago[i].Microseconds())
	}
	if err := db.Gorm.Exec(q.String(), args...).Error; err != nil {
		t.Fatal(err)
	}
	if err := db.Gorm.Exec("UPDATE products SET stock = stock - 1 WHERE id IN ?", skus).Error; err != nil {
		t.Fatal(err)
	}
}

// reservedOf counts the reservations of skus still reserved.
func reservedOf(t *testing.T, db *testenv.DB, skus []int64) int {
	t.Helper()
	var n int
	if err := db.Gorm.Raw("SELECT COUNT(*) FROM orders WHERE status = 'reserved' AND sku_id IN ?", skus).Scan(&n).Error; err != nil {
		t.Fatal(err)
	}
	return n
}

// span is the SKUs from..to.
func span(from, to int64) []int64 {
	var s []int64
	for sku := from; sku <= to; sku++ {
		s = append(s, sku)
	}
	return s
}

// fixedFenceLock is the Redis lock whose RaiseFence does nothing, as
// etcd's and ZooKeeper's: a row fenced above its tokens stays so, and
// every write of that SKU is refused.
type fixedFenceLock struct{ *lock.Redis }

func (fixedFenceLock) RaiseFence(context.Context, string, int64) error { return nil }

// More SKUs than one sweep used to look at fail on every try — their rows
// fenced above every token the lock gives, as after a change of lock mode
// to one whose tokens are smaller — and their reservations lapsed before
// any other. The sweep returns the others' units all the same, names the
// failures, and its next sweep leaves the failing SKUs alone for a while
// (the Service's clock stands still here, so that the while has not passed
// however slowly the machine sweeps). OldestLapsed then reports the
// failing ones' age.
func TestFailingSKUsDoNotStopTheSweep(t *testing.T) {
	const failing, healthy = 105, 10
	ctx := context.Background()
	db := testenv.MySQL(t)
	rdb, prefix := testenv.Redis(t)
	if err := stock.NewCatalog(db.Gorm).Seed(ctx, failing+healthy, 1); err != nil {
		t.Fatal(err)
	}
	bad, good := span(1, failing), span(failing+1, failing+healthy)
	if err := db.Gorm.Exec("UPDATE products SET fence = ? WHERE id IN ?", int64(1)<<62, bad).Error; err != nil {
		t.Fatal(err)
	}
	ago := make([]time.Duration, 0, failing+healthy)
	for i := range failing {
		ago = append(ago, time.Hour-time.Duration(i)*time.Second)
	}
	for range healthy {
		ago = append(ago, time.Minute)
	}
	reserveLapsed(t, db, append(slices.Clone(bad), good...), ago)
	l := fixedFenceLock{lock.NewRedis(rdb, lock.RedisOptions{Prefix: prefix, TTL: 2 * time.Second, Wait: time.Second})}
	now := time.Now()
	svc := newService(db.Gorm, l, options{Settings: stock.Settings{PayWindow: payWindow, Fencing: true},
		Now: func() time.Time { return now }})

	n, err := svc.Sweep(ctx)
	if n != healthy || reservedOf(t, db, good) != 0 {
		t.Fatalf("the sweep returned %d units (%v), %d of the healthy SKUs' reservations left; want %d and none",
			n, err, reservedOf(t, db, good), healthy)
	}
	if err == nil || !strings.Contains(err.Error(), "more") {
		t.Errorf("the sweep's error = %v, want the failures named and counted", err)
	}
	if left := reservedOf(t, db, bad); left != failing {
		t.Errorf("%d of the failing SKUs' reservations left, want %d", left, failing)
	}
	if age := svc.OldestLapsed(); age < time.Hour-time.Minute || age > 2*time.Hour {
		t.Errorf("OldestLapsed = %v, want about an hour", age)
	}
	// Left alone now: the next sweep tries none of them.
	if n, err := svc.Sweep(ctx); n != 0 || err != nil {
		t.Errorf("the next sweep = %d, %v; want 0 and no failure: the failing SKUs wait", n, err)
	}
	verified(t, db)
}

// recordingLock is a lock that records the SKU locks its holders took.
type recordingLock struct {
	stock.TryLocker
	mu   sync.Mutex
	skus []string
}

func (r *recordingLock) Obtain(ctx context.Context, key string) (*lock.Lease, error) {
	l, err := r.TryLocker.Obtain(ctx, key)
	if err == nil && strings.HasPrefix(key, "sku:") {
		r.mu.Lock()
		r.skus = append(r.skus, key)
		r.mu.Unlock()
	}
	return l, err
}

func (r *recordingLock) taken() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.skus)
}

// Two replicas sweep the same lapsed reservations of many SKUs at once.
// They split them: each takes the locks of SKUs the other does not, and
// together they return every unit once. Each replica's first return waits
// until the other's has begun (the first's, at its COMMIT, until the
// second has returned one), so that both sweep at once however the machine
// schedules them.
func TestSweepersSplitTheSKUs(t *testing.T) {
	const skus = 48
	ctx := context.Background()
	db := testenv.MySQL(t)
	rdb, prefix := testenv.Redis(t)
	if err := stock.NewCatalog(db.Gorm).Seed(ctx, skus, 1); err != nil {
		t.Fatal(err)
	}
	ago := make([]time.Duration, skus)
	for i := range ago {
		ago[i] = time.Minute
	}
	reserveLapsed(t, db, span(1, skus), ago)
	l := lock.NewRedis(rdb, lock.RedisOptions{Prefix: prefix, TTL: 2 * time.Second, Wait: time.Second})
	la, lb := &recordingLock{TryLocker: l}, &recordingLock{TryLocker: l}
	first, second := make(chan struct{}), make(chan struct{})
	var onceA, onceB sync.Once
	wait := func(c chan struct{}, what string) {
		select {
		case <-c:
		case <-time.After(10 * time.Second):
			t.Error(what)
		}
	}
	a := newService(db.Gorm, la, options{Settings: stock.Settings{PayWindow: payWindow, Fencing: true},
		Hooks: stock.Hooks{BeforeReturn: func(context.Context, int64) {
			onceA.Do(func() {
				close(first)
				wait(second, "the second replica returned nothing while the first held one SKU")
			})
		}}})
	b := newService(db.Gorm, lb, options{Settings: stock.Settings{PayWindow: payWindow, Fencing: true},
		Hooks: stock.Hooks{BeforeReturn: func(context.Context, int64) {
			onceB.Do(func() {
				wait(first, "the first replica began no return while the second held one SKU")
				close(second)
			})
		}}})
	var wg sync.WaitGroup
	var na, nb int
	var ea, eb error
	wg.Go(func() { na, ea = a.Sweep(ctx) })
	wg.Go(func() { nb, eb = b.Sweep(ctx) })
	wg.Wait()
	if ea != nil || eb != nil {
		t.Errorf("the sweeps failed: %v; %v", ea, eb)
	}
	ta, tb := la.taken(), lb.taken()
	var both []string
	for _, k := range ta {
		if slices.Contains(tb, k) {
			both = append(both, k)
		}
	}
	if na+nb != skus || na == 0 || nb == 0 || len(both) > 0 {
		t.Errorf("the sweeps returned %d and %d units (want %d between them, some each); both took the locks of %v",
			na, nb, skus, both)
	}
	t.Logf("the first replica took %d SKU locks, the second %d", len(ta), len(tb))
	verified(t, db)
}

// A sweep returns the SKUs whose reservations lapsed first first: here the
// SKUs of one shard, whose pay_by runs against their ids and the order
// their rows were written in.
func TestSweepTakesTheOldestFirst(t *testing.T) {
	const n = 8
	ctx := context.Background()
	db := testenv.MySQL(t)
	rdb, prefix := testenv.Redis(t)
	if err := stock.NewCatalog(db.Gorm).Seed(ctx, 1+n*stock.SweepShards, 1); err != nil {
		t.Fatal(err)
	}
	var skus []int64
	var ago []time.Duration
	for i := range int64(n) {
		skus = append(skus, 1+i*stock.SweepShards)
		ago = append(ago, time.Minute+time.Duration(i)*time.Second) // the later SKU, the older
	}
	reserveLapsed(t, db, skus, ago)
	var mu sync.Mutex
	var order []int64
	l := lock.NewRedis(rdb, lock.RedisOptions{Prefix: prefix, TTL: 2 * time.Second, Wait: time.Second})
	svc := newService(db.Gorm, l, options{Settings: stock.Settings{PayWindow: payWindow, Fencing: true},
		Hooks: stock.Hooks{BeforeReturn: func(_ context.Context, sku int64) {
			mu.Lock()
			order = append(order, sku)
			mu.Unlock()
		}}})
	if got, err := svc.Sweep(ctx); got != n || err != nil {
		t.Fatalf("sweep = %d, %v; want %d", got, err, n)
	}
	want := slices.Clone(skus)
	slices.Reverse(want)
	if fmt.Sprint(order) != fmt.Sprint(want) {
		t.Errorf("the sweep returned the SKUs in the order %v, want the oldest first: %v", order, want)
	}
}
