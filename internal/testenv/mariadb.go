package testenv

import (
	"context"
	"database/sql"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"

	"shop/migrations"
)

const (
	// MariaDBServerEnv names the mariadbd binary for tests that start their
	// own MariaDB; default: mariadbd or mysqld on PATH or in an sbin.
	MariaDBServerEnv = "SHOP_TEST_MARIADBD"
	// MariaDBInstallEnv names its mariadb-install-db; default:
	// mariadb-install-db or mysql_install_db, found alike.
	MariaDBInstallEnv = "SHOP_TEST_MARIADB_INSTALL_DB"
)

// MariaDBProc is a private MariaDB server process that a test can stop,
// kill and start again on the same data and port: for a test that restarts
// the server under a running client (the shared server of MySQLEnv must
// not be).
type MariaDBProc struct {
	// Addr is where it listens, the same across restarts.
	Addr string

	tb   testing.TB
	bin  string
	dir  string
	port string
	args []string
	proc
}

// StartMariaDB creates a data directory in a temporary directory of the
// test (mariadb-install-db, as scripts/lib.sh's start_mariadb does) and
// starts mariadbd on it on a free loopback port, with args added to its
// command line (each restart too). It is small (a 32 MB buffer pool) and
// commits durably (innodb_flush_log_at_trx_commit=1): what was committed
// before a Kill is there after the Restart. It is killed when the test
// ends, and dies with the test binary if that ends first.
func StartMariaDB(tb testing.TB, args ...string) *MariaDBProc {
	tb.Helper()
	lookup(tb, MySQLEnv) // the same rule as every test that needs servers
	bin := findBin(tb, MariaDBServerEnv, "mariadbd", "mysqld")
	install := findBin(tb, MariaDBInstallEnv, "mariadb-install-db", "mysql_install_db")
	dir := tb.TempDir()
	var user []string
	if os.Getuid() == 0 {
		user = []string{"--user=root"}
	}
	cmd := exec.Command(install, append([]string{"--no-defaults", "--datadir=" + filepath.Join(dir, "data"),
		"--auth-root-authentication-method=normal", "--skip-test-db", "--innodb-log-file-size=16M"}, user...)...)
	if out, err := cmd.CombinedOutput(); err != nil {
		tb.Fatalf("%s: %v\n%s", install, err, out)
	}
	port := freePort(tb)
	p := &MariaDBProc{Addr: "127.0.0.1:" + port, tb: tb, bin: bin, dir: dir, port: port,
		args: append(user, args...)}
	tb.Cleanup(p.Kill)
	p.Restart()
	return p
}

// findBin returns the binary that env names, or else the first of names on
// PATH or in the usual sbin directories, where distributions put servers.
func findBin(tb testing.TB, env string, names ...string) string {
	tb.Helper()
	bin, err := whichBin(env, names...)
	if err != nil {
		tb.Fatal(err)
	}
	return bin
}

// whichBin is findBin's search, with an error for a binary not found.
func whichBin(env string, names ...string) (string, error) {
	if bin := os.Getenv(env); bin != "" {
		return bin, nil
	}
	for _, name := range names {
		if bin, err := exec.LookPath(name); err == nil {
			return bin, nil
		}
		for _, dir := range []string{"/usr/sbin", "/usr/local/sbin", "/sbin", "/opt/homebrew/bin", "/opt/homebrew/sbin"} {
			if bin := filepath.Join(dir, name); isExecutable(bin) {
				return bin, nil
			}
		}
	}
	return "", fmt.Errorf("%s not found (set %s)", strings.Join(names, " or "), env)
}

func isExecutable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && !fi.IsDir() && fi.Mode()&0o111 != 0
}

// DSN returns a DSN of the server's root user for database db ("" for
// none), with parseTime, as MySQLEnv's.
func (p *MariaDBProc) DSN(db string) string {
	cfg := mysql.NewConfig()
	cfg.User = "root"
	cfg.Net = "tcp"
	cfg.Addr = p.Addr
	cfg.DBName = db
	cfg.ParseTime = true
	return cfg.FormatDSN()
}

// Database creates a database with the schema of migrations/ on the server
// and returns its DSN. It is not dropped: it goes with the server.
func (p *MariaDBProc) Database(tb testing.TB) string {
	tb.Helper()
	return createDatabase(tb, p.DSN)
}

// createDatabase creates a database with the schema of migrations/ on the
// server whose DSNs dsn gives, and returns its DSN.
func createDatabase(tb testing.TB, dsn func(db string) string) string {
	tb.Helper()
	admin, err := sql.Open("mysql", dsn(""))
	if err != nil {
		tb.Fatal(err)
	}
	defer admin.Close()
	name := "shop_test_" + Name()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := admin.ExecContext(ctx, "CREATE DATABASE "+name); err != nil {
		tb.Fatalf("create database: %v", err)
	}
	db, err := sql.Open("mysql", dsn(name))
	if err != nil {
		tb.Fatal(err)
	}
	defer db.Close()
	if err := migrations.Up(ctx, db); err != nil {
		tb.Fatal(err)
	}
	return dsn(name)
}

// Restart starts the server again after Stop or Kill, on the same data and
// port; StartMariaDB starts it the first time. It waits until the server
// answers.
func (p *MariaDBProc) Restart() {
	p.tb.Helper()
	args := append([]string{"--no-defaults", "--datadir=" + filepath.Join(p.dir, "data"),
		"--bind-address=127.0.0.1", "--port=" + p.port, "--socket=" + filepath.Join(p.dir, "mysqld.sock"),
		"--pid-file=" + filepath.Join(p.dir, "mysqld.pid"), "--log-error=" + filepath.Join(p.dir, "mysqld.log"),
		"--skip-log-bin", "--skip-name-resolve", "--max-connections=200", "--innodb-buffer-pool-size=32M",
		"--innodb-log-file-size=16M", "--innodb-flush-log-at-trx-commit=1"}, p.args...)
	exited, err := p.start(exec.Command(p.bin, args...))
	if err != nil {
		p.tb.Fatalf("start mariadbd on %s: %v", p.Addr, err)
	}
	db, err := sql.Open("mysql", p.DSN(""))
	if err != nil {
		p.tb.Fatal(err)
	}
	defer db.Close()
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		err := db.PingContext(ctx)
		cancel()
		if err == nil {
			return
		}
		select {
		case <-exited:
			p.tb.Fatalf("mariadbd on %s exited at start: %v\n%s", p.Addr, err, p.logTail())
		default:
		}
		if time.Now().After(deadline) {
			p.tb.Fatalf("mariadbd on %s did not answer: %v\n%s", p.Addr, err, p.logTail())
		}
	}
}

// logTail returns the end of the server's error log.
func (p *MariaDBProc) logTail() string {
	b, _ := os.ReadFile(filepath.Join(p.dir, "mysqld.log"))
	if len(b) > 4000 {
		b = b[len(b)-4000:]
	}
	return string(b)
}

// Stop shuts the server down cleanly (SIGTERM) and waits until it has
// exited; its connections are closed.
func (p *MariaDBProc) Stop() { p.end(syscall.SIGTERM, time.Minute) }

// Kill stops the server at once (SIGKILL), as a crash does: what it had
// committed is on disk, and InnoDB recovers it at the next start.
func (p *MariaDBProc) Kill() { p.kill() }

// Pid is the server's process id, 0 while it is stopped.
func (p *MariaDBProc) Pid() int { return p.pid() }
