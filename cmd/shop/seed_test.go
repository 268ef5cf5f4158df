package main

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/gin-gonic/gin"

	"shop/internal/handler"
	"shop/internal/mysqldb"
	"shop/internal/notify"
	"shop/internal/stock"
	"shop/internal/testenv"
	"shop/internal/verify"
)

const testAdminToken = "a-token-of-24-characters"

// deadAddr is a loopback address where nothing listens.
func deadAddr(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr
}

// seedAPI serves the admin API with the seeder serve builds, on the catalog
// and on the Redis at redisAddr, and returns its client.
func seedAPI(t *testing.T, catalog catalogSeeder, source *stock.Catalog, redisAddr string) *client {
	t.Helper()
	gin.SetMode(gin.ReleaseMode)
	cfg := testConfig(t, map[string]string{"SHOP_REDIS_ADDR": redisAddr, "SHOP_REDIS_PREFIX": redisPrefix(t)})
	rdb, products := testCache(t, cfg, source)
	srv := httptest.NewServer(handler.New(handler.Deps{
		Seeder: newSeeder(catalog, products, notify.New(rdb, cfg.Redis.Prefix), slog.New(slog.DiscardHandler)),
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

// cancelAfterSeed seeds, then cancels the caller's context, as a client
// that gives up right after the commit does.
type cancelAfterSeed struct {
	catalog *stock.Catalog
	cancel  context.CancelFunc
}

func (c cancelAfterSeed) SeedWindow(ctx context.Context, n, units int, sale stock.Window) error {
	err := c.catalog.SeedWindow(ctx, n, units, sale)
	c.cancel()
	return err
}

// What follows a committed seed does not depend on the client staying: the
// Bloom filter is rebuilt even when the request's context ends right after
// the commit, so the new products are not refused as absent.
func TestSeedFollowUpOutlivesTheRequest(t *testing.T) {
	t.Parallel()
	db := testenv.MySQL(t)
	catalog := stock.NewCatalog(db.Gorm)
	ctx := context.Background()
	if err := catalog.Seed(ctx, 3, 1); err != nil {
		t.Fatal(err)
	}
	reqCtx, cancel := context.WithCancel(ctx)
	defer cancel()
	cfg := testConfig(t, map[string]string{"SHOP_REDIS_ADDR": testenv.RedisAddr(t), "SHOP_REDIS_PREFIX": redisPrefix(t)})
	rdb, products := testCache(t, cfg, catalog)
	if _, err := products.Reset(ctx); err != nil { // the filter of products 1..3
		t.Fatal(err)
	}
	if _, err := products.Product(ctx, 9); !errors.Is(err, stock.ErrNotFound) {
		t.Fatalf("product 9 before the seed: %v, want not found", err)
	}

	seeder := newSeeder(cancelAfterSeed{catalog, cancel}, products, notify.New(rdb, cfg.Redis.Prefix), slog.New(slog.DiscardHandler))
	warnings, err := seeder.Seed(reqCtx, 10, 1, stock.Window{})
	if err != nil || len(warnings) != 0 {
		t.Errorf("seed whose client left after the commit: %q, %v; want no warning", warnings, err)
	}
	if p, err := products.Product(ctx, 9); err != nil || p.ID != 9 {
		t.Errorf("product 9 after the seed: %+v, %v; the Bloom filter was not rebuilt", p, err)
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
