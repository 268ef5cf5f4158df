package mysqldb_test

import (
	"context"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"shop/internal/mysqldb"
	"shop/internal/testenv"
)

// A pool's next statement on a connection gone silent fails within the
// pool's IOTimeout, with no context to bound it, and the statement after
// it runs on a new connection.
func TestSilentConnectionFailsWithinIOTimeout(t *testing.T) {
	t.Parallel()
	cfg, err := mysql.ParseDSN(testenv.EmptyMySQL(t).DSN)
	if err != nil {
		t.Fatal(err)
	}
	proxy := testenv.StartProxy(t, cfg.Addr)
	cfg.Addr = proxy.Addr
	const ioTimeout = time.Second
	db, err := mysqldb.OpenSQL(cfg.FormatDSN(), 1, mysqldb.IOTimeout(ioTimeout))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	ctx := context.Background()
	var one int
	if err := db.QueryRowContext(ctx, "SELECT 1").Scan(&one); err != nil {
		t.Fatal(err)
	}
	proxy.Blackhole()
	start := time.Now()
	err = db.QueryRowContext(ctx, "SELECT 1").Scan(&one)
	took := time.Since(start)
	if err == nil {
		t.Fatalf("a statement on a silent connection succeeded after %s", took)
	}
	if !mysqldb.Transient(err) {
		t.Errorf("a statement on a silent connection: %v; want a transient error", err)
	}
	if limit := ioTimeout + 2*time.Second; took > limit {
		t.Errorf("a statement on a silent connection failed after %s; want within %s", took.Round(time.Millisecond), limit)
	}
	t.Logf("a statement on a silent connection: %v after %s", err, took.Round(time.Millisecond))
	if err := db.QueryRowContext(ctx, "SELECT 1").Scan(&one); err != nil {
		t.Errorf("the next statement, on a new connection: %v", err)
	}
}
