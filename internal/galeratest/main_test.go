// Package galeratest runs the service's MySQL work on a three-node Galera
// cluster behind HAProxy, one cluster for the package's tests: the seeds'
// lock, Galera's errors, and the sweep through a writer's death.
package galeratest

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"gorm.io/gorm"

	"shop/internal/mysqldb"
	"shop/internal/testenv"
	"shop/migrations"
)

// cluster is the package's cluster, started by the first test that asks.
var cluster testenv.Shared[*testenv.GaleraCluster]

func TestMain(m *testing.M) {
	code := m.Run()
	cluster.Close()
	os.Exit(code)
}

// galera is the package's cluster, for t: its faults report to t, and it
// is brought back whole (every node Synced, HAProxy sending to node 0) when
// t ends. The tests that use it do not run in parallel.
func galera(t *testing.T) *testenv.GaleraCluster {
	t.Helper()
	return cluster.Get(t, func(tb testing.TB) *testenv.GaleraCluster {
		return testenv.StartGalera(tb, testenv.OnTmpfs())
	}).For(t)
}

// database creates a database with the schema of migrations/ on the
// cluster, dropped when the test ends, and returns its name.
func database(t *testing.T, c *testenv.GaleraCluster) string {
	t.Helper()
	admin, err := sql.Open("mysql", c.DSN(""))
	if err != nil {
		t.Fatal(err)
	}
	defer admin.Close()
	name := "shop_galera_" + testenv.Name()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		t.Fatalf("create database: %v", err)
	}
	t.Cleanup(func() {
		admin, err := sql.Open("mysql", c.DSN(""))
		if err != nil {
			t.Error(err)
			return
		}
		defer admin.Close()
		// HAProxy cuts the connections to a backup when the writer it
		// stands in for comes back (shutdown-backup-sessions), as it may
		// just after a test that stopped one: again, then.
		for attempt := 1; ; attempt++ {
			ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
			_, err := admin.ExecContext(ctx, "DROP DATABASE IF EXISTS "+name)
			cancel()
			if err == nil {
				return
			}
			if !mysqldb.Transient(err) || attempt == 5 {
				t.Errorf("drop database: %v", err)
				return
			}
			time.Sleep(500 * time.Millisecond)
		}
	})
	db, err := sql.Open("mysql", c.DSN(name))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	if err := migrations.Up(ctx, db); err != nil {
		t.Fatal(err)
	}
	return name
}

// waitWriter waits until HAProxy sends new connections to node n or, when
// to is false, to any other. A test that stopped the writer waits for it
// to be the writer again before it ends: HAProxy fails back then, cutting
// the connections to the node that stood in, and the next test starts
// after that.
func waitWriter(t *testing.T, c *testenv.GaleraCluster, n int, to bool) {
	t.Helper()
	db, err := sql.Open("mysql", c.DSN(""))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	// A new connection for each look: the proxy decides per connection.
	db.SetMaxIdleConns(0)
	waitUntil(t, 60*time.Second, fmt.Sprintf("HAProxy to send to node %d: %v", n, to), func() error {
		var node string
		if err := db.QueryRow("SELECT @@wsrep_node_name").Scan(&node); err != nil {
			return err
		}
		if (node == fmt.Sprintf("n%d", n)) != to {
			return fmt.Errorf("on %s", node)
		}
		return nil
	})
}

// synced is dsn with every read made once the node has applied what the
// cluster committed before it (wsrep_sync_wait=1): a check's reads, never
// the service's.
func synced(t *testing.T, dsn string) string {
	t.Helper()
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Params == nil {
		cfg.Params = map[string]string{}
	}
	cfg.Params["wsrep_sync_wait"] = "1"
	return cfg.FormatDSN()
}

// pool is a pool on dsn as a replica's reads' pool is, closed when the
// test ends.
func pool(t *testing.T, dsn string) *gorm.DB {
	t.Helper()
	db, err := mysqldb.Open(dsn, 4)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if sqlDB, err := db.DB(); err == nil {
			sqlDB.Close()
		}
	})
	return db
}
