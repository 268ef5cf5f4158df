// Package mysqldb opens the service's MySQL pools — their drivers, session
// settings and limits — and is the one place that reads MySQL's failures:
// which of them are an outage to retry, a lost connection, or a duplicate
// key.
package mysqldb

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"
	gormmysql "gorm.io/driver/mysql"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// Open connects to MySQL with dsn, a go-sql-driver DSN, using a pool of at
// most maxConns connections, set up as opts say. It does not wait for the
// server to answer. Times are read as time.Time, and read and written as
// UTC, whatever the DSN says (its parseTime and loc). Every pool dials
// within DialTimeout, keeps its idle connections probed (TCP keep-alive),
// and renews each connection after ConnMaxLifetime (see connect).
func Open(dsn string, maxConns int, opts ...Option) (*gorm.DB, error) {
	connector, err := connect(dsn, options(opts))
	if err != nil {
		return nil, err
	}
	return openPool(connector, maxConns)
}

// OpenSQL connects to MySQL with dsn as Open does, on a database/sql pool
// of at most maxConns connections, for a caller that runs its statements
// itself (the MySQL lock table). Its connections are kept while idle, as
// a lock's waiters come back to them, and renewed after ConnMaxLifetime.
func OpenSQL(dsn string, maxConns int, opts ...Option) (*sql.DB, error) {
	connector, err := connect(dsn, options(opts))
	if err != nil {
		return nil, err
	}
	db := sql.OpenDB(connector)
	db.SetMaxOpenConns(maxConns)
	db.SetMaxIdleConns(maxConns)
	db.SetConnMaxLifetime(ConnMaxLifetime)
	return db, nil
}

// Option changes how a pool of Open or OpenSQL talks to MySQL.
type Option func(*mysql.Config)

// IOTimeout bounds every read and write on the pool's connections by d —
// a statement, its answer, a COMMIT —, so that a server gone silent (a
// frozen machine, a failover that leaves the old address dead without a
// reset) fails the statement within d instead of leaving it to TCP's
// retransmissions, some fifteen minutes. A DSN's own readTimeout or
// writeTimeout is kept. d must outlast the pool's longest statement,
// row-lock waits included: a statement cut short fails, and is rolled back
// by the server.
func IOTimeout(d time.Duration) Option {
	return func(cfg *mysql.Config) {
		if cfg.ReadTimeout == 0 {
			cfg.ReadTimeout = d
		}
		if cfg.WriteTimeout == 0 {
			cfg.WriteTimeout = d
		}
	}
}

// options is opts applied in order, as one.
func options(opts []Option) func(*mysql.Config) {
	return func(cfg *mysql.Config) {
		for _, o := range opts {
			o(cfg)
		}
	}
}

const (
	// DialTimeout bounds the making of a connection (dial and TCP
	// handshake) when the DSN's timeout does not: without one, a dial to
	// an address that no longer answers waits for the operating system
	// to give up on its SYNs, about two minutes on Linux.
	DialTimeout = 5 * time.Second
	// ConnMaxLifetime is how long a pool keeps a connection before it
	// makes a new one. After a failover that moves the database's name to
	// another machine (a managed database's DNS, a virtual IP), the
	// connections made before it stay on the old one until they break or
	// are renewed: renewing them every few minutes bounds how long a
	// replica keeps talking to a machine that is no longer the writer, at
	// the cost of one connection made per pool connection and period.
	ConnMaxLifetime = 5 * time.Minute
	// keepAliveIdle, keepAliveInterval and keepAliveCount are the TCP
	// keep-alive probes of every connection: an idle connection whose
	// peer is gone is closed after about a minute, rather than found dead
	// by the next statement sent on it.
	keepAliveIdle     = 30 * time.Second
	keepAliveInterval = 10 * time.Second
	keepAliveCount    = 3
)

const (
	// OrdersIOTimeout bounds every read and write on a connection of the
	// orders' pool (OpenOrders): a COMMIT, which no context can cut short
	// once it is sent, is answered or given up on within it.
	OrdersIOTimeout = 5 * time.Second
	// ordersLockWait is how long a statement of an order transaction waits
	// for a row lock (innodb_lock_wait_timeout, whole seconds) before MySQL
	// refuses it with 1205: below OrdersIOTimeout, so that the server gives
	// up first and the connection survives.
	ordersLockWait = OrdersIOTimeout - time.Second
)

// OpenOrders is Open for the pool that order transactions and restocks run
// on. Each of its connections reads at READ COMMITTED, so that every read
// of an order transaction sees what is committed now: there is no snapshot
// for MariaDB's innodb_snapshot_isolation (ON by default from 11.6.2) to
// refuse a locking read against (1020, "Record has changed since last
// read"), and the source articles' read-then-write reads the row as it is. Its reads
// and writes time out after OrdersIOTimeout, and its row-lock waits after
// ordersLockWait; the pools of shop seed and shop verify keep the DSN's.
//
// READ COMMITTED needs binlog_format ROW or MIXED (the servers' defaults)
// where the binary log is on.
func OpenOrders(dsn string, maxConns int) (*gorm.DB, error) {
	connector, err := connect(dsn, func(cfg *mysql.Config) {
		cfg.ReadTimeout, cfg.WriteTimeout = OrdersIOTimeout, OrdersIOTimeout
	})
	if err != nil {
		return nil, err
	}
	return openPool(session{connector, []string{
		"SET SESSION TRANSACTION ISOLATION LEVEL READ COMMITTED",
		fmt.Sprintf("SET SESSION innodb_lock_wait_timeout = %d", int(ordersLockWait.Seconds())),
	}}, maxConns)
}

// Returning reports whether the server db talks to takes INSERT …
// RETURNING: MariaDB from 10.5 on does; MySQL (8.4) does not.
func Returning(ctx context.Context, db *gorm.DB) (bool, error) {
	var version string
	if err := db.WithContext(ctx).Raw("SELECT VERSION()").Scan(&version).Error; err != nil {
		return false, fmt.Errorf("mysqldb: server version: %w", err)
	}
	return returningIn(version), nil
}

// returningIn reads a VERSION(): "10.11.19-MariaDB-0+deb12u1" takes
// RETURNING, "8.4.3" does not.
func returningIn(version string) bool {
	if !strings.Contains(version, "MariaDB") {
		return false
	}
	var major, minor int
	if _, err := fmt.Sscanf(version, "%d.%d", &major, &minor); err != nil {
		return false
	}
	return major > 10 || major == 10 && minor >= 5
}

// connect is the driver's connector for dsn, read as config reads it.
func connect(dsn string, with func(*mysql.Config)) (driver.Connector, error) {
	cfg, err := config(dsn, with)
	if err != nil {
		return nil, err
	}
	connector, err := mysql.NewConnector(cfg)
	if err != nil {
		return nil, fmt.Errorf("mysqldb: open: %w", err)
	}
	return connector, nil
}

// config is the driver's configuration for dsn, read as every pool of the
// service uses it, and changed by with when with is not nil.
func config(dsn string, with func(*mysql.Config)) (*mysql.Config, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("mysqldb: open: %w", err)
	}
	// Send each statement with its arguments in one round trip instead of
	// preparing, executing and closing it in three.
	cfg.InterpolateParams = true
	cfg.ParseTime = true
	// Every DATETIME the service stores is UTC, taken from MySQL's
	// UTC_TIMESTAMP() or from a time.Time the driver writes in cfg.Loc.
	// Another loc in the DSN (loc=Local on a host that is not on UTC)
	// would write times shifted by its offset and read UTC ones as its
	// own: pay_by would move by hours, and so would every expiry.
	cfg.Loc = time.UTC
	if cfg.Timeout == 0 {
		cfg.Timeout = DialTimeout
	}
	if cfg.DialFunc == nil && (cfg.Net == "tcp" || cfg.Net == "tcp4" || cfg.Net == "tcp6") {
		dialer := &net.Dialer{KeepAliveConfig: net.KeepAliveConfig{
			Enable: true, Idle: keepAliveIdle, Interval: keepAliveInterval, Count: keepAliveCount,
		}}
		cfg.DialFunc = dialer.DialContext
	}
	if with != nil {
		with(cfg)
	}
	return cfg, nil
}

// openPool is a gorm pool of at most maxConns connections from connector.
func openPool(connector driver.Connector, maxConns int) (*gorm.DB, error) {
	sqlDB := sql.OpenDB(connector)
	db, err := gorm.Open(gormmysql.New(gormmysql.Config{
		Conn: sqlDB,
		// Do not ask the server for its version: a replica starts while
		// MySQL is down and says so on /readyz.
		SkipInitializeWithVersion: true,
	}), &gorm.Config{
		Logger:                 logger.Discard,
		SkipDefaultTransaction: true,
		DisableAutomaticPing:   true,
	})
	if err != nil {
		sqlDB.Close()
		return nil, fmt.Errorf("mysqldb: open: %w", err)
	}
	// At most maxConns connections, kept while they are used.
	sqlDB.SetMaxOpenConns(maxConns)
	sqlDB.SetMaxIdleConns(maxConns)
	sqlDB.SetConnMaxIdleTime(time.Minute)
	sqlDB.SetConnMaxLifetime(ConnMaxLifetime)
	return db, nil
}

// session is a connector whose connections run statements before their
// first use: the session's settings.
type session struct {
	driver.Connector
	statements []string
}

func (c session) Connect(ctx context.Context) (driver.Conn, error) {
	conn, err := c.Connector.Connect(ctx)
	if err != nil {
		return nil, err
	}
	exec, ok := conn.(driver.ExecerContext)
	if !ok {
		conn.Close()
		return nil, fmt.Errorf("mysqldb: a MySQL connection of type %T cannot execute statements", conn)
	}
	for _, q := range c.statements {
		if _, err := exec.ExecContext(ctx, q, nil); err != nil {
			conn.Close()
			return nil, fmt.Errorf("mysqldb: %s: %w", q, err)
		}
	}
	return conn, nil
}

// Ping checks that MySQL answers.
func Ping(ctx context.Context, db *gorm.DB) error {
	sqlDB, err := db.DB()
	if err != nil {
		return err
	}
	return sqlDB.PingContext(ctx)
}

// MySQL error numbers this package reads.
const (
	errCheckRead       = 1020 // a locking read of a row changed since the snapshot (innodb_snapshot_isolation)
	errTooManyConns    = 1040
	errWsrepNotReady   = 1047 // Galera: the node is not in the Primary component ("WSREP has not yet prepared node for application use")
	errServerShutdown  = 1053 // also what MySQL sends a connection it KILLs
	errDupEntry        = 1062
	errLockWaitTimeout = 1205
	errDeadlock        = 1213
	errCommitFailed    = 1180 // the COMMIT, or Galera's replication of the statement, failed; the transaction is rolled back
	errReadOnly        = 1290 // ER_OPTION_PREVENTS_STATEMENT: --read-only, as during a failover
	errInterrupted     = 1317 // the statement was KILLed (KILL QUERY)
	errConnKilled      = 1927 // MariaDB: the connection was KILLed
	errMaxStmtTime     = 1969 // MariaDB: max_statement_time ran out
	errMaxExecTime     = 3024 // MySQL: max_execution_time ran out
	errIdleDisconnect  = 4031 // MySQL 8.0.24+: closed by the server after wait_timeout
)

// outage reports whether MySQL error n says that the server could not do
// the work now — it is shutting down, read-only, out of connections, cut
// off from its cluster's Primary component, or it gave up on a lock or the
// statement, refused a read made stale by another transaction, failed to
// commit, or killed the connection — rather than that the work was wrong.
// After any of them the transaction has not committed, and the work may be
// retried.
//
// On a Galera node: a transaction that loses certification to a
// conflicting one committed first on another node is 1213, as a deadlock
// is; a statement in flight when the node is cut off from the others is
// 1180 ("Error while appending streaming replication fragment(provider
// status: Not connected to Primary Component)"), rolled back on the node
// and committed on none; and every statement the cut-off node is sent
// after that is 1047, until it rejoins.
func outage(n uint16) bool {
	switch n {
	case errCheckRead, errTooManyConns, errWsrepNotReady, errServerShutdown, errCommitFailed, errLockWaitTimeout,
		errDeadlock, errReadOnly, errInterrupted, errConnKilled, errMaxStmtTime, errMaxExecTime, errIdleDisconnect:
		return true
	}
	return false
}

// errorNumber returns the MySQL error number in err's chain, or 0.
func errorNumber(err error) uint16 {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return me.Number
	}
	return 0
}

// Duplicate reports whether err is MySQL refusing a row that one of the
// table's unique indexes already holds. Which index, and which row, is for
// the caller to ask MySQL, never to read out of the message: servers word it
// differently (MySQL 8.0.19 and later name the key
// 'orders.uq_orders_user_sku', MariaDB and older MySQL 'uq_orders_user_sku').
func Duplicate(err error) bool { return errorNumber(err) == errDupEntry }

// Transient reports whether err means the database could not do the work now
// (it is down, unreachable, shutting down, read-only, or gave up on a lock or
// on the statement) rather than that the work was wrong: the work may be
// retried, and the service answers it as busy.
func Transient(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || ConnLost(err) || outage(errorNumber(err))
}

// ConnLost reports whether err is the connection failing rather than MySQL
// answering: the connection broke, was closed, or could not be made. A
// context's end is not one of them (database/sql checks it before it sends
// a COMMIT), although context.DeadlineExceeded passes for a net.Error.
func ConnLost(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var netErr net.Error
	return errors.Is(err, driver.ErrBadConn) || errors.Is(err, mysql.ErrInvalidConn) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.As(err, &netErr)
}

// ReplyLost reports whether err, the failure of a statement (a COMMIT
// among them), leaves it unknown whether the statement ran: the connection
// failed after it may have been sent. Not when MySQL answered, even with an
// error; not when the statement was never sent (driver.ErrBadConn is the
// driver's word for that, and database/sql tries such a statement on
// another connection by itself), nor when no connection was made (a
// failed dial).
func ReplyLost(err error) bool {
	var op *net.OpError
	return ConnLost(err) && !errors.Is(err, driver.ErrBadConn) && !(errors.As(err, &op) && op.Op == "dial")
}

// Contended reports whether err is MySQL rolling a statement back because
// it lost to another transaction's locks: a deadlock, or a lock wait that
// timed out. Nothing it would have written was.
func Contended(err error) bool {
	n := errorNumber(err)
	return n == errDeadlock || n == errLockWaitTimeout
}

// Deadlock reports whether err is InnoDB choosing this transaction as a
// deadlock's victim (1213): it was rolled back whole, and may be run again.
func Deadlock(err error) bool { return errorNumber(err) == errDeadlock }
