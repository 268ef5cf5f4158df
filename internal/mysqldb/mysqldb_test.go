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
