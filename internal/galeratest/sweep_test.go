package galeratest

import (
	"context"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"shop/internal/lock"
	"shop/internal/mysqldb"
	"shop/internal/stock"
	"shop/internal/verify"
)

// Orders placed through HAProxy (a batch's INSERT … RETURNING, under the
// mysql lock's table, fenced) lapse, and the sweep gives their units back;
// the writer is SIGKILLed in the middle of the sweep, with a SKU's
// transaction written and not committed. The sweep goes on on the new
// writer once the cluster has evicted the dead node: every unit comes back
// once — none twice, none lost — and every acknowledged order is there,
// with ids that are not consecutive (auto_increment_increment is 3).
// Last of the package's tests: it kills a node, and starts it again at the
// end.
func TestSweepThroughAWriterKill(t *testing.T) {
	c := galera(t)
	name := database(t, c)
	ctx := context.Background()
	const skus, buyers, units = 6, 10, 20
	if err := stock.NewCatalog(pool(t, c.DSN(name))).Seed(ctx, skus, units); err != nil {
		t.Fatal(err)
	}
	orders, err := mysqldb.OpenOrders(c.DSN(name), 8)
	if err != nil {
		t.Fatal(err)
	}
	lockDB, err := mysqldb.OpenSQL(c.DSN(name), 4)
	if err != nil {
		t.Fatal(err)
	}
	locks := lock.NewMySQL(lockDB, lock.MySQLOptions{TTL: 2 * time.Second, Wait: 10 * time.Second})
	t.Cleanup(func() {
		locks.Close()
		lockDB.Close()
		if sqlDB, err := orders.DB(); err == nil {
			sqlDB.Close()
		}
	})

	writer := c.Writer(t)
	var returns atomic.Int32
	killed := make(chan struct{})
	hooks := stock.Hooks{BeforeReturn: func(ctx context.Context, sku int64) {
		// The second SKU's return, written and not committed.
		if returns.Add(1) == 2 {
			c.Kill(writer)
			close(killed)
		}
	}}
	const payWindow = time.Second
	svc := stock.NewService(stock.Deps{DB: orders, Reads: pool(t, c.DSN(name)), Locks: locks},
		stock.Settings{Fencing: true, PayWindow: payWindow, Returning: true}, hooks)

	var acks []verify.Ack
	var mu sync.Mutex
	var wg sync.WaitGroup
	for sku := range int64(skus) {
		for user := range int64(buyers) {
			wg.Go(func() {
				o, err := svc.PlaceOrder(ctx, sku+1, user+1, "")
				if err != nil {
					t.Errorf("order of user %d for SKU %d: %v", user+1, sku+1, err)
					return
				}
				mu.Lock()
				acks = append(acks, verify.Ack{OrderID: o.ID, SKUID: o.SKUID, UserID: o.UserID})
				mu.Unlock()
			})
		}
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
	ids := make([]int64, 0, len(acks))
	for _, a := range acks {
		ids = append(ids, a.OrderID)
	}
	slices.Sort(ids)
	t.Logf("%d orders placed, ids %d, %d, %d … %d", len(ids), ids[0], ids[1], ids[2], ids[len(ids)-1])
	t.Cleanup(func() {
		c.Start(writer)
		waitWriter(t, c, writer, true)
	})

	// Past every pay_by, the sweep runs until every unit is back, through
	// the writer's death. A return whose COMMIT's answer was lost with the
	// writer counts as given back (it may have committed); the next
	// sweeps find it again if it did not.
	check := pool(t, synced(t, c.DSN(name)))
	reserved := func() int {
		var n int
		if err := check.Raw("SELECT COUNT(*) FROM orders WHERE status = ?", stock.StatusReserved).Scan(&n).Error; err != nil {
			return -1 // the writer is gone, and HAProxy has not moved yet
		}
		return n
	}
	time.Sleep(payWindow)
	start := time.Now()
	given, failed := 0, 0
	for reserved() != 0 {
		if time.Since(start) > 90*time.Second {
			t.Fatalf("%d reservations left after %s of sweeps", reserved(), time.Since(start))
		}
		n, err := svc.Sweep(ctx)
		given += n
		if err != nil {
			failed++
			t.Logf("a sweep: %v", err)
			time.Sleep(100 * time.Millisecond)
		}
	}
	select {
	case <-killed:
	default:
		t.Fatal("the writer was never killed: the sweep returned fewer than two SKUs")
	}
	t.Logf("every unit back in %s: the sweeps counted %d, %d failed; the writer was node %d, now node %d",
		time.Since(start).Round(time.Millisecond), given, failed, writer, c.Writer(t))

	var left []struct {
		Status string
		Count  int
	}
	if err := check.Raw("SELECT status, COUNT(*) AS count FROM orders GROUP BY status").Scan(&left).Error; err != nil {
		t.Fatal(err)
	}
	if len(left) != 1 || left[0].Status != stock.StatusExpired || left[0].Count != len(acks) {
		t.Errorf("orders by status: %+v; want all %d expired", left, len(acks))
	}
	var stocked int
	if err := check.Raw("SELECT COUNT(*) FROM products WHERE stock = ? AND initial_stock = ?", units, units).Scan(&stocked).Error; err != nil {
		t.Fatal(err)
	}
	if stocked != skus {
		t.Errorf("%d of %d products back to their %d units", stocked, skus, units)
	}
	rep, err := verify.Sale(ctx, check, acks)
	if err != nil {
		t.Fatal(err)
	}
	if !rep.OK() {
		t.Errorf("verify: %s", rep)
	}
}
