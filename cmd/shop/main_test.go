package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"shop/internal/stock"
	"shop/internal/testenv"
	"shop/internal/verify"
)

// env returns a getenv over m.
func env(m map[string]string) func(string) string {
	return func(k string) string { return m[k] }
}

func TestConfigErrorsNameTheVariable(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, value string
	}{
		{"SHOP_LOCK_MODE", "consul"},
		{"SHOP_LOCK_TTL", "five"},
		{"SHOP_LOCK_TTL", "1ms"},
		{"SHOP_LOCK_WAIT", "-1s"},
		{"SHOP_LOCK_WAIT", "11s"}, // an order's turn must keep time for its transaction
		{"SHOP_STOCK_UPDATE", "optimistic"},
		{"SHOP_FENCING", "yes"},
		{"SHOP_LOG_LEVEL", "loud"},
		{"SHOP_MYSQL_DSN", "not a dsn"},
		{"SHOP_MYSQL_IO_TIMEOUT", "10"},
		{"SHOP_MYSQL_IO_TIMEOUT", "100ms"},
		{"SHOP_MYSQL_IO_TIMEOUT", "1h"},
		{"SHOP_REDIS_ADDR", "localhost"},
		{"SHOP_REDIS_ADDR", "127.0.0.1:7000,localhost"},
		{"SHOP_REDIS_ADDR", " , "},
		{"SHOP_REDIS_PREFIX", "shop{}:"},
		{"SHOP_REDIS_PREFIX", "{shop}:"},
		{"SHOP_HTTP_ADDR", "8080"},
		{"SHOP_CACHE_TTL", "10"},
		{"SHOP_CACHE_TTL", "10ms"},
		{"SHOP_CACHE_JITTER", "60%"},
		{"SHOP_CACHE_JITTER", "-0.1"},
		{"SHOP_CACHE_JITTER", "lots"},
		{"SHOP_CACHE_NULL_TTL", "10m"},
		{"SHOP_BLOOM", "maybe"},
		{"SHOP_REDLOCK_ADDRS", "localhost"},
		{"SHOP_ORDER_BATCH", "0"},
		{"SHOP_PAY_WINDOW", "-1m"},
		{"SHOP_PAY_WINDOW", "15"},
		{"SHOP_PAY_WINDOW", "169h"},
		{"SHOP_SWEEP_INTERVAL", "0s"},
		{"SHOP_SWEEP_INTERVAL", "99ms"},
		{"SHOP_SWEEP_INTERVAL", "11m"},
		{"SHOP_ORDER_BATCH", "lots"},
		{"SHOP_ORDER_BATCH", "10001"},
		{"SHOP_ORDER_GROUP", "0"},
		{"SHOP_ORDER_GROUP", "25"},
		{"SHOP_LOCK_TTL", "299ms"},
		{"SHOP_LOCK_TTL", "11m"},
		{"SHOP_ADMIN_TOKEN", "s3cret"},
		{"SHOP_ADMIN_TOKEN", "fifteen-chars.."},
		{"SHOP_DEBUG_ADDR", ":6060"},
		{"SHOP_DEBUG_ADDR", "0.0.0.0:6060"},
		{"SHOP_DEBUG_ADDR", "[::]:6060"},
		{"SHOP_DEBUG_ADDR", "192.168.1.10:6060"},
		{"SHOP_DEBUG_ADDR", "127.0.0.1"},
		{"SHOP_DRAIN", "-1s"},
		{"SHOP_DRAIN", "2m"},
		{"SHOP_DRAIN", "soon"},
		{"SHOP_USER_LIMIT", "-1"},
		{"SHOP_USER_LIMIT", "three"},
		{"SHOP_USER_LIMIT", "1000001"},
		{"SHOP_RATE_USER", "-1"},
		{"SHOP_RATE_USER", "5/s"},
		{"SHOP_RATE_USER_BURST", "2"}, // below the default rate of 5
		{"SHOP_RATE_IP", "1000001"},
		{"SHOP_TRUSTED_PROXIES", "nginx"},
		{"SHOP_TRUSTED_PROXIES", "10.0.0.0/33"},
		{"SHOP_TRUSTED_PROXIES", " , "},
		{"SHOP_ADMIN_ADDR", "9091"},
		{"SHOP_ADMIN_ADDR", "127.0.0.1:70000"},
		{"SHOP_READY_GRACE", "-1s"},
		{"SHOP_READY_GRACE", "10"},
		{"SHOP_READY_GRACE", "6m"},
		{"SHOP_CACHE_LOCAL_TTL", "-1s"},
		{"SHOP_CACHE_LOCAL_TTL", "1"},
		{"SHOP_CACHE_LOCAL_TTL", "2m"},
		{"SHOP_PAYMENTS", "paypal"},
		{"SHOP_PAYMENT_WEBHOOK_SECRET", "not-whsec"},
		{"SHOP_PAYMENT_WEBHOOK_SECRET", "whsec_c2hvcnQ="}, // 5 bytes
		{"SHOP_PAYMENT_WEBHOOK_SECRET", testWebhookSecret + ",whsec_!!"},
		{"SHOP_PAYMENT_WEBHOOK_SECRET", ""}, // the default pay window needs it
		{"SHOP_CURRENCY", "usd"},
		{"SHOP_CURRENCY", "EURO"},
		{"SHOP_STRIPE_API_BASE", "localhost:12111"},
		{"SHOP_EVENTS_URL", "http://127.0.0.1:9/events"}, // without its secret
		{"SHOP_EVENTS_SECRET", testWebhookSecret},        // without a URL
		{"SHOP_EVENTS_TIMEOUT", "0s"},
		{"SHOP_EVENTS_TIMEOUT", "2m"},
		{"SHOP_EVENTS_MAX_BACKOFF", "forever"},
		{"SHOP_EVENTS_CONCURRENCY", "257"},
		{"SHOP_EVENTS_MAX_AGE", "31d"},
		{"SHOP_EVENTS_RETAIN", "7days"},
	}
	base := serveBase(t)
	for _, tt := range tests {
		t.Run(tt.name+"="+tt.value, func(t *testing.T) {
			code, out := serveWith(base, map[string]string{tt.name: tt.value})
			if code != 2 {
				t.Errorf("exit code %d, want 2:\n%s", code, out)
			}
			if !strings.Contains(out, tt.name) {
				t.Errorf("message does not name %s: %q", tt.name, out)
			}
		})
	}
	if _, err := loadConfig(env(nil)); err != nil {
		t.Errorf("defaults rejected: %v", err)
	}
}

// SHOP_EVENTS_URL takes an http(s) URL with one whsec_ secret of the
// length payment secrets have; the durations take days too.
func TestConfigEvents(t *testing.T) {
	t.Parallel()
	ok := map[string]string{"SHOP_EVENTS_URL": "https://hooks.example.com/shop", "SHOP_EVENTS_SECRET": testWebhookSecret,
		"SHOP_EVENTS_RETAIN": "30d", "SHOP_EVENTS_MAX_AGE": "36h"}
	c, err := loadConfig(env(ok))
	if err != nil {
		t.Fatal(err)
	}
	if c.Events.Signer == nil || c.Events.Retain != 30*24*time.Hour || c.Events.MaxAge != 36*time.Hour || c.Events.Timeout != 5*time.Second ||
		c.Events.Concurrency != 16 || c.Events.MaxBackoff != 5*time.Minute {
		t.Errorf("events config %+v", c.Events)
	}
	if c, err := loadConfig(env(nil)); err != nil || c.Events.URL != "" || c.Events.Retain != 7*24*time.Hour {
		t.Errorf("defaults: %+v, %v; want no URL and 7 days' retention", c.Events, err)
	}
	for name, bad := range map[string]map[string]string{
		"SHOP_EVENTS_URL":    {"SHOP_EVENTS_URL": "ftp://hooks.example.com"},
		"SHOP_EVENTS_SECRET": {"SHOP_EVENTS_SECRET": testWebhookSecret + "," + testWebhookSecret},
	} {
		vars := maps.Clone(ok)
		maps.Copy(vars, bad)
		if _, err := loadConfig(env(vars)); err == nil || !strings.Contains(err.Error(), name) {
			t.Errorf("%v: %v, want an error naming %s", bad, err, name)
		}
	}
	vars := maps.Clone(ok)
	vars["SHOP_EVENTS_SECRET"] = "whsec_c2hvcnQ=" // 5 bytes
	if _, err := loadConfig(env(vars)); err == nil || strings.Contains(err.Error(), "c2hvcnQ") {
		t.Errorf("a short secret: %v, want an error that does not quote it", err)
	}
}

// SHOP_CACHE_LOCAL_TTL defaults to 1s and takes 0 (no copy of the pages).
func TestConfigCacheLocalTTL(t *testing.T) {
	t.Parallel()
	for v, want := range map[string]time.Duration{"": time.Second, "0": 0, "250ms": 250 * time.Millisecond, "1m": time.Minute} {
		if got := testConfig(t, map[string]string{"SHOP_CACHE_LOCAL_TTL": v}).Cache.LocalTTL; got != want {
			t.Errorf("SHOP_CACHE_LOCAL_TTL=%q: %s; want %s", v, got, want)
		}
	}
}

// SHOP_REDIS_ADDR and SHOP_REDIS_MASTER_NAME name every Redis deployment in
// go-redis's terms: one address, a Cluster's seed nodes, or Sentinels.
func TestConfigRedisTopology(t *testing.T) {
	t.Parallel()
	tests := []struct {
		addr, master string
		want         string
		addrs        []string
	}{
		{"", "", "single", []string{"127.0.0.1:6379"}},
		{"redis:6379", "", "single", []string{"redis:6379"}},
		{"a:7000, b:7001,c:7002,", "", "cluster", []string{"a:7000", "b:7001", "c:7002"}},
		{"s1:26379,s2:26379,s3:26379", "shop", "sentinel", []string{"s1:26379", "s2:26379", "s3:26379"}},
		{"s1:26379", "shop", "sentinel", []string{"s1:26379"}},
	}
	for _, tt := range tests {
		cfg, err := loadConfig(env(map[string]string{"SHOP_REDIS_ADDR": tt.addr, "SHOP_REDIS_MASTER_NAME": tt.master}))
		if err != nil {
			t.Errorf("%q, %q: %v", tt.addr, tt.master, err)
			continue
		}
		if got := cfg.Redis.topology(); got != tt.want || !slices.Equal(cfg.Redis.Addrs, tt.addrs) {
			t.Errorf("%q, %q: %s on %q, want %s on %q", tt.addr, tt.master, got, cfg.Redis.Addrs, tt.want, tt.addrs)
		}
		// go-redis's own choice of client agrees.
		c := newRedis(cfg.Redis)
		c.Close()
		if _, cluster := c.(*redis.ClusterClient); cluster != (tt.want == "cluster") {
			t.Errorf("%q, %q: go-redis made a %T, want %s", tt.addr, tt.master, c, tt.want)
		}
	}
	for _, ok := range []map[string]string{
		{"SHOP_LOCK_TTL": "300ms"}, {"SHOP_LOCK_TTL": "10m"},
		{"SHOP_ADMIN_TOKEN": "sixteen-chars..."},
		{"SHOP_DEBUG_ADDR": "127.0.0.1:6060"}, {"SHOP_DEBUG_ADDR": "[::1]:6060"}, {"SHOP_DEBUG_ADDR": "localhost:6060"},
		{"SHOP_DRAIN": "0s"}, {"SHOP_DRAIN": "1m"},
		{"SHOP_USER_LIMIT": "0"}, {"SHOP_USER_LIMIT": "1000000"},
		{"SHOP_RATE_USER": "0"}, {"SHOP_RATE_USER": "1", "SHOP_RATE_USER_BURST": "0"}, {"SHOP_RATE_IP": "1000000"},
		{"SHOP_TRUSTED_PROXIES": "none"}, {"SHOP_TRUSTED_PROXIES": "10.0.0.0/8, 192.168.1.5,::1"},
		{"SHOP_ADMIN_ADDR": ":9091"}, {"SHOP_ADMIN_ADDR": "[::1]:0"},
	} {
		if _, err := loadConfig(env(ok)); err != nil {
			t.Errorf("%v rejected: %v", ok, err)
		}
	}
	if _, err := loadConfig(env(map[string]string{"SHOP_ADMIN_TOKEN": "s3cret"})); err == nil || strings.Contains(err.Error(), "s3cret") {
		t.Errorf("short admin token: %v; want an error that does not show the token", err)
	}
	if _, err := loadConfig(env(map[string]string{"SHOP_LOCK_MODE": "redlock"})); err == nil ||
		!strings.Contains(err.Error(), "SHOP_REDLOCK_ADDRS") {
		t.Errorf("redlock without masters: %v, want an error naming SHOP_REDLOCK_ADDRS", err)
	}
	if c, err := loadConfig(env(map[string]string{"SHOP_LOCK_MODE": "redlock", "SHOP_REDLOCK_ADDRS": "a:1, b:2,c:3"})); err != nil ||
		!slices.Equal(c.Lock.RedlockAddrs, []string{"a:1", "b:2", "c:3"}) {
		t.Errorf("redlock with three masters: %q, %v", c.Lock.RedlockAddrs, err)
	}
	for v, want := range map[string]float64{"10%": 0.1, "0.25": 0.25, "0": 0, "50%": 0.5} {
		if c, err := loadConfig(env(map[string]string{"SHOP_CACHE_JITTER": v})); err != nil || c.Cache.Jitter != want {
			t.Errorf("SHOP_CACHE_JITTER=%s: %v, %v; want %v", v, c.Cache.Jitter, err, want)
		}
	}
}

func TestUsageErrors(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{nil, {"nope"}, {"seed", "--products", "x"}, {"verify", "extra"}} {
		var out bytes.Buffer
		if code := exitCode(run(context.Background(), args, env(nil), &out, &out), &out); code != 2 {
			t.Errorf("shop %v: exit %d, want 2", args, code)
		}
	}
}

// shop runs a one-shot command on db and on the test's Redis key space, and
// returns its exit code and output.
func shop(t *testing.T, db *testenv.DB, args ...string) (int, string) {
	t.Helper()
	return shopWith(map[string]string{"SHOP_MYSQL_DSN": db.DSN, "SHOP_REDIS_ADDR": testenv.RedisAddr(t), "SHOP_REDIS_PREFIX": redisPrefix(t)}, args...)
}

// shopWith runs the shop command with args and the settings vars, and
// returns its exit code and output.
func shopWith(vars map[string]string, args ...string) (int, string) {
	var out bytes.Buffer
	err := run(context.Background(), args, env(vars), &out, &out)
	return exitCode(err, &out), out.String()
}

var prefixes sync.Map // *testing.T → string

// redisPrefix is the test's own Redis key space, the same on every call.
func redisPrefix(t *testing.T) string {
	t.Helper()
	if p, ok := prefixes.Load(t); ok {
		return p.(string)
	}
	_, p := testenv.Redis(t)
	prefixes.Store(t, p)
	t.Cleanup(func() { prefixes.Delete(t) })
	return p
}

func TestMigrateSeedVerify(t *testing.T) {
	t.Parallel()
	db := testenv.MySQL(t)
	if code, out := shop(t, db, "migrate"); code != 0 {
		t.Fatalf("migrate again: %d %s", code, out)
	}
	if code, out := shop(t, db, "seed", "--products", "20", "--stock", "3"); code != 0 {
		t.Fatalf("seed: %d %s", code, out)
	}
	code, out := shop(t, db, "verify")
	if code != 0 || !strings.Contains(out, "products 20, initial stock 60, stock 60, orders 0") {
		t.Fatalf("verify of a fresh catalog: %d\n%s", code, out)
	}
}

func TestMigrateCreatesDatabase(t *testing.T) {
	t.Parallel()
	db := testenv.MySQL(t)
	fresh := &testenv.DB{DSN: strings.Replace(db.DSN, "/shop_test_", "/shop_fresh_", 1)}
	t.Cleanup(func() {
		db.Gorm.Exec("DROP DATABASE IF EXISTS " + strings.TrimPrefix(dbName(fresh.DSN), "/"))
	})
	if code, out := shop(t, fresh, "migrate"); code != 0 {
		t.Fatalf("migrate on a server without the database: %d %s", code, out)
	}
	if code, out := shop(t, fresh, "verify"); code != 0 {
		t.Fatalf("verify after migrate: %d %s", code, out)
	}
}

func dbName(dsn string) string {
	i := strings.Index(dsn, "/")
	j := strings.Index(dsn, "?")
	return dsn[i+1 : j]
}

// TestVerifyDetectsEachViolation breaks a database in each way verify checks
// and expects exit 1 with that check failing, and only that one.
func TestVerifyDetectsEachViolation(t *testing.T) {
	t.Parallel()
	tests := []struct {
		check string
		sql   []string
		acks  string
	}{
		{check: "stock >= 0", sql: []string{
			"UPDATE products SET stock = -1, initial_stock = -1 WHERE id = 1",
		}},
		{check: "initial_stock == stock + active orders", sql: []string{
			"INSERT INTO orders (sku_id, user_id) VALUES (2, 7)",
		}},
		{check: "initial_stock == stock + active orders", sql: []string{
			// An expired order whose unit did not go back.
			"UPDATE products SET stock = 0 WHERE id = 2",
			"INSERT INTO orders (sku_id, user_id, status, returned_at) VALUES (2, 7, 'expired', NOW(6))",
		}},
		{check: "one active order per (user, sku)", sql: []string{
			"ALTER TABLE orders DROP INDEX uq_orders_user_active_sku",
			"UPDATE products SET initial_stock = 3 WHERE id = 3",
			"INSERT INTO orders (sku_id, user_id, status) VALUES (3, 7, 'paid'), (3, 7, 'reserved')",
		}},
		{check: "every order names a product", sql: []string{
			"INSERT INTO orders (sku_id, user_id, status, returned_at) VALUES (999, 7, 'cancelled', NOW(6))",
		}},
		{check: "no order both paid and cancelled or expired", sql: []string{
			"INSERT INTO orders (sku_id, user_id, status, paid_at, payment_id, returned_at) VALUES (2, 7, 'cancelled', NOW(6), 'p1', NOW(6))",
		}},
		{check: "returned_at set exactly on cancelled and expired orders", sql: []string{
			"INSERT INTO orders (sku_id, user_id, status) VALUES (2, 7, 'expired')",
		}},
		{check: "every order paid by a payment has its payment id", sql: []string{
			"UPDATE products SET stock = 0 WHERE id = 2",
			"INSERT INTO orders (sku_id, user_id, status, paid_at) VALUES (2, 7, 'paid', NOW(6))",
		}},
		{check: "every refund owed is of its order, for a reason the order bears out", sql: []string{
			"UPDATE products SET stock = 0 WHERE id = 2",
			// Owed back as expired, yet it came before pay_by (and after
			// the seed, so it is held to the orders of now).
			"INSERT INTO orders (id, sku_id, user_id, status, pay_by) VALUES (50, 2, 7, 'reserved', UTC_TIMESTAMP(6) + INTERVAL 1 HOUR)",
			"INSERT INTO refunds (refund_id, order_id, payment_id, user_id, sku_id, reason, received_at) VALUES ('01JAAAAAAAAAAAAAAAAAAAAAAA', 50, 'p1', 7, 2, 'order_expired', UTC_TIMESTAMP(6))",
		}},
		{check: "no payment both paid an order and is owed back", sql: []string{
			"UPDATE products SET stock = 0 WHERE id = 2",
			"INSERT INTO orders (id, sku_id, user_id, status, pay_by, paid_at, payment_id) VALUES (50, 2, 7, 'paid', NOW(6), NOW(6), 'p1')",
			"INSERT INTO orders (id, sku_id, user_id, status, pay_by, returned_at) VALUES (51, 3, 7, 'expired', NOW(6), NOW(6))",
			"INSERT INTO refunds (refund_id, order_id, payment_id, user_id, sku_id, reason, received_at) VALUES ('01JAAAAAAAAAAAAAAAAAAAAAAB', 51, 'p1', 7, 3, 'order_expired', NOW(6))",
		}},
		{check: "every acknowledged order exists", acks: "12345\n"},
		{check: "every acknowledged order exists", sql: []string{
			"INSERT INTO orders (id, sku_id, user_id, status, returned_at) VALUES (60, 2, 7, 'cancelled', NOW(6))",
		}, acks: "60 2 7\n12345\n"},
		{check: "every acknowledged order has its sku and user", sql: []string{
			"UPDATE products SET stock = 0 WHERE id = 4",
			"INSERT INTO orders (id, sku_id, user_id) VALUES (77, 4, 7)",
		}, acks: "77 4 8\n"},
	}
	for _, tt := range tests {
		t.Run(tt.check, func(t *testing.T) {
			t.Parallel()
			db := testenv.MySQL(t)
			if err := stock.NewCatalog(db.Gorm).Seed(context.Background(), 5, 1); err != nil {
				t.Fatal(err)
			}
			for _, q := range tt.sql {
				if err := db.Gorm.Exec(q).Error; err != nil {
					t.Fatalf("%s: %v", q, err)
				}
			}
			args := []string{"verify"}
			if tt.acks != "" {
				path := filepath.Join(t.TempDir(), "acks")
				if err := os.WriteFile(path, []byte(tt.acks), 0o600); err != nil {
					t.Fatal(err)
				}
				args = append(args, "--acks", path)
			}
			code, out := shop(t, db, args...)
			if code != 1 {
				t.Errorf("exit %d, want 1\n%s", code, out)
			}
			if !strings.Contains(out, "FAIL  "+tt.check+":") {
				t.Errorf("%q not reported:\n%s", tt.check, out)
			}
			if n := strings.Count(out, "FAIL"); n != 1 {
				t.Errorf("%d checks failed, want only %q:\n%s", n, tt.check, out)
			}
		})
	}
}

func TestVerifyJSON(t *testing.T) {
	t.Parallel()
	db := testenv.MySQL(t)
	shop(t, db, "seed", "--products", "2", "--stock", "1")
	code, out := shop(t, db, "verify", "--json")
	if code != 0 || !strings.Contains(out, `"ok": true`) || !strings.Contains(out, `"oversold_units": 0`) {
		t.Errorf("verify --json: %d\n%s", code, out)
	}
}

// A sale with orders in every status and refunds owed: the report counts
// them, in text and in JSON, and every invariant holds.
func TestVerifyLifecycle(t *testing.T) {
	t.Parallel()
	db := testenv.MySQL(t)
	if code, out := shop(t, db, "seed", "--products", "3", "--stock", "2"); code != 0 {
		t.Fatal(out)
	}
	for _, q := range []string{
		"UPDATE products SET stock = 0 WHERE id = 1",
		"UPDATE products SET stock = 1 WHERE id = 2",
		`INSERT INTO orders (id, sku_id, user_id, status, pay_by, paid_at, payment_id, returned_at) VALUES
			(1, 1, 7, 'reserved', NOW(6), NULL, NULL, NULL),
			(2, 1, 8, 'paid', NOW(6), NOW(6), 'pay-2', NULL),
			(3, 2, 7, 'paid', NULL, NULL, NULL, NULL),
			(4, 2, 8, 'cancelled', NOW(6), NULL, NULL, NOW(6)),
			(5, 3, 7, 'expired', NOW(6), NULL, NULL, NOW(6))`,
		`INSERT INTO refunds (refund_id, order_id, payment_id, user_id, sku_id, reason, received_at) VALUES
			('01JAAAAAAAAAAAAAAAAAAAAAAC', 5, 'pay-5', 7, 3, 'order_expired', NOW(6))`,
	} {
		if err := db.Gorm.Exec(q).Error; err != nil {
			t.Fatalf("%s: %v", q, err)
		}
	}
	path := filepath.Join(t.TempDir(), "acks")
	os.WriteFile(path, []byte("1\n2\n3\n4 2 8\n5 3 7\n"), 0o600)
	code, out := shop(t, db, "verify", "--acks", path)
	for _, line := range []string{
		"products 3, initial stock 6, stock 3, orders 5, oversold units 0\n",
		"orders by status: reserved 1, paid 2, cancelled 1, expired 1; refunds owed 1\n",
		"info  1 paid orders carry no payment id (paid when placed, or by the migration)\n",
		"ok    every acknowledged order exists\n",
		"verdict: all invariants hold\n",
	} {
		if code != 0 || !strings.Contains(out, line) {
			t.Errorf("verify: exit %d, want 0 and %q\n%s", code, line, out)
		}
	}
	code, out = shop(t, db, "verify", "--json")
	var r struct {
		OK       bool             `json:"ok"`
		Orders   int64            `json:"orders"`
		ByStatus map[string]int64 `json:"orders_by_status"`
		Refunds  int64            `json:"refunds_owed"`
		NoPay    int64            `json:"paid_without_payment_id"`
	}
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		t.Fatalf("verify --json: %v\n%s", err, out)
	}
	want := map[string]int64{"reserved": 1, "paid": 2, "cancelled": 1, "expired": 1}
	if code != 0 || !r.OK || r.Orders != 5 || !maps.Equal(r.ByStatus, want) || r.Refunds != 1 || r.NoPay != 1 {
		t.Errorf("verify --json: exit %d, %+v; want ok, 5 orders %v, 1 refund owed, 1 paid without payment id\n%s", code, r, want, out)
	}
}

func TestReadAcks(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "acks")
	os.WriteFile(path, []byte("1\n\n 2 \n3\n4 5\t6\n"), 0o600)
	got, err := readAcks(path)
	if err != nil || len(got) != 4 || got[2] != (verify.Ack{OrderID: 3}) || got[3] != (verify.Ack{OrderID: 4, SKUID: 5, UserID: 6}) {
		t.Errorf("readAcks = %v, %v", got, err)
	}
	for _, bad := range []string{"1\nx\n", "1\n2 3\n", "1\n2 3 4 5\n", "1\n2 3 -4\n"} {
		os.WriteFile(path, []byte(bad), 0o600)
		if _, err := readAcks(path); err == nil || !strings.Contains(err.Error(), "line 2") {
			t.Errorf("bad line in %q: %v", bad, err)
		}
	}
	if _, err := readAcks(filepath.Join(t.TempDir(), "none")); err == nil || errors.Is(err, errViolations) {
		t.Errorf("missing file: %v", err)
	}
}
