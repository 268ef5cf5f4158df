package stock_test

import (
	"context"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"shop/internal/lock"
	"shop/internal/mysqldb"
	"shop/internal/stock"
	"shop/internal/testenv"
	"shop/internal/verify"
)

// BenchmarkSweep measures what the expiry sweep costs: how many lapsed
// reservations a sweep returns per second, and what it adds to the order
// path's latency while it runs. Rounds alternate, side by side in one run:
// a hot SKU's orders alone, then the same orders while a sweep returns as
// many lapsed reservations, spread over sweptSKUs other products. b.N is
// the orders of each kind of round, and the reservations swept.
func BenchmarkSweep(b *testing.B) {
	const (
		sweptSKUs = 100
		workers   = 64
		round     = 2000
		units     = 1_000_000
	)
	ctx := context.Background()
	db := testenv.MySQL(b)
	rdb, prefix := testenv.Redis(b)
	if err := stock.NewCatalog(db.Gorm).Seed(ctx, 1+sweptSKUs, units); err != nil {
		b.Fatal(err)
	}
	orders, err := mysqldb.OpenOrders(db.DSN, 16)
	if err != nil {
		b.Fatal(err)
	}
	reads, err := mysqldb.Open(db.DSN, 16)
	if err != nil {
		b.Fatal(err)
	}
	l := lock.NewRedis(rdb, lock.RedisOptions{Prefix: prefix, TTL: 5 * time.Second, Wait: 2 * time.Second})
	svc := newService(orders, l, options{Settings: stock.Settings{PayWindow: time.Hour, Fencing: true, Concurrency: 16}, Reads: reads})

	var user atomic.Int64
	type sample struct {
		start time.Time
		took  time.Duration
	}
	// place places n orders of the hot SKU from all workers at once and
	// returns when each started and how long it took.
	place := func(n int) []sample {
		var (
			left = int64(n)
			mu   sync.Mutex
			took = make([]sample, 0, n)
			wg   sync.WaitGroup
		)
		for range workers {
			wg.Go(func() {
				for atomic.AddInt64(&left, -1) >= 0 {
					start := time.Now()
					if _, err := svc.PlaceOrder(ctx, 1, user.Add(1), ""); err != nil {
						b.Error(err)
						return
					}
					d := time.Since(start)
					mu.Lock()
					took = append(took, sample{start, d})
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		return took
	}
	// lapsed makes n reservations of the swept SKUs whose window has ended,
	// their units taken off the stock as an order takes them.
	lapsed := func(n int) {
		for done := 0; done < n; {
			chunk := min(1000, n-done)
			var q strings.Builder
			q.WriteString("INSERT INTO orders (sku_id, user_id, fence, created_at, status, pay_by) VALUES ")
			args := make([]any, 0, 2*chunk)
			perSKU := map[int64]int{}
			for i := range chunk {
				if i > 0 {
					q.WriteString(", ")
				}
				q.WriteString("(?, ?, 0, UTC_TIMESTAMP(6), 'reserved', UTC_TIMESTAMP(6) - INTERVAL 1 SECOND)")
				sku := int64(2 + (done+i)%sweptSKUs)
				perSKU[sku]++
				args = append(args, sku, user.Add(1))
			}
			if err := db.Gorm.Exec(q.String(), args...).Error; err != nil {
				b.Fatal(err)
			}
			for sku, k := range perSKU {
				if err := db.Gorm.Exec("UPDATE products SET stock = stock - ? WHERE id = ?", k, sku).Error; err != nil {
					b.Fatal(err)
				}
			}
			done += chunk
		}
	}
	// sweep sweeps until nothing is left and returns the units it gave
	// back and how long that took.
	sweep := func() (int, time.Duration) {
		start, total := time.Now(), 0
		for {
			n, err := svc.Sweep(ctx)
			if err != nil {
				b.Error(err)
			}
			if n == 0 {
				return total, time.Since(start)
			}
			total += n
		}
	}

	place(workers * 4) // warm up the pools and the lock
	// alone are the latencies of the orders of the rounds alone; sweeping
	// those of the orders that started while a sweep ran.
	var alone, sweeping []time.Duration
	var aloneTook, sweepingTook, sweptTook time.Duration
	placedSweeping := 0
	swept := 0
	b.ResetTimer()
	for left := b.N; left > 0; left -= round {
		n := min(round, left)
		start := time.Now()
		for _, o := range place(n) {
			alone = append(alone, o.took)
		}
		aloneTook += time.Since(start)

		b.StopTimer()
		lapsed(n)
		b.StartTimer()
		start = time.Now()
		var (
			wg       sync.WaitGroup
			sweepEnd time.Time
		)
		wg.Go(func() {
			k, d := sweep()
			swept += k
			sweptTook += d
			sweepEnd = start.Add(d)
		})
		placed := place(n)
		sweepingTook += time.Since(start)
		placedSweeping += len(placed)
		wg.Wait()
		for _, o := range placed {
			if o.start.Before(sweepEnd) {
				sweeping = append(sweeping, o.took)
			}
		}
	}
	b.StopTimer()
	if swept != b.N {
		b.Errorf("swept %d reservations, want %d", swept, b.N)
	}
	if r, err := verify.Sale(ctx, db.Gorm, nil); err != nil || !r.OK() {
		b.Errorf("verify after the benchmark: %+v, %v", r, err)
	}
	p99 := func(d []time.Duration) float64 {
		slices.Sort(d)
		return float64(d[len(d)*99/100].Microseconds()) / 1000
	}
	b.ReportMetric(float64(swept)/sweptTook.Seconds(), "swept-rows/s")
	b.ReportMetric(float64(len(alone))/aloneTook.Seconds(), "alone-orders/s")
	b.ReportMetric(float64(placedSweeping)/sweepingTook.Seconds(), "sweeping-orders/s")
	a, s := p99(alone), p99(sweeping)
	b.ReportMetric(a, "alone-p99-ms")
	b.ReportMetric(s, "sweeping-p99-ms")
	b.ReportMetric(s/a, "p99-sweeping/alone")
}

// sweepSelloutBound is how long after they lapse together the seeds'
// sellout's reservations must all be back in the sale, with three replicas
// sweeping every second: TestSweepSellout's bound.
const sweepSelloutBound = 30 * time.Second

// TestSweepSellout is the seeds' sellout lapsing unpaid: 5000 one-unit
// SKUs, each reserved, whose payment windows end at the same instant,
// swept by three Services (three replicas, each with its own pools, the
// order lock in Redis) every SHOP_SWEEP_INTERVAL's default second. Every
// unit must be back within sweepSelloutBound of pay_by; the test logs how
// long it took and what each replica returned. It runs only with
// SHOP_SWEEP_SELLOUT=1 (make bench-sweep): it is a measure, not part of
// make test.
func TestSweepSellout(t *testing.T) {
	if os.Getenv("SHOP_SWEEP_SELLOUT") != "1" {
		t.Skip("a measure: make bench-sweep runs it (SHOP_SWEEP_SELLOUT=1)")
	}
	const (
		skus      = 5000
		replicas  = 3
		interval  = time.Second
		lapseIn   = 3 * time.Second
		poolSize  = 24 // cmd/shop's ordersPoolSize
		readsSize = 4  // and orderReadsPoolSize
	)
	ctx := context.Background()
	db := testenv.MySQL(t)
	rdb, prefix := testenv.Redis(t)
	if err := stock.NewCatalog(db.Gorm).Seed(ctx, skus, 1); err != nil {
		t.Fatal(err)
	}
	// One instant for all, by MySQL's clock.
	var payBy time.Time
	if err := db.Gorm.Raw("SELECT UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND", lapseIn.Microseconds()).Row().Scan(&payBy); err != nil {
		t.Fatal(err)
	}
	if err := db.Gorm.Exec("INSERT INTO orders (sku_id, user_id, fence, created_at, status, pay_by) "+
		"SELECT id, id, 0, UTC_TIMESTAMP(6), 'reserved', ? FROM products", payBy).Error; err != nil {
		t.Fatal(err)
	}
	if err := db.Gorm.Exec("UPDATE products SET stock = 0").Error; err != nil {
		t.Fatal(err)
	}
	l := lock.NewRedis(rdb, lock.RedisOptions{Prefix: prefix, TTL: 5 * time.Second, Wait: 2 * time.Second})
	returned := make([]atomic.Int64, replicas)
	sweepCtx, stop := context.WithCancel(ctx)
	var wg sync.WaitGroup
	for i := range replicas {
		orders, err := mysqldb.OpenOrders(db.DSN, poolSize)
		if err != nil {
			t.Fatal(err)
		}
		reads, err := mysqldb.Open(db.DSN, readsSize)
		if err != nil {
			t.Fatal(err)
		}
		svc := stock.NewService(stock.Deps{DB: orders, Reads: reads, Locks: l, Transitions: func(status string, n int) {
			if status == stock.StatusExpired {
				returned[i].Add(int64(n))
			}
		}}, stock.Settings{PayWindow: time.Hour, Fencing: true, Concurrency: poolSize}, stock.Hooks{})
		wg.Go(func() { svc.RunSweeper(sweepCtx, interval) })
	}
	defer func() {
		stop()
		wg.Wait()
	}()
	var left int64
	var took time.Duration
	for {
		var now time.Time
		if err := db.Gorm.Raw("SELECT COUNT(*), UTC_TIMESTAMP(6) FROM orders WHERE status = 'reserved'").Row().Scan(&left, &now); err != nil {
			t.Fatal(err)
		}
		took = now.Sub(payBy)
		if left == 0 || took > 2*sweepSelloutBound {
			break
		}
		time.Sleep(100 * time.Millisecond)
	}
	counts := make([]int64, replicas)
	for i := range returned {
		counts[i] = returned[i].Load()
	}
	t.Logf("%d reservations lapsing together, %d replicas sweeping every %s: %d still reserved %.1fs after pay_by (bound %s); returned by each replica %v",
		skus, replicas, interval, left, took.Seconds(), sweepSelloutBound, counts)
	if left > 0 || took > sweepSelloutBound {
		t.Errorf("%d reservations still reserved %.1fs after pay_by; want none within %s", left, took.Seconds(), sweepSelloutBound)
	}
	if r, err := verify.Sale(ctx, db.Gorm, nil); err != nil || !r.OK() {
		t.Errorf("verify: %v\n%s", err, r)
	}
}
