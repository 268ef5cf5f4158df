package main

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"shop/internal/stock"
	"shop/internal/testenv"
)

// proxiedMySQL starts a proxy in front of db's server, and returns it and
// db's DSN through it.
func proxiedMySQL(t *testing.T, db *testenv.DB) (*testenv.Proxy, string) {
	t.Helper()
	cfg, err := mysql.ParseDSN(db.DSN)
	if err != nil {
		t.Fatal(err)
	}
	proxy := testenv.StartProxy(t, cfg.Addr)
	cfg.Addr = proxy.Addr
	return proxy, cfg.FormatDSN()
}

// A MySQL gone silent — its connections open and nothing answered, as
// behind a frozen machine or a failover that leaves the old address dead
// without a reset — fails a request within SHOP_MYSQL_IO_TIMEOUT with 503
// busy rather than holding it until TCP gives up, some fifteen minutes;
// the readiness probe reports it; and the pools serve again on new
// connections as soon as those go through.
func TestSilentMySQLFailsARequestWithinTheIOTimeout(t *testing.T) {
	t.Parallel()
	db := testenv.MySQL(t)
	ctx := context.Background()
	if err := stock.NewCatalog(db.Gorm).Seed(ctx, 3, 5); err != nil {
		t.Fatal(err)
	}
	proxy, dsn := proxiedMySQL(t, db)
	const ioTimeout = time.Second
	rep := startReplica(t, fleetVars(t, db, map[string]string{
		"SHOP_MYSQL_DSN":        dsn,
		"SHOP_MYSQL_IO_TIMEOUT": ioTimeout.String(),
		"SHOP_READY_GRACE":      "0s",
	})())
	stockOf := func() reply[none] {
		// The client gives up long after the bound, so that a request held
		// by a silent connection is told from one answered late.
		ctx, cancel := context.WithTimeout(ctx, 10*ioTimeout)
		defer cancel()
		return rep.public.send("GET", "/api/v1/products/1/stock", "", withContext(ctx))
	}
	// Requests side by side, so that the public pool holds several idle
	// connections: the replica's own work may take one of them at any
	// time.
	const width = publicPoolSize
	side := func() []reply[none] {
		replies := make([]reply[none], width)
		var wg sync.WaitGroup
		for i := range replies {
			wg.Go(func() { replies[i] = stockOf() })
		}
		wg.Wait()
		return replies
	}
	for _, r := range side() {
		if err := r.expect(http.StatusOK); err != nil {
			t.Fatalf("stock before the silence: %v", err)
		}
	}

	// The pools' idle connections now lead nowhere; new ones go through.
	proxy.Blackhole()
	start := time.Now()
	replies := side()
	took := time.Since(start)
	busy := 0
	for _, r := range replies {
		switch {
		case r.expect(http.StatusServiceUnavailable) == nil && r.code() == "busy":
			busy++
		case r.expect(http.StatusOK) != nil:
			t.Errorf("stock with the pool's connections silent: %v; want 200, or 503 busy", r)
		}
	}
	// The bound, and the slack of a shared machine for the rest of the
	// request.
	if limit := ioTimeout + 3*time.Second; took > limit {
		t.Errorf("%d requests for stock with the pool's connections silent answered after %s; want within %s", width, took.Round(time.Millisecond), limit)
	}
	if busy == 0 {
		t.Errorf("none of %d requests met a silent connection: the test proves nothing", width)
	}
	t.Logf("%d requests for stock with the pool's connections silent: %d busy, all answered after %s", width, busy, took.Round(time.Millisecond))
	waitFor(t, 10*time.Second, "the readiness probe to report MySQL silent", func() error {
		for line := range strings.Lines(rep.log.String()) {
			if strings.Contains(line, "dependency does not answer") && strings.Contains(line, `"dependency":"mysql"`) {
				return nil
			}
		}
		return errors.New("no such log line yet")
	})
	waitFor(t, 10*time.Second, "stock again on a new connection", func() error { return stockOf().expect(http.StatusOK) })
	waitFor(t, 10*time.Second, "ready again", func() error { return rep.public.readyz(closing()).expect(http.StatusOK) })
}
