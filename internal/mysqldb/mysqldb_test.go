package mysqldb

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/go-sql-driver/mysql"
)

// Which failures are outages (the work may be retried) and which are not.
func TestTransient(t *testing.T) {
	refused := &net.OpError{Op: "dial", Net: "tcp", Err: &net.AddrError{Err: "connection refused"}}
	tests := []struct {
		name string
		err  error
		busy bool // an outage: the work may be retried
	}{
		{"1040 too many connections", &mysql.MySQLError{Number: 1040}, true},
		{"1047 Galera node not in the Primary component", &mysql.MySQLError{Number: 1047, SQLState: [5]byte{'0', '8', 'S', '0', '1'},
			Message: "WSREP has not yet prepared node for application use"}, true},
		{"1180 Galera replication failed, cut off", &mysql.MySQLError{Number: 1180,
			Message: "Error while appending streaming replication fragment(provider status: Not connected to Primary Component)"}, true},
		{"1213 Galera certification failure", &mysql.MySQLError{Number: 1213, SQLState: [5]byte{'4', '0', '0', '0', '1'},
			Message: "Deadlock found when trying to get lock; try restarting transaction"}, true},
		{"1053 server shutdown (MySQL: connection killed)", &mysql.MySQLError{Number: 1053}, true},
		{"1205 lock wait timeout", &mysql.MySQLError{Number: 1205}, true},
		{"1213 deadlock", &mysql.MySQLError{Number: 1213}, true},
		{"1020 record changed since last read (snapshot isolation)", &mysql.MySQLError{Number: 1020}, true},
		{"1290 read-only", &mysql.MySQLError{Number: 1290, Message: "The MariaDB server is running with the --read-only option so it cannot execute this statement"}, true},
		{"1317 query interrupted", &mysql.MySQLError{Number: 1317}, true},
		{"1927 connection killed", &mysql.MySQLError{Number: 1927, Message: "Connection was killed"}, true},
		{"1969 max_statement_time", &mysql.MySQLError{Number: 1969}, true},
		{"3024 max_execution_time", &mysql.MySQLError{Number: 3024}, true},
		{"4031 disconnected for inactivity", &mysql.MySQLError{Number: 4031}, true},
		{"1053 wrapped", fmt.Errorf("begin: %w", &mysql.MySQLError{Number: 1053}), true},
		{"bad connection", driver.ErrBadConn, true},
		{"invalid connection", mysql.ErrInvalidConn, true},
		{"EOF", io.EOF, true},
		{"unexpected EOF", io.ErrUnexpectedEOF, true},
		{"dial refused", refused, true},
		{"reset", &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, true},
		{"deadline", context.DeadlineExceeded, true},
		{"canceled", context.Canceled, false},
		{"1062 duplicate", &mysql.MySQLError{Number: 1062}, false},
		{"1146 no such table", &mysql.MySQLError{Number: 1146}, false},
		{"1064 syntax", &mysql.MySQLError{Number: 1064}, false},
		{"something else", errors.New("boom"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := Transient(tt.err); got != tt.busy {
				t.Errorf("Transient(%v) = %v, want %v", tt.err, got, tt.busy)
			}
		})
	}
}

// A lost connection is told apart from MySQL's answers and from a context's
// end, which database/sql checks before it sends a COMMIT.
func TestConnLost(t *testing.T) {
	tests := []struct {
		err  error
		lost bool
	}{
		{driver.ErrBadConn, true},
		{mysql.ErrInvalidConn, true},
		{fmt.Errorf("commit: %w", mysql.ErrInvalidConn), true},
		{io.EOF, true},
		{io.ErrUnexpectedEOF, true},
		{&net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}, true},
		{&mysql.MySQLError{Number: 1213}, false},
		{&mysql.MySQLError{Number: 1927}, false},
		{context.Canceled, false},
		{context.DeadlineExceeded, false},
		{errors.New("boom"), false},
	}
	for _, tt := range tests {
		if got := ConnLost(tt.err); got != tt.lost {
			t.Errorf("ConnLost(%v) = %v, want %v", tt.err, got, tt.lost)
		}
		// A statement the driver never sent (ErrBadConn) did not run.
		want := tt.lost && !errors.Is(tt.err, driver.ErrBadConn)
		if got := ReplyLost(tt.err); got != want {
			t.Errorf("ReplyLost(%v) = %v, want %v", tt.err, got, want)
		}
	}
}

// Every pool dials within DialTimeout and probes idle connections unless the
// DSN says otherwise, and IOTimeout sets the reads' and writes' bound only
// where the DSN sets none.
func TestConfigTimeouts(t *testing.T) {
	cfg, err := config("root@tcp(127.0.0.1:3306)/shop", options([]Option{IOTimeout(7 * time.Second)}))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Timeout != DialTimeout || cfg.ReadTimeout != 7*time.Second || cfg.WriteTimeout != 7*time.Second || cfg.DialFunc == nil {
		t.Errorf("no timeouts in the DSN: dial %s, read %s, write %s, dial func set %v; want %s, 7s, 7s, set",
			cfg.Timeout, cfg.ReadTimeout, cfg.WriteTimeout, cfg.DialFunc != nil, DialTimeout)
	}
	cfg, err = config("root@tcp(127.0.0.1:3306)/shop?timeout=2s&readTimeout=30s&writeTimeout=40s", options([]Option{IOTimeout(7 * time.Second)}))
	if err != nil {
		t.Fatal(err)
	}
	if cfg.Timeout != 2*time.Second || cfg.ReadTimeout != 30*time.Second || cfg.WriteTimeout != 40*time.Second {
		t.Errorf("the DSN's timeouts: dial %s, read %s, write %s; want the DSN's 2s, 30s, 40s", cfg.Timeout, cfg.ReadTimeout, cfg.WriteTimeout)
	}
	cfg, err = config("root@tcp(127.0.0.1:3306)/shop", nil)
	if err != nil {
		t.Fatal(err)
	}
	if cfg.ReadTimeout != 0 || cfg.WriteTimeout != 0 {
		t.Errorf("a pool without IOTimeout: read %s, write %s; want none", cfg.ReadTimeout, cfg.WriteTimeout)
	}
}

// Which servers take INSERT … RETURNING, by their VERSION().
func TestReturningIn(t *testing.T) {
	for version, want := range map[string]bool{
		"10.11.19-MariaDB-0+deb12u1": true,
		"11.4.2-MariaDB":             true,
		"10.5.0-MariaDB":             true,
		"10.4.34-MariaDB":            false,
		"8.4.3":                      false,
		"8.0.36-0ubuntu0.22.04.1":    false,
		"MariaDB":                    false,
	} {
		if got := returningIn(version); got != want {
			t.Errorf("%q: %v, want %v", version, got, want)
		}
	}
}
