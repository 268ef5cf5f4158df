package main

import (
	"database/sql"
	"fmt"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"shop/internal/testenv"
)

// What the container set-ups run: the setup's `shop seed --if-empty`
// (docker-compose.yml, deploy/k8s/job-setup.yaml) and the image's
// HEALTHCHECK, `shop healthcheck` (Dockerfile).

// catalogCounts returns how many products, units in stock and orders db
// holds.
func catalogCounts(t *testing.T, db *testenv.DB) (products, units, orders int64) {
	t.Helper()
	if err := db.Gorm.Raw("SELECT COUNT(*), COALESCE(SUM(stock), 0), (SELECT COUNT(*) FROM orders) FROM products").
		Row().Scan(&products, &units, &orders); err != nil {
		t.Fatal(err)
	}
	return products, units, orders
}

func TestSeedIfEmptySeedsAnEmptyCatalog(t *testing.T) {
	t.Parallel()
	db := testenv.MySQL(t)
	code, out := shop(t, db, "seed", "--if-empty", "--products", "20", "--stock", "3")
	if code != 0 || !strings.Contains(out, "seeded 20 products with 3 units each") {
		t.Fatalf("seed --if-empty of an empty catalog: exit %d\n%s", code, out)
	}
	if p, u, o := catalogCounts(t, db); p != 20 || u != 60 || o != 0 {
		t.Errorf("catalog after the seed: %d products, %d units, %d orders; want 20, 60, 0", p, u, o)
	}
}

// A started sale is left alone: `docker compose up` again, or the k8s Job
// created again, must not delete the orders.
func TestSeedIfEmptyLeavesACatalogWithOrders(t *testing.T) {
	t.Parallel()
	db := testenv.MySQL(t)
	if code, out := shop(t, db, "seed", "--products", "5", "--stock", "2"); code != 0 {
		t.Fatalf("seed: %d %s", code, out)
	}
	for _, q := range []string{
		"UPDATE products SET stock = stock - 1 WHERE id IN (1, 2)",
		"INSERT INTO orders (sku_id, user_id) VALUES (1, 7), (2, 8)",
	} {
		if err := db.Gorm.Exec(q).Error; err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	code, out := shop(t, db, "seed", "--if-empty", "--products", "50", "--stock", "9")
	if code != 0 || strings.TrimSpace(out) != "catalog has 5 products: not seeded" {
		t.Errorf("seed --if-empty of a catalog with orders: exit %d, %q; want 0, \"catalog has 5 products: not seeded\"", code, out)
	}
	if p, u, o := catalogCounts(t, db); p != 5 || u != 8 || o != 2 {
		t.Errorf("catalog after seed --if-empty: %d products, %d units, %d orders; want it as it was: 5, 8, 2", p, u, o)
	}
	if code, out := shop(t, db, "verify"); code != 0 {
		t.Errorf("verify: exit %d\n%s", code, out)
	}
}

// Two setups at once on an empty catalog (two `docker compose up`, a Job's
// retry beside its first pod) seed it once: the second finds the first's
// products and leaves them, whatever the timing. The test makes both reach
// the catalog's rows before either may write them: it holds, in a
// transaction of its own, the lock on the empty products table that an
// INSERT waits for, until two seeds wait — for that lock or for the seeds'
// own.
func TestSeedIfEmptyTwiceAtOnceSeedsOnce(t *testing.T) {
	t.Parallel()
	db := testenv.MySQL(t)
	// At REPEATABLE READ, so that the locking read of the empty table
	// locks its gap.
	hold := db.Open(t).Begin(&sql.TxOptions{Isolation: sql.LevelRepeatableRead})
	if err := hold.Exec("SELECT id FROM products FOR UPDATE").Error; err != nil {
		hold.Rollback()
		t.Fatal(err)
	}
	vars := map[string]string{"SHOP_MYSQL_DSN": db.DSN, "SHOP_REDIS_ADDR": testenv.RedisAddr(t), "SHOP_REDIS_PREFIX": redisPrefix(t),
		"SHOP_PAYMENT_WEBHOOK_SECRET": testWebhookSecret}
	type result struct {
		code int
		out  string
	}
	results := make(chan result, 2)
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			code, out := shopWith(vars, "seed", "--if-empty", "--products", "30", "--stock", "1")
			results <- result{code, out}
		})
	}
	// Both wait: at their INSERT of products, or at their first statement,
	// which raises the catalog's epoch, for the other seed's lock on it.
	waitFor(t, 20*time.Second, "two seeds waiting together", func() error {
		var waiting int
		err := db.Gorm.Raw(`SELECT COUNT(*) FROM information_schema.PROCESSLIST
			WHERE DB = DATABASE() AND ID <> CONNECTION_ID() AND COMMAND = 'Query'
			AND (INFO LIKE 'INSERT INTO products %' OR INFO LIKE 'INSERT INTO catalog_epoch %')`).Scan(&waiting).Error
		if err == nil && waiting < 2 {
			err = fmt.Errorf("%d waiting", waiting)
		}
		return err
	})
	if err := hold.Commit().Error; err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	close(results)
	var seeded, left int
	for r := range results {
		switch {
		case r.code == 0 && strings.Contains(r.out, "seeded 30 products"):
			seeded++
		case r.code == 0 && strings.TrimSpace(r.out) == "catalog has 30 products: not seeded":
			left++
		default:
			t.Errorf("seed --if-empty: exit %d\n%s", r.code, r.out)
		}
	}
	if seeded != 1 || left != 1 {
		t.Errorf("%d runs seeded, %d left the catalog; want one of each", seeded, left)
	}
	if p, u, o := catalogCounts(t, db); p != 30 || u != 30 || o != 0 {
		t.Errorf("catalog: %d products, %d units, %d orders; want 30, 30, 0", p, u, o)
	}
}

// healthcheckWith runs shop healthcheck with SHOP_HTTP_ADDR=addr.
func healthcheckWith(addr string) (int, string) {
	return shopWith(map[string]string{"SHOP_HTTP_ADDR": addr}, "healthcheck")
}

// shop healthcheck asks the replica on the port of SHOP_HTTP_ADDR, however
// the address is written, and fails once it has stopped.
func TestHealthcheckOfAReplica(t *testing.T) {
	t.Parallel()
	db := testenv.MySQL(t)
	r := startReplica(t, fleetVars(t, db, nil)())
	_, port, err := net.SplitHostPort(r.addr())
	if err != nil {
		t.Fatal(err)
	}
	for _, addr := range []string{":" + port, "0.0.0.0:" + port, "127.0.0.1:" + port} {
		code, out := healthcheckWith(addr)
		if want := "http://127.0.0.1:" + port + "/readyz answered 200 OK"; code != 0 || !strings.Contains(out, want) {
			t.Errorf("SHOP_HTTP_ADDR=%s: exit %d, %q; want 0, %q", addr, code, out, want)
		}
	}
	r.stop()
	waitFor(t, 10*time.Second, "the stopped replica's healthcheck exits 1, not ready", func() error {
		code, out := healthcheckWith(":" + port)
		if code != 1 || !strings.Contains(out, "not ready") {
			return fmt.Errorf("exit %d, %q", code, out)
		}
		t.Logf("stopped replica: %s", strings.TrimSpace(out))
		return nil
	})
}

// shop healthcheck GETs /readyz and exits 0 on 200 only, 1 on anything else
// — never 2, which container engines reserve — and within its timeout.
func TestHealthcheckExits0Or1(t *testing.T) {
	// Not in parallel: each run must end within the healthcheck's timeout
	// and a second.
	var (
		mu       sync.Mutex
		requests []string
	)
	status := http.StatusOK
	hang := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		requests = append(requests, r.Method+" "+r.URL.Path)
		code := status
		mu.Unlock()
		if code == 0 {
			<-hang
			return
		}
		w.WriteHeader(code)
		fmt.Fprintf(w, `{"status":%d}`, code)
	}))
	t.Cleanup(srv.Close)
	t.Cleanup(func() { close(hang) })
	_, port, err := net.SplitHostPort(srv.Listener.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	setStatus := func(code int) {
		mu.Lock()
		status = code
		mu.Unlock()
	}

	for _, tt := range []struct {
		name   string
		status int // 0: never answers
		addr   string
		args   []string
		code   int
		want   string
	}{
		{"ready", 200, ":" + port, nil, 0, "/readyz answered 200 OK"},
		{"ready, every interface", 200, "0.0.0.0:" + port, nil, 0, "http://127.0.0.1:" + port + "/readyz answered 200 OK"},
		{"not ready", 503, ":" + port, nil, 1, `not ready: http://127.0.0.1:` + port + `/readyz answered 503 Service Unavailable: {"status":503}`},
		{"redirect", 301, ":" + port, nil, 1, "answered 301"},
		{"no answer", 0, ":" + port, nil, 1, "context deadline exceeded"},
		{"nothing listening", 200, deadAddr(t), nil, 1, "connection refused"},
		{"bad address", 200, port, nil, 1, "SHOP_HTTP_ADDR"},
		{"bad argument", 200, ":" + port, []string{"--port", "1"}, 1, "flag provided but not defined"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			setStatus(tt.status)
			start := time.Now()
			code, out := shopWith(map[string]string{"SHOP_HTTP_ADDR": tt.addr}, append([]string{"healthcheck"}, tt.args...)...)
			if code != tt.code || !strings.Contains(out, tt.want) {
				t.Errorf("exit %d, %q; want %d and %q", code, out, tt.code, tt.want)
			}
			if took := time.Since(start); took > healthcheckTimeout+time.Second {
				t.Errorf("took %s; the timeout is %s", took, healthcheckTimeout)
			}
		})
	}
	mu.Lock()
	defer mu.Unlock()
	for _, r := range requests {
		if r != "GET /readyz" {
			t.Errorf("request %q; want only GET /readyz", r)
		}
	}
}

// An address that listens on every interface is asked on the loopback;
// any other, as written.
func TestReadyURL(t *testing.T) {
	t.Parallel()
	for addr, want := range map[string]string{
		":9090":          "http://127.0.0.1:9090/readyz",
		"0.0.0.0:9090":   "http://127.0.0.1:9090/readyz",
		"[::]:9090":      "http://[::1]:9090/readyz",
		"127.0.0.1:9090": "http://127.0.0.1:9090/readyz",
		"[::1]:9090":     "http://[::1]:9090/readyz",
		"10.1.2.3:9090":  "http://10.1.2.3:9090/readyz",
		"shop1:8080":     "http://shop1:8080/readyz",
	} {
		if got, err := readyURL(addr); err != nil || got != want {
			t.Errorf("readyURL(%q) = %q, %v; want %q", addr, got, err, want)
		}
	}
}
