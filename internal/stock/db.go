package stock

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/go-sql-driver/mysql"
	gormmysql "gorm.io/driver/mysql"
	"gorm.io/gorm"
	"gorm.io/gorm/logger"
)

// Open connects to MySQL with dsn, a go-sql-driver DSN, using a pool of at
// most maxConns connections. It does not wait for the server to answer.
// Times are read as time.Time whatever the DSN says.
func Open(dsn string, maxConns int) (*gorm.DB, error) {
	cfg, err := mysql.ParseDSN(dsn)
	if err != nil {
		return nil, fmt.Errorf("stock: open mysql: %w", err)
	}
	// Send each statement with its arguments in one round trip instead of
	// preparing, executing and closing it in three.
	cfg.InterpolateParams = true
	cfg.ParseTime = true
	db, err := gorm.Open(gormmysql.New(gormmysql.Config{
		DSN: cfg.FormatDSN(),
		// Do not ask the server for its version: a replica starts while
		// MySQL is down and says so on /readyz.
		SkipInitializeWithVersion: true,
	}), &gorm.Config{
		Logger:                 logger.Discard,
		SkipDefaultTransaction: true,
		DisableAutomaticPing:   true,
	})
	if err != nil {
		return nil, fmt.Errorf("stock: open mysql: %w", err)
	}
	sqlDB, err := db.DB()
	if err != nil {
		return nil, fmt.Errorf("stock: open mysql: %w", err)
	}
	sqlDB.SetMaxOpenConns(maxConns)
	sqlDB.SetMaxIdleConns(maxConns)
	sqlDB.SetConnMaxIdleTime(time.Minute)
	return db, nil
}

// Ping checks that MySQL answers.
func Ping(ctx context.Context, db *gorm.DB) error {
	sqlDB, err := db.DB()
	if err != nil {
		return err
	}
	return sqlDB.PingContext(ctx)
}

// MySQL error numbers this package reacts to.
const (
	errTooManyConns    = 1040
	errServerShutdown  = 1053 // also what MySQL sends a connection it KILLs
	errDupEntry        = 1062
	errLockWaitTimeout = 1205
	errDeadlock        = 1213
	errReadOnly        = 1290 // ER_OPTION_PREVENTS_STATEMENT: --read-only, as during a failover
	errInterrupted     = 1317 // the statement was KILLed (KILL QUERY)
	errConnKilled      = 1927 // MariaDB: the connection was KILLed
	errMaxStmtTime     = 1969 // MariaDB: max_statement_time ran out
	errMaxExecTime     = 3024 // MySQL: max_execution_time ran out
	errIdleDisconnect  = 4031 // MySQL 8.0.24+: closed by the server after wait_timeout
)

// outage reports whether MySQL error n says that the server could not do
// the work now — it is shutting down, read-only, out of connections, or it
// gave up on a lock or the statement, or killed the connection — rather than
// that the work was wrong. After any of them the transaction has not
// committed, and the work may be retried.
func outage(n uint16) bool {
	switch n {
	case errTooManyConns, errServerShutdown, errLockWaitTimeout, errDeadlock, errReadOnly,
		errInterrupted, errConnKilled, errMaxStmtTime, errMaxExecTime, errIdleDisconnect:
		return true
	}
	return false
}

// mysqlErrorNumber returns the MySQL error number in err's chain, or 0.
func mysqlErrorNumber(err error) uint16 {
	var me *mysql.MySQLError
	if errors.As(err, &me) {
		return me.Number
	}
	return 0
}

// duplicate reports whether err is MySQL refusing a row that one of the
// table's unique indexes already holds. Which index, and which row, is asked
// of MySQL (Service.conflict), never read out of the message: servers word
// it differently (MySQL 8.0.19 and later name the key
// 'orders.uq_orders_user_sku', MariaDB and older MySQL 'uq_orders_user_sku').
func duplicate(err error) bool { return mysqlErrorNumber(err) == errDupEntry }

// transient reports whether err means the database could not do the work now
// (it is down, unreachable, shutting down, read-only, or gave up on a lock or
// on the statement) rather than that the work was wrong: such errors become
// ErrBusy.
func transient(err error) bool {
	return errors.Is(err, context.DeadlineExceeded) || connLost(err) || outage(mysqlErrorNumber(err))
}

// connLost reports whether err is the connection failing rather than MySQL
// answering: the connection broke, was closed, or could not be made. A
// context's end is not one of them (database/sql checks it before it sends
// a COMMIT), although context.DeadlineExceeded passes for a net.Error.
func connLost(err error) bool {
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	var netErr net.Error
	return errors.Is(err, driver.ErrBadConn) || errors.Is(err, mysql.ErrInvalidConn) ||
		errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) || errors.As(err, &netErr)
}
