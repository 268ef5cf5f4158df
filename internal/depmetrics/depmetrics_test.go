package depmetrics_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"shop/internal/depmetrics"
	"shop/internal/lock"
	"shop/internal/mysqldb"
	"shop/internal/testenv"
)

// counted returns shop_dependency_errors_total{dependency=dep} as reg
// exports it.
func counted(t *testing.T, reg *prometheus.Registry, dep string) float64 {
	t.Helper()
	families, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range families {
		if f.GetName() != "shop_dependency_errors_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "dependency" && l.GetValue() == dep {
					return m.GetCounter().GetValue()
				}
			}
		}
	}
	t.Fatalf("no shop_dependency_errors_total{dependency=%q} exported", dep)
	return 0
}

// wantCounted fails unless dep's count is want, saying after what.
func wantCounted(t *testing.T, reg *prometheus.Registry, dep string, want float64, after string) {
	t.Helper()
	if got := counted(t, reg, dep); got != want {
		t.Fatalf("after %s: %s errors counted %v; want %v", after, dep, got, want)
	}
}

func ctx(t *testing.T) context.Context {
	t.Helper()
	c, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	t.Cleanup(cancel)
	return c
}

// watchedRedis starts a Redis of the test's own and returns it, a client
// of it whose errors go to a new registry, and the registry.
func watchedRedis(t *testing.T) (*redis.Client, *testenv.RedisProc, *prometheus.Registry) {
	t.Helper()
	reg := prometheus.NewRegistry()
	proc := testenv.StartRedis(t)
	c := redis.NewClient(&redis.Options{Addr: proc.Addr, MaxRetries: -1})
	t.Cleanup(func() { c.Close() })
	c.AddHook(depmetrics.New(reg).RedisHook())
	return c, proc, reg
}

// The normal outcomes of Redis commands are not errors: a missing key, in a
// command or a pipeline, a script not cached yet (go-redis's EVALSHA, then
// EVAL), the lock's "not obtained", and a call whose caller gave up.
func TestRedisOutcomesNotCounted(t *testing.T) {
	ctx := ctx(t)
	c, _, reg := watchedRedis(t)

	if err := c.Get(ctx, "missing").Err(); !errors.Is(err, redis.Nil) {
		t.Fatalf("GET of a missing key: %v; want redis.Nil", err)
	}
	if _, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, "k", "v", time.Minute)
		p.Get(ctx, "missing")
		return nil
	}); !errors.Is(err, redis.Nil) {
		t.Fatalf("pipeline with a missing key: %v; want redis.Nil", err)
	}
	if err := c.ScriptFlush(ctx).Err(); err != nil {
		t.Fatal(err)
	}
	locks := lock.NewRedis(c, lock.RedisOptions{Prefix: "depmetrics:", TTL: 5 * time.Second, Wait: 100 * time.Millisecond})
	t.Cleanup(func() { locks.Close() })
	lease, err := locks.TryObtain(ctx, "sku")
	if err != nil {
		t.Fatalf("first obtain, its script not cached: %v", err)
	}
	if _, err := locks.TryObtain(ctx, "sku"); !errors.Is(err, lock.ErrNotObtained) {
		t.Fatalf("second obtain: %v; want %v", err, lock.ErrNotObtained)
	}
	if _, err := locks.Obtain(ctx, "sku"); !errors.Is(err, lock.ErrNotObtained) {
		t.Fatalf("waiting obtain: %v; want %v", err, lock.ErrNotObtained)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}
	gone, cancel := context.WithCancel(ctx)
	cancel()
	if err := c.Get(gone, "k").Err(); err == nil {
		t.Fatal("GET on a cancelled context succeeded")
	}
	wantCounted(t, reg, depmetrics.Redis, 0, "a missing key, a script not cached, a lock not obtained and a cancelled call")
	if n := counted(t, reg, depmetrics.MySQL); n != 0 {
		t.Fatalf("mysql errors %v; want 0, no MySQL was asked", n)
	}
}

// A Redis error counts: an error reply, a command on a dead server, and a
// pipeline on it (once, not once per command).
func TestRedisFailuresCounted(t *testing.T) {
	ctx := ctx(t)
	c, proc, reg := watchedRedis(t)

	if err := c.Set(ctx, "k", "v", 0).Err(); err != nil {
		t.Fatal(err)
	}
	if err := c.Incr(ctx, "k").Err(); err == nil {
		t.Fatal("INCR of a string succeeded")
	}
	wantCounted(t, reg, depmetrics.Redis, 1, "an error reply")

	proc.Kill()
	if err := c.Get(ctx, "k").Err(); err == nil || errors.Is(err, redis.Nil) {
		t.Fatalf("GET on a killed Redis: %v; want a failure", err)
	}
	wantCounted(t, reg, depmetrics.Redis, 2, "a GET on a killed Redis")
	if _, err := c.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Get(ctx, "a")
		p.Get(ctx, "b")
		p.Get(ctx, "c")
		return nil
	}); err == nil {
		t.Fatal("pipeline on a killed Redis succeeded")
	}
	wantCounted(t, reg, depmetrics.Redis, 3, "a pipeline of three on a killed Redis")
}

// watchedDB is a new pool on the database at dsn whose errors go to a new
// registry, and the registry.
func watchedDB(t *testing.T, dsn string) (*gorm.DB, *prometheus.Registry) {
	t.Helper()
	g, err := mysqldb.Open(dsn, 4)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if sqlDB, err := g.DB(); err == nil {
			sqlDB.Close()
		}
	})
	reg := prometheus.NewRegistry()
	if err := depmetrics.New(reg).WatchGorm(g); err != nil {
		t.Fatal(err)
	}
	return g, reg
}

// The normal outcomes of MySQL statements are not errors: a committed
// transaction, a row not found, a duplicate key (an order placed twice),
// a call whose caller gave up.
func TestMySQLOutcomesNotCounted(t *testing.T) {
	ctx := ctx(t)
	tdb := testenv.MySQL(t)
	db, reg := watchedDB(t, tdb.DSN)
	db = db.WithContext(ctx)

	err := db.Transaction(func(tx *gorm.DB) error {
		if err := tx.Exec("INSERT INTO products (id, name, price_cents, initial_stock, stock) VALUES (1, 'p', 100, 5, 5)").Error; err != nil {
			return err
		}
		return tx.Exec("INSERT INTO orders (sku_id, user_id) VALUES (1, 7)").Error
	})
	if err != nil {
		t.Fatal(err)
	}
	var n int
	if err := db.Raw("SELECT COUNT(*) FROM orders").Row().Scan(&n); err != nil || n != 1 {
		t.Fatalf("orders: %d, %v; want the transaction's one", n, err)
	}
	var me *mysql.MySQLError
	if err := db.Exec("INSERT INTO orders (sku_id, user_id) VALUES (1, 7)").Error; !errors.As(err, &me) || me.Number != 1062 {
		t.Fatalf("second order of user 7: %v; want a duplicate key", err)
	}
	var row struct{ Stock int }
	if err := db.Table("products").Where("id = ?", 2).Take(&row).Error; !errors.Is(err, gorm.ErrRecordNotFound) {
		t.Fatalf("product 2: %v; want %v", err, gorm.ErrRecordNotFound)
	}
	gone, cancel := context.WithCancel(ctx)
	cancel()
	if err := db.WithContext(gone).Exec("UPDATE products SET stock = 4 WHERE id = 1").Error; err == nil {
		t.Fatal("UPDATE on a cancelled context succeeded")
	}
	if err := db.WithContext(gone).Transaction(func(tx *gorm.DB) error { return nil }); err == nil {
		t.Fatal("BEGIN on a cancelled context succeeded")
	}
	wantCounted(t, reg, depmetrics.MySQL, 0, "a commit, a duplicate key, a row not found and cancelled calls")
}

// A MySQL error counts: bad SQL, a statement on a connection the server
// killed, and a COMMIT whose reply was lost, which gorm's statement
// callbacks never see.
func TestMySQLFailuresCounted(t *testing.T) {
	ctx := ctx(t)
	tdb := testenv.MySQL(t)
	db, reg := watchedDB(t, tdb.DSN)
	db = db.WithContext(ctx)

	if err := db.Exec("SELEC 1").Error; err == nil {
		t.Fatal("bad SQL succeeded")
	}
	wantCounted(t, reg, depmetrics.MySQL, 1, "bad SQL")

	err := db.Transaction(func(tx *gorm.DB) error {
		var id int64
		if err := tx.Raw("SELECT CONNECTION_ID()").Row().Scan(&id); err != nil {
			return err
		}
		if err := tdb.Gorm.WithContext(ctx).Exec("KILL ?", id).Error; err != nil {
			t.Fatalf("KILL %d: %v", id, err)
		}
		return tx.Exec("INSERT INTO products (id, name, price_cents, initial_stock, stock) VALUES (3, 'p', 100, 5, 5)").Error
	})
	if err == nil {
		t.Fatal("a statement on a killed connection succeeded")
	}
	wantCounted(t, reg, depmetrics.MySQL, 2, "a statement on a killed connection")

	cfg, err := mysql.ParseDSN(tdb.DSN)
	if err != nil {
		t.Fatal(err)
	}
	proxy := testenv.StartProxy(t, cfg.Addr)
	cfg.Addr = proxy.Addr
	viaProxy, reg := watchedDB(t, cfg.FormatDSN())
	cut := proxy.CutReply(testenv.MySQLQuery("COMMIT"))
	err = viaProxy.WithContext(ctx).Transaction(func(tx *gorm.DB) error {
		return tx.Exec("INSERT INTO products (id, name, price_cents, initial_stock, stock) VALUES (4, 'p', 100, 5, 5)").Error
	})
	<-cut
	if err == nil {
		t.Fatal("a COMMIT whose reply was lost succeeded")
	}
	var n int
	if err := tdb.Gorm.WithContext(ctx).Raw("SELECT COUNT(*) FROM products WHERE id = 4").Row().Scan(&n); err != nil || n != 1 {
		t.Fatalf("product 4: %d rows, %v; want the committed one", n, err)
	}
	wantCounted(t, reg, depmetrics.MySQL, 1, "a COMMIT whose reply was lost")
}
