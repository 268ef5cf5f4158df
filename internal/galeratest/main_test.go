// Package galeratest runs the service's MySQL work on a three-node Galera
// cluster behind HAProxy, one cluster for the package's tests: the seeds'
// lock, Galera's errors, and the sweep through a writer's death.
package galeratest

import (
	"context"
	"database/sql"
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

// galera is the package's cluster.
func galera(t *testing.T) *testenv.GaleraCluster {
	t.Helper()
	return cluster.Get(t, testenv.StartGalera)
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
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := admin.ExecContext(ctx, "DROP DATABASE "+name); err != nil {
			t.Errorf("drop database: %v", err)
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
