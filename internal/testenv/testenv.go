// Package testenv gives tests their own database and Redis key space on the
// real MariaDB and Redis that `make test` starts. It is imported by tests
// only.
package testenv

import (
	"context"
	"crypto/rand"
	"database/sql"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"shop/internal/mysqldb"
	"shop/migrations"
)

const (
	// MySQLEnv names the DSN of the test server, without a database.
	MySQLEnv = "SHOP_TEST_MYSQL_DSN"
	// MySQLAutoinc2Env names a second test server, started with
	// innodb_autoinc_lock_mode=2 (MySQL 8's default), where the ids of one
	// multi-row INSERT may interleave with another's.
	MySQLAutoinc2Env = "SHOP_TEST_MYSQL_AUTOINC2_DSN"
	// RedisEnv names the address of the test Redis.
	RedisEnv = "SHOP_TEST_REDIS_ADDR"
	// RedisServerEnv names the redis-server binary for tests that start
	// their own; default: redis-server on PATH.
	RedisServerEnv = "SHOP_TEST_REDIS_SERVER"
)

// lookup returns the variable, failing the test when it is missing: a
// missing server must break the run, not pass it silently. Only -short runs
// may go without.
func lookup(tb testing.TB, name string) string {
	tb.Helper()
	v := os.Getenv(name)
	if v == "" {
		if testing.Short() {
			tb.Skipf("%s is not set; -short runs skip tests that need servers", name)
		}
		tb.Fatalf("%s is not set: run `make test`, which starts private MariaDB and Redis", name)
	}
	return v
}

// Name returns a fresh name for a database or key prefix.
func Name() string { return strings.ToLower(rand.Text()[:12]) }

// DB is a private, migrated database on the test server.
type DB struct {
	// DSN opens the database; every Open is a separate pool, like a
	// separate replica.
	DSN string
	// Gorm is a pool on it.
	Gorm *gorm.DB
}

// MySQL creates a database with the schema of migrations/, dropped when the
// test ends.
func MySQL(tb testing.TB) *DB {
	tb.Helper()
	return MySQLFrom(tb, MySQLEnv)
}

// MySQLFrom is MySQL on the server that the variable env names.
func MySQLFrom(tb testing.TB, env string) *DB {
	tb.Helper()
	return newDatabase(tb, env, migrations.Up)
}

// EmptyMySQL is MySQL without a schema: for tests of the migrations
// themselves, which apply them step by step.
func EmptyMySQL(tb testing.TB) *DB {
	tb.Helper()
	return newDatabase(tb, MySQLEnv, func(context.Context, *sql.DB) error { return nil })
}

// newDatabase creates a database on the server that the variable env
// names, dropped when the test ends, and gives it its schema with migrate.
func newDatabase(tb testing.TB, env string, migrate func(context.Context, *sql.DB) error) *DB {
	tb.Helper()
	base := lookup(tb, env)
	cfg, err := mysql.ParseDSN(base)
	if err != nil {
		tb.Fatalf("%s: %v", env, err)
	}
	cfg.DBName = ""
	cfg.ParseTime = true
	admin, err := sql.Open("mysql", cfg.FormatDSN())
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { admin.Close() })
	name := "shop_test_" + Name()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		tb.Fatalf("create database: %v", err)
	}
	tb.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := admin.ExecContext(ctx, "DROP DATABASE "+name); err != nil {
			tb.Errorf("drop database: %v", err)
		}
	})

	cfg.DBName = name
	db := &DB{DSN: cfg.FormatDSN()}
	db.Gorm = db.Open(tb)
	sqlDB, err := db.Gorm.DB()
	if err != nil {
		tb.Fatal(err)
	}
	if err := migrate(ctx, sqlDB); err != nil {
		tb.Fatal(err)
	}
	return db
}

// Open returns a new pool on the database as a replica's orders' pool is
// (mysqldb.OpenOrders), closed when the test ends.
func (d *DB) Open(tb testing.TB) *gorm.DB {
	tb.Helper()
	return d.OpenOrders(tb, 20)
}

// OpenOrders is Open with a pool of n connections.
func (d *DB) OpenOrders(tb testing.TB, n int) *gorm.DB {
	tb.Helper()
	g, err := mysqldb.OpenOrders(d.DSN, n)
	return closedAtEnd(tb, g, err)
}

// OpenReads returns a new pool of n connections on the database as a
// replica's reads' pool is (mysqldb.Open), closed when the test ends.
func (d *DB) OpenReads(tb testing.TB, n int) *gorm.DB {
	tb.Helper()
	g, err := mysqldb.Open(d.DSN, n)
	return closedAtEnd(tb, g, err)
}

// closedAtEnd fails tb on an error opening a pool, and closes the pool when
// the test ends.
func closedAtEnd(tb testing.TB, g *gorm.DB, err error) *gorm.DB {
	tb.Helper()
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() {
		if sqlDB, err := g.DB(); err == nil {
			sqlDB.Close()
		}
	})
	return g
}

// Redis returns a client of the test Redis and a key prefix of the test's
// own; keys under the prefix are deleted when the test ends.
func Redis(tb testing.TB) (*redis.Client, string) {
	tb.Helper()
	c := RedisAt(tb, lookup(tb, RedisEnv))
	prefix := "test:" + Name() + ":"
	tb.Cleanup(func() { deleteKeys(tb, c, prefix) })
	return c, prefix
}

// RedisAt returns a client of the Redis at addr, closed when the test ends.
func RedisAt(tb testing.TB, addr string) *redis.Client {
	tb.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr, PoolSize: 200})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		tb.Fatalf("redis at %s: %v", addr, err)
	}
	tb.Cleanup(func() { c.Close() })
	return c
}

// RedisAddr is the address of the test Redis.
func RedisAddr(tb testing.TB) string {
	tb.Helper()
	return lookup(tb, RedisEnv)
}

// RedisServer starts a private redis-server, for a test that stops Redis
// under a running service. It returns the server's address and a function
// that kills it; the server is killed when the test ends in any case.
func RedisServer(tb testing.TB) (addr string, kill func()) {
	tb.Helper()
	p := StartRedis(tb)
	return p.Addr, p.Kill
}

// RedisProc is a private redis-server process that a test can kill, pause
// and restart.
type RedisProc struct {
	// Addr is where it listens, the same across restarts.
	Addr string

	tb   testing.TB
	bin  string
	port string
	args []string
	proc
}

// StartRedis starts a private redis-server without persistence on a free
// loopback port, with args added to its command line (each restart too);
// it is killed when the test ends, and dies with the test binary if that
// ends first (a panic, a -timeout, os.Exit).
func StartRedis(tb testing.TB, args ...string) *RedisProc {
	tb.Helper()
	lookup(tb, RedisEnv) // the same rule as every test that needs servers
	bin := os.Getenv(RedisServerEnv)
	if bin == "" {
		var err error
		if bin, err = exec.LookPath("redis-server"); err != nil {
			tb.Fatalf("redis-server: %v (set %s)", err, RedisServerEnv)
		}
	}
	port := freePort(tb)
	p := &RedisProc{Addr: "127.0.0.1:" + port, tb: tb, bin: bin, port: port, args: args}
	tb.Cleanup(p.Kill)
	p.Restart()
	return p
}

// Restart starts the server again after Kill: empty, as a Redis without
// persistence comes back after a crash. It waits until the server answers.
func (p *RedisProc) Restart() {
	p.tb.Helper()
	args := append([]string{"--port", p.port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", p.tb.TempDir()}, p.args...)
	if _, err := p.start(exec.Command(p.bin, args...)); err != nil {
		p.tb.Fatalf("start redis-server on %s: %v", p.Addr, err)
	}
	c := redis.NewClient(&redis.Options{Addr: p.Addr})
	defer c.Close()
	for deadline := time.Now().Add(10 * time.Second); c.Ping(context.Background()).Err() != nil; {
		if time.Now().After(deadline) {
			p.tb.Fatalf("redis-server on %s did not answer", p.Addr)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Kill stops the server at once (SIGKILL), losing everything it held.
func (p *RedisProc) Kill() { p.kill() }

// Pid is the server's process id, 0 while it is stopped.
func (p *RedisProc) Pid() int { return p.pid() }

// startTied starts cmd so that it cannot outlive the test binary, and
// returns a channel closed once cmd has exited and been waited for. A test
// that panics or times out ends the binary without running its cleanups,
// which would leave the process running for good. Where the system can (see
// tie), the kernel kills the child when the thread that started it ends: a
// goroutine locked to its OS thread starts cmd and then waits for it, so
// that thread lives exactly as long as the child needs it — the runtime
// never ends or hands over a thread while a goroutine is locked to it —
// and ends only with the whole process.
func startTied(cmd *exec.Cmd) (<-chan struct{}, error) {
	tie(cmd)
	started := make(chan error)
	exited := make(chan struct{})
	go func() {
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		if err := cmd.Start(); err != nil {
			started <- err
			return
		}
		started <- nil
		cmd.Wait()
		close(exited)
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return exited, nil
}

// Pause freezes the server (SIGSTOP): connections stay open and commands
// go unanswered, as on a hung or partitioned node. Resume undoes it.
func (p *RedisProc) Pause() { p.signal(syscall.SIGSTOP) }

// Resume lets a paused server run again.
func (p *RedisProc) Resume() { p.signal(syscall.SIGCONT) }

// Log is a log destination that a test reads while the code under test
// writes to it from any goroutine.
type Log struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (l *Log) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

// String returns everything written so far.
func (l *Log) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}
