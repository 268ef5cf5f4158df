package galeratest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"shop/internal/mysqldb"
	"shop/internal/stock"
)

// A node cut off from the other two answers the statement it was running
// with 1180, and rolls it back: the cluster never has it. Every statement
// after that is refused with 1047 until the node rejoins. Both are outages
// (503 busy), never failures of the work.
func TestCutOffNodeAnswersBusy(t *testing.T) {
	c := galera(t)
	name := database(t, c)
	ctx := context.Background()
	if err := stock.NewCatalog(pool(t, c.DSN(name))).Seed(ctx, 3, 5); err != nil {
		t.Fatal(err)
	}
	// A node HAProxy does not send to, so that the other tests' writer
	// stays where it is.
	cut := (c.Writer(t) + 1) % 3
	node := pool(t, c.NodeDSN(cut, name))
	check := stock.NewCatalog(pool(t, synced(t, c.NodeDSN(cut, name))))
	if n, err := check.Stock(ctx, 1); err != nil || n != 5 {
		t.Fatalf("stock of product 1 on node %d: %d, %v; want 5", cut, n, err)
	}

	// A write in flight (it sleeps before it is replicated) when the node
	// is cut off.
	const write = "UPDATE products SET stock = stock + 1 + 0 * SLEEP(2) WHERE id = 1"
	inFlight := make(chan error, 1)
	go func() { inFlight <- node.Exec(write).Error }()
	waitUntil(t, 10*time.Second, "the write to be running", func() error {
		var running int
		err := node.Raw("SELECT COUNT(*) FROM information_schema.PROCESSLIST WHERE INFO = ?", write).Scan(&running).Error
		if err == nil && running == 0 {
			err = errors.New("not yet")
		}
		return err
	})
	c.Isolate(cut)
	healed := false
	heal := func() {
		if !healed {
			healed = true
			c.Heal(cut)
			c.WaitSynced(t, cut)
		}
	}
	t.Cleanup(heal)
	err := <-inFlight
	if number(err) != 1180 || !mysqldb.Transient(err) {
		t.Errorf("the write in flight on the cut-off node: %v (transient %v); want 1180, transient", err, mysqldb.Transient(err))
	}
	t.Logf("the write in flight on the cut-off node: %v", err)
	_, err = stock.NewCatalog(node).Stock(ctx, 1)
	if !errors.Is(err, stock.ErrBusy) || number(err) != 1047 {
		t.Errorf("a read on the cut-off node: %v; want busy, 1047", err)
	}
	t.Logf("a read on the cut-off node: %v", err)

	heal()
	// The write in flight was rolled back: the cluster, the node that was
	// cut off included, never had it.
	for i := range 3 {
		n, err := stock.NewCatalog(pool(t, synced(t, c.NodeDSN(i, name)))).Stock(ctx, 1)
		if err != nil || n != 5 {
			t.Errorf("stock of product 1 on node %d once healed: %d, %v; want 5, the write rolled back", i, n, err)
		}
	}
}

// number is the MySQL error number in err's chain, or 0.
func number(err error) uint16 {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return me.Number
	}
	return 0
}

// waitUntil polls cond until it returns nil, failing t after within.
func waitUntil(t *testing.T, within time.Duration, what string, cond func() error) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		err := cond()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal(fmt.Errorf("%s: not within %s: %w", what, within, err))
		}
		time.Sleep(20 * time.Millisecond)
	}
}
