package lock

import (
	"context"
	"crypto/rand"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"math"
	"net"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"shop/internal/mysqldb"
)

// MySQLOptions configures a MySQL lock. Zero fields take the defaults.
type MySQLOptions struct {
	// Table is the lock table; default "shop_locks", which
	// migrations/00007_lock_table.sql creates. Another table must have its
	// columns. A dotted name is a table in another database.
	Table string
	// TTL is the lease length; default 5s. The watchdog renews at TTL/3.
	TTL time.Duration
	// Wait bounds how long Obtain waits for a held key; default 2s.
	Wait time.Duration
	// MinBackoff and MaxBackoff bound the exponential backoff between tries;
	// defaults 2ms and 100ms.
	MinBackoff, MaxBackoff time.Duration
	// After is the timer the watchdog sleeps on, and waits for a renewal's
	// answer on; default time.After. A test freezes a holder, as a
	// stop-the-world pause would, by handing it a timer that never fires.
	After func(time.Duration) <-chan time.Time
}

func (opt MySQLOptions) withDefaults() MySQLOptions {
	if opt.Table == "" {
		opt.Table = "shop_locks"
	}
	// The lease and the wait take the Redis lock's defaults.
	r := RedisOptions{TTL: opt.TTL, Wait: opt.Wait, MinBackoff: opt.MinBackoff, MaxBackoff: opt.MaxBackoff, After: opt.After}.withDefaults()
	opt.TTL, opt.Wait, opt.MinBackoff, opt.MaxBackoff, opt.After = r.TTL, r.Wait, r.MinBackoff, r.MaxBackoff, r.After
	return opt
}

// maxMySQLKey is the longest key the lock table holds: its name column is
// a VARBINARY(255). A longer key is refused rather than cut, which in a
// server without a strict sql_mode would fold keys that share their first
// 255 bytes into one.
const maxMySQLKey = 255

// mysqlClock is MySQL's clock in microseconds since the Unix epoch, in UTC:
// TIMESTAMPDIFF between two DATETIMEs involves no time zone, and
// UTC_TIMESTAMP(6) does not depend on the session's. It is fixed for the
// length of a statement.
const mysqlClock = "TIMESTAMPDIFF(MICROSECOND, '1970-01-01', UTC_TIMESTAMP(6))"

// MySQL is a lock held as a row of a table in MySQL or MariaDB: the lock
// table of the seeds, with a lease and a fencing token. It is a "CAS spin"
// lock: the server tells no waiter when a key is released, so a waiter
// polls, trying again with exponential backoff and full jitter. The waiters
// of one process queue for a key in process, first come first served, and
// only the first of them polls the server; a holder in this process hands
// the key to the next of them when it has released it.
//
// A key's row holds its holder's random token (owner, empty when free), its
// fencing counter (fence) and when the lease runs out (expires_at). Every
// expiry is judged by MySQL's clock, in UTC, so the clocks of the clients
// and their session time zones do not matter. An attempt is one statement,
// an INSERT … ON DUPLICATE KEY UPDATE that takes the row if it is new, free
// or expired, draws the fencing token, and hands it back through
// LAST_INSERT_ID(expr), which the server returns in its reply to the
// statement; a held row is left as it is, and the reply carries 0. The
// token is max(fence + 1, MySQL's clock in microseconds), as the Redis
// lock's (fence.lua): it is larger for every later holder, and stays above
// every earlier token even if the row is lost, as long as the server's
// clock moves forward. It is also comparable with the Redis lock's tokens,
// so a switch between the two does not strand the rows they fence.
//
// Release is a compare-and-clear on the owner: it frees the row and KEEPS
// it, because the row carries the key's counter. The seeds' DELETE would
// start the counter again, and the next holder's token would be smaller
// than the last one's: every fenced write would be refused. A release that
// finds the lease run out frees the row all the same and reports
// ErrNotHeld. Renewal is a compare-and-extend that also requires the lease
// not to have run out. So a holder whose lease expired can neither free
// nor extend the lock of whoever holds it now. Release and renewal, like
// the attempt, learn whether the caller held the key from the
// LAST_INSERT_ID in the reply, not from the count of affected rows, which
// depends on the client's CLIENT_FOUND_ROWS flag.
//
// An attempt whose reply is lost (the connection failed, the try's context
// ended) may have taken the key, and a grant that arrives after the lease
// it granted ran out is of no use: either way the attempt gives the key
// back at once with a compare-and-clear on its own token. A release whose
// reply is lost is tried again.
type MySQL struct {
	db     *sql.DB
	opt    MySQLOptions
	waiter *waiter

	takeSQL, renewSQL, releaseSQL, raiseSQL, holderSQL string
}

// NewMySQL returns a MySQL lock on the table opt.Table of db.
//
// db must be a pool of the lock's own, never the orders' pool: orders that
// hold connections in long transactions must not hold up a renewal, and
// the lock's statements must commit on their own, so the DSN must leave
// autocommit on (the default). The lock needs no other DSN option: it reads
// no DATETIME into Go (parseTime does not matter), judges time by
// UTC_TIMESTAMP (loc and time_zone do not), and reads no count of affected
// rows (clientFoundRows does not). interpolateParams=true saves two round
// trips per statement (no prepare, no close). db must reach the primary:
// a replica's copy of the table may be behind. Size its pool for the keys
// held at once plus the keys waited for: one renewal per held key every
// TTL/3 and one poller per waited key and process.
func NewMySQL(db *sql.DB, opt MySQLOptions) *MySQL {
	opt = opt.withDefaults()
	t := quoteIdent(opt.Table)
	// free holds for a row that the attempt may take: free, expired, or
	// taken by this very statement (its owner is the attempt's token, which
	// is new for every attempt and so was no one's before). The last case
	// makes the statement's result the same whether the server assigns the
	// columns of the UPDATE part from left to right (MySQL, and MariaDB by
	// default), each seeing the columns assigned before it, or all at once
	// (MariaDB's sql_mode SIMULTANEOUS_ASSIGNMENT), each seeing the old row:
	// fence is assigned first and owner second, so their conditions see the
	// old row in both; expires_at is assigned last, and from left to right
	// it sees the new owner, which is the attempt's token exactly when the
	// row was taken.
	const free = "(owner = ? OR owner = '' OR expires_at <= UTC_TIMESTAMP(6))"
	m := &MySQL{
		db:  db,
		opt: opt,
		waiter: &waiter{wait: opt.Wait, minBackoff: opt.MinBackoff, maxBackoff: opt.MaxBackoff,
			queue: true},
		// The VALUES list is evaluated on every path, the held one too: the
		// held branch sets LAST_INSERT_ID back to 0 after it.
		takeSQL: "INSERT INTO " + t + " (name, owner, fence, expires_at)" +
			" VALUES (?, ?, LAST_INSERT_ID(" + mysqlClock + "), UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND)" +
			" ON DUPLICATE KEY UPDATE" +
			" fence = IF(" + free + ", LAST_INSERT_ID(GREATEST(fence + 1, " + mysqlClock + ")), fence + LAST_INSERT_ID(0))," +
			" owner = IF(" + free + ", ?, owner)," +
			" expires_at = IF(" + free + ", UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND, expires_at)",
		// LAST_INSERT_ID(fence) is evaluated only on a row that matched: the
		// reply carries the fence (never 0) when the lease was extended.
		renewSQL: "UPDATE " + t + " SET fence = LAST_INSERT_ID(fence)," +
			" expires_at = UTC_TIMESTAMP(6) + INTERVAL ? MICROSECOND" +
			" WHERE name = ? AND owner = ? AND expires_at > UTC_TIMESTAMP(6)",
		// The reply carries 1 when the caller's lease had not run out, 0
		// when it had or the row is not the caller's. The IF's branches are
		// the same: it is there to evaluate LAST_INSERT_ID on the old row.
		releaseSQL: "UPDATE " + t + " SET owner = IF(LAST_INSERT_ID(expires_at > UTC_TIMESTAMP(6)), '', '')" +
			" WHERE name = ? AND owner = ?",
		// A key never locked gets a free row that carries the counter.
		raiseSQL: "INSERT INTO " + t + " (name, owner, fence, expires_at) VALUES (?, '', ?, UTC_TIMESTAMP(6))" +
			" ON DUPLICATE KEY UPDATE fence = GREATEST(fence, ?)",
		holderSQL: "SELECT owner, fence, TIMESTAMPDIFF(MICROSECOND, '1970-01-01', expires_at)," +
			" owner <> '' AND expires_at > UTC_TIMESTAMP(6) FROM " + t + " WHERE name = ?",
	}
	return m
}

// quoteIdent quotes a table name, each part of a dotted one on its own.
func quoteIdent(name string) string {
	parts := strings.Split(name, ".")
	for i, p := range parts {
		parts[i] = "`" + strings.ReplaceAll(p, "`", "``") + "`"
	}
	return strings.Join(parts, ".")
}

// Stats reports what the lock's waiters have done so far: Attempts counts
// the statements that tried to take a key, Waiting the callers in line for
// a key in this process. Nothing wakes a waiter: Wakeups stays 0.
func (m *MySQL) Stats() Stats {
	s := m.waiter.stats()
	s.Waiting = m.waiter.line.waiting()
	return s
}

// RaiseFence raises key's fencing counter (its row's fence) to at least
// atLeast, and never lowers it, so that the next acquisition's token —
// max(fence + 1, MySQL's clock in microseconds) — is above atLeast. It
// leaves the holder, if any, and its lease as they are. It is the repair
// for a counter that went back further than the server's clock can cover
// (a table restored from an older backup, or a primary promoted on a
// machine whose clock is behind, while the rows it fences kept their
// fences): a caller whose write the database refused because the row's
// fence is at or above its token raises the counter to that fence.
// atLeast must be in [0, 2^63−1), so that the next token fits a BIGINT.
func (m *MySQL) RaiseFence(ctx context.Context, key string, atLeast int64) error {
	switch {
	case len(key) > maxMySQLKey:
		return fmt.Errorf("lock: raise fence %q: a key of %d bytes is longer than the lock table's %d", key, len(key), maxMySQLKey)
	case atLeast < 0 || atLeast == math.MaxInt64:
		return fmt.Errorf("lock: raise fence %q: %d is not in [0, 2^63-1)", key, atLeast)
	}
	if _, _, err := m.execLost(ctx, m.raiseSQL, key, atLeast, atLeast); err != nil {
		return fmt.Errorf("lock: raise fence %q: %w", key, err)
	}
	return nil
}

// Close releases nothing: the lock opens nothing of its own, and db is the
// caller's to close. It is there so that MySQL has the other locks' API.
func (m *MySQL) Close() error { return m.waiter.close() }

// Obtain takes the lock on key. While the key is held by someone else it
// polls with exponential backoff and full jitter, for at most the
// configured wait and never past ctx; then it returns an error wrapping
// ErrNotObtained and the context's cause. A connection lost under an
// attempt is retried as a held key is (the attempt gave back whatever it
// may have taken); any other error, MySQL refusing connections among them,
// ends the wait at once.
//
// The lease's watchdog renews it every TTL/3 until Release. If a renewal finds
// the lock gone, or the lease runs out while MySQL cannot be reached, the
// lease's Context is cancelled with a cause wrapping ErrNotHeld.
func (m *MySQL) Obtain(ctx context.Context, key string) (*Lease, error) {
	return m.ObtainWhile(ctx, key, nil)
}

// ObtainWhile is Obtain for a caller whose reason to wait may go away while
// the key is held: before each retry — the key may have been released
// meanwhile, and no announcement says when — it calls still, and gives up
// with its error if it returns one. A buyer waiting for a SKU that the
// holder may be selling out checks the stock there. still may be nil.
func (m *MySQL) ObtainWhile(ctx context.Context, key string, still func(context.Context) error) (*Lease, error) {
	return m.waiter.obtain(ctx, key, func(ctx, tryCtx context.Context) (*Lease, error) {
		return m.attempt(ctx, tryCtx, key)
	}, still)
}

// TryObtain takes the lock on key if it is free and otherwise returns
// ErrNotObtained at once; also when a waiter of this process is in line
// for it. The lease is watched as Obtain's is.
func (m *MySQL) TryObtain(ctx context.Context, key string) (*Lease, error) {
	return m.waiter.tryObtain(ctx, key, func(ctx, tryCtx context.Context) (*Lease, error) {
		return m.attempt(ctx, tryCtx, key)
	})
}

// Holder reports who holds key now, by the table: the holder's token
// (owner, "" when the key is free or its lease has run out), the key's
// fencing counter (the latest holder's token, 0 for a key never locked),
// and when the holder's lease runs out unless renewed (the zero time when
// the key is not held). It is for tests and diagnostics: the answer may be
// stale by the time it arrives.
func (m *MySQL) Holder(ctx context.Context, key string) (owner string, fence int64, until time.Time, err error) {
	var (
		untilUS int64
		held    bool
	)
	err = m.db.QueryRowContext(ctx, m.holderSQL, key).Scan(&owner, &fence, &untilUS, &held)
	switch {
	case errors.Is(err, sql.ErrNoRows):
		return "", 0, time.Time{}, nil
	case err != nil:
		return "", 0, time.Time{}, fmt.Errorf("lock: holder of %q: %w", key, err)
	case !held:
		return "", fence, time.Time{}, nil
	}
	return owner, fence, time.UnixMicro(untilUS), nil
}

// attempt runs the take statement once, under tryCtx; the lease lives on
// ctx. A key held by someone else is ErrNotObtained.
func (m *MySQL) attempt(ctx, tryCtx context.Context, key string) (*Lease, error) {
	if len(key) > maxMySQLKey {
		return nil, fmt.Errorf("lock: obtain %q: a key of %d bytes is longer than the lock table's %d", key, len(key), maxMySQLKey)
	}
	token := rand.Text()
	start := time.Now()
	fence, err := m.take(tryCtx, key, token)
	if err := settle(tryCtx, key, start, m.opt.TTL, fence, err, func() { m.cleanup(ctx, key, token) }); err != nil {
		return nil, err
	}
	ttl := m.opt.TTL.Microseconds()
	// leaseIn wants the two fields of RedisOptions that a lease uses.
	return leaseIn(ctx, RedisOptions{TTL: m.opt.TTL, After: m.opt.After}, nil, key, fence, start,
		func(ctx context.Context) (bool, error) { return m.release(ctx, key, token) },
		func(ctx context.Context) (int64, error) {
			id, err := m.exec(ctx, m.renewSQL, ttl, key, token)
			if err != nil || id == 0 {
				return 0, err
			}
			return 1, nil
		}), nil
}

// take runs the take statement for key with token and returns the fencing
// token, or -1 if the key is held. A deadlock or a lock wait timeout rolled
// the statement back, so nothing was taken: that is contention too, and
// the waiter tries again after its backoff.
func (m *MySQL) take(ctx context.Context, key, token string) (int64, error) {
	ttl := m.opt.TTL.Microseconds()
	fence, err := m.exec(ctx, m.takeSQL, key, token, ttl, token, token, token, token, ttl)
	switch {
	case mysqldb.Contended(err):
		return -1, nil
	case errors.Is(err, mysql.ErrInvalidConn):
		// The driver reports a connection that failed under a statement so,
		// without the cause. To the waiter it is a dropped connection (see
		// failingOver): it backs off and tries again, on a new one.
		return -1, fmt.Errorf("%w: %w", err, io.ErrUnexpectedEOF)
	case err != nil:
		return -1, err
	case fence == 0:
		return -1, nil
	}
	return fence, nil
}

// exec runs a statement and returns the LAST_INSERT_ID its reply carries.
func (m *MySQL) exec(ctx context.Context, query string, args ...any) (int64, error) {
	res, err := m.db.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.LastInsertId()
}

// cleanup gives back key's lock after an attempt that may hold it, if token
// holds it, on a context of its own: the attempt's may have ended.
func (m *MySQL) cleanup(ctx context.Context, key, token string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	_, _ = m.release(ctx, key, token)
}

// release frees key's row if token holds it and reports whether the lease
// was still held: the row was token's and had not run out. A "not held"
// that follows a try whose reply was lost (see execLost) is that try's
// release.
func (m *MySQL) release(ctx context.Context, key, token string) (bool, error) {
	held, lost, err := m.execLost(ctx, m.releaseSQL, key, token)
	if err != nil {
		return false, err
	}
	return held != 0 || lost, nil
}

// execLost runs a statement whose second run, after a first that
// succeeded, changes nothing — a release, a raise — until it gets MySQL's
// answer: again while its reply was lost (see mysqlReplyLost), at most
// retryTries times in all and while ctx lasts. It returns the
// LAST_INSERT_ID of the answer, and reports whether a try's reply was lost,
// after which the answer may be the answer to a statement that had already
// run.
func (m *MySQL) execLost(ctx context.Context, query string, args ...any) (id int64, lost bool, err error) {
	for try := 1; ; try++ {
		id, err = m.exec(ctx, query, args...)
		if err == nil || try == retryTries || !mysqlReplyLost(ctx, err) {
			return id, lost, err
		}
		lost = true
	}
}

// mysqlReplyLost reports whether err leaves it unknown whether a statement
// ran: anything but MySQL's answer, even an error, a statement never sent
// (database/sql tries those on another connection by itself and reports
// driver.ErrBadConn when it gives up) and a failed dial. It is wider than
// mysqldb.ReplyLost, which counts only a connection seen to fail: a lock's
// release or raise is safe to run again, so any doubt is a try more. The
// end of ctx ends the tries.
func mysqlReplyLost(ctx context.Context, err error) bool {
	var (
		answer *mysql.MySQLError
		op     *net.OpError
	)
	switch {
	case err == nil, ended(ctx), errors.As(err, &answer), errors.Is(err, driver.ErrBadConn),
		errors.As(err, &op) && op.Op == "dial":
		return false
	}
	return true
}
