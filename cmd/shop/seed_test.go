package main

import (
	"context"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"

	"shop/internal/admin"
	"shop/internal/handler"
	"shop/internal/mysqldb"
	"shop/internal/notify"
	"shop/internal/stock"
	"shop/internal/testenv"
	"shop/internal/verify"
)

const testAdminToken = "a-token-of-24-characters"

// deadAddr is a loopback address where nothing listens, below the
// ephemeral range (testenv.FreeAddr), so that a server a test starts on it
// finds it free.
func deadAddr(t *testing.T) string {
	t.Helper()
	return testenv.FreeAddr(t)
}

// seedAPI serves the admin API with the seeder serve builds, on the catalog
// and on the Redis at redisAddr, and returns its client.
func seedAPI(t *testing.T, catalog admin.Catalog, source *stock.Catalog, redisAddr string) *client {
	t.Helper()
	gin.SetMode(gin.ReleaseMode)
	cfg := testConfig(t, map[string]string{"SHOP_REDIS_ADDR": redisAddr, "SHOP_REDIS_PREFIX": redisPrefix(t)})
	rdb, products := testCache(t, cfg, source)
	srv := httptest.NewServer(handler.New(handler.Deps{
		Seeder: &admin.Admin{Catalog: catalog, Cache: products, Restocks: notify.New(rdb, cfg.Redis.Prefix)},
	}, handler.Settings{AdminToken: testAdminToken}).Admin)
	t.Cleanup(srv.Close)
	return operators(srv.URL, testAdminToken)
}

// A seed that committed stands, even when what follows it fails: the API
// answers 200 with warnings rather than a 503 that invites a retry (and a
// second seed would delete the orders placed since), and `shop seed` says
// the catalog WAS seeded and exits 1.
func TestSeedThatCommittedIsNotAFailure(t *testing.T) {
	t.Parallel()
	db := testenv.MySQL(t)
	catalog := stock.NewCatalog(db.Gorm)
	dead := deadAddr(t) // Redis is down: no announcement, no cache reset

	s := seedAPI(t, catalog, catalog, dead).seed(7, 2)
	if s.expect(200) != nil || s.body.Products != 7 || s.body.Stock != 2 || len(s.body.Warnings) != 2 {
		t.Errorf("seed with Redis down: %v; want 200 with the seed and two warnings", s)
	}
	for _, w := range s.body.Warnings {
		if strings.Contains(w, dead) || strings.Contains(w, "dial") {
			t.Errorf("warning shows internals: %q", w)
		}
	}
	if r, err := verify.Sale(context.Background(), db.Gorm, nil); err != nil || r.Products != 7 || r.Stock != 14 {
		t.Errorf("catalog after the seed: %+v, %v; want 7 products of 2 units", r, err)
	}

	var out strings.Builder
	err := run(context.Background(), []string{"seed", "--products", "5", "--stock", "1"},
		env(map[string]string{"SHOP_MYSQL_DSN": db.DSN, "SHOP_REDIS_ADDR": dead}), &out, &out)
	if code := exitCode(err, &out); code != 1 {
		t.Errorf("shop seed with Redis down: exit %d, want 1", code)
	}
	for _, want := range []string{"seeded 5 products", "warning: the replicas were not told", "warning: the product cache was not reset", "WAS seeded"} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("shop seed with Redis down does not say %q:\n%s", want, out.String())
		}
	}
	if r, err := verify.Sale(context.Background(), db.Gorm, nil); err != nil || r.Products != 5 {
		t.Errorf("catalog after shop seed: %+v, %v; want 5 products", r, err)
	}
}

// A seed that cannot reach MySQL wrote nothing and may be retried: 503 busy
// with Retry-After, not a 500.
func TestSeedWithMySQLDownIsBusy(t *testing.T) {
	t.Parallel()
	deadDB, err := mysqldb.Open("root@tcp("+deadAddr(t)+")/shop?parseTime=true", 4)
	if err != nil {
		t.Fatal(err)
	}
	catalog := stock.NewCatalog(deadDB)
	s := seedAPI(t, catalog, catalog, testenv.RedisAddr(t)).seed(5, 1)
	if s.status != 503 || s.code() != "busy" || s.header.Get("Retry-After") == "" {
		t.Errorf("seed with MySQL down: %v, Retry-After %q; want 503 busy with Retry-After", s, s.header.Get("Retry-After"))
	}
}
