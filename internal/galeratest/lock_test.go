package galeratest

import (
	"context"
	"database/sql"
	"testing"
	"time"

	"shop/internal/lock"
	"shop/internal/mysqldb"
	"shop/internal/stock"
)

// The mysql lock's table through HAProxy, across a failover: the writer is
// cut off while a holder, frozen (its watchdog never renews), holds a SKU.
// Its row was replicated, so the new writer knows the lease, and a second
// holder gets the key only once it has run out, with a larger token; the
// product's fence, replicated with its row, then refuses the frozen
// holder's write through HAProxy, on its old node while that is cut off
// (1047), and there again once it has rejoined.
func TestMySQLLockFencesAStaleHolderAcrossAFailover(t *testing.T) {
	c := galera(t)
	name := database(t, c)
	ctx := context.Background()
	if err := stock.NewCatalog(pool(t, c.DSN(name))).Seed(ctx, 1, 100); err != nil {
		t.Fatal(err)
	}
	lockDB, err := mysqldb.OpenSQL(c.DSN(name), 4)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lockDB.Close() })
	const ttl = 2 * time.Second
	frozen := lock.NewMySQL(lockDB, lock.MySQLOptions{TTL: ttl, After: func(time.Duration) <-chan time.Time { return nil }})
	next := lock.NewMySQL(lockDB, lock.MySQLOptions{TTL: ttl, Wait: 30 * time.Second})
	t.Cleanup(func() { frozen.Close(); next.Close() })

	// One unit taken under token, on db: 1 row changed, or 0 when the fence
	// refuses it.
	const take = "UPDATE products SET stock = stock - 1, fence = ? WHERE id = 1 AND fence < ?"
	write := func(db *sql.DB, token int64) (int64, error) {
		res, err := db.ExecContext(ctx, take, token, token)
		if err != nil {
			return 0, err
		}
		return res.RowsAffected()
	}
	through := sqlPool(t, c.DSN(name))
	stale, err := frozen.Obtain(ctx, stock.LockKey(1))
	if err != nil {
		t.Fatal(err)
	}
	if n, err := write(through, stale.Fence()); n != 1 || err != nil {
		t.Fatalf("the first holder's write: %d rows, %v", n, err)
	}

	old := c.Writer(t)
	c.Isolate(old)
	healed := false
	heal := func() {
		if !healed {
			healed = true
			c.Heal(old)
			c.WaitSynced(t, old)
			// HAProxy fails back, cutting the connections to the node
			// that stood in: the next test starts after that.
			waitWriter(t, c, old, true)
		}
	}
	t.Cleanup(heal)
	waitWriter(t, c, old, false)

	lease, err := next.Obtain(ctx, stock.LockKey(1))
	if err != nil {
		t.Fatalf("the second holder, on the new writer: %v", err)
	}
	if lease.Fence() <= stale.Fence() {
		t.Errorf("the second holder's token %d; want above the first's, %d", lease.Fence(), stale.Fence())
	}
	if n, err := write(through, lease.Fence()); n != 1 || err != nil {
		t.Errorf("the second holder's write: %d rows, %v; want 1", n, err)
	}
	if n, err := write(through, stale.Fence()); n != 0 || err != nil {
		t.Errorf("the first holder's write through HAProxy, after the second's: %d rows, %v; want refused by the fence", n, err)
	}
	oldNode := sqlPool(t, c.NodeDSN(old, name))
	_, err = write(oldNode, stale.Fence())
	if number(err) != 1047 {
		t.Errorf("the first holder's write on its old node, cut off: %v; want 1047", err)
	}
	t.Logf("the first holder's write on its old node, cut off: %v", err)
	// Released before the heal: HAProxy's failback cuts the pool's
	// connections, and a lease whose renewals fail meanwhile may lapse.
	if err := lease.Release(ctx); err != nil {
		t.Error(err)
	}

	heal()
	if n, err := write(sqlPool(t, synced(t, c.NodeDSN(old, name))), stale.Fence()); n != 0 || err != nil {
		t.Errorf("the first holder's write on its old node, rejoined: %d rows, %v; want refused by the fence", n, err)
	}
	var units, fence int64
	if err := sqlPool(t, synced(t, c.NodeDSN((old+1)%3, name))).QueryRowContext(ctx, "SELECT stock, fence FROM products WHERE id = 1").Scan(&units, &fence); err != nil {
		t.Fatal(err)
	}
	if units != 98 || fence != lease.Fence() {
		t.Errorf("product 1: %d units, fence %d; want 98 (two writes), the second holder's %d", units, fence, lease.Fence())
	}
}

// sqlPool is a database/sql pool on dsn, closed when the test ends.
func sqlPool(t *testing.T, dsn string) *sql.DB {
	t.Helper()
	db, err := mysqldb.OpenSQL(dsn, 2)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}
