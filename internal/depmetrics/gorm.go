package depmetrics

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"gorm.io/gorm"
)

// WatchGorm counts the MySQL errors of every statement, BEGIN and COMMIT
// that goes through db and the sessions and transactions made from it: it
// puts a counting wrapper around db's connection pool. Call it once, right
// after the gorm.DB is opened and before anything uses it.
//
// The pool and not gorm's callbacks, because the callbacks run around
// statements only: a BEGIN that cannot get a connection and a COMMIT whose
// connection died are errors gorm's Transaction returns without running
// any. A ROLLBACK's error is not counted: it follows an error counted
// already (or the caller's own choice to roll back), and a rollback that
// fails leaves nothing committed. Not seen either: an error met while
// reading the rows of a query that succeeded, and the readiness check's
// ping, which goes to the *sql.DB (db.DB()) and says its result on /readyz.
func (e *Errors) WatchGorm(db *gorm.DB) error {
	sqlDB, ok := db.Statement.ConnPool.(*sql.DB)
	if !ok {
		return fmt.Errorf("depmetrics: a gorm.DB whose pool is a %T, not a *sql.DB", db.Statement.ConnPool)
	}
	p := &pool{conn: sqlDB, errors: e.mysql}
	db.ConnPool = p
	db.Statement.ConnPool = p
	return nil
}

// conn is what pool and tx have in common: the statements.
type conn interface {
	PrepareContext(ctx context.Context, query string) (*sql.Stmt, error)
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// counted is a conn whose statements' errors are counted.
type counted struct {
	conn   conn
	errors prometheus.Counter
}

func (c counted) PrepareContext(ctx context.Context, query string) (*sql.Stmt, error) {
	stmt, err := c.conn.PrepareContext(ctx, query)
	count(ctx, c.errors, err, mysqlFailed)
	return stmt, err
}

func (c counted) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	res, err := c.conn.ExecContext(ctx, query, args...)
	count(ctx, c.errors, err, mysqlFailed)
	return res, err
}

func (c counted) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	rows, err := c.conn.QueryContext(ctx, query, args...)
	count(ctx, c.errors, err, mysqlFailed)
	return rows, err
}

// QueryRowContext counts the query's error, which a *sql.Row holds until
// it is scanned; sql.ErrNoRows is only known then, and is no failure.
func (c counted) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	row := c.conn.QueryRowContext(ctx, query, args...)
	count(ctx, c.errors, row.Err(), mysqlFailed)
	return row
}

// pool is a gorm.ConnPool on a *sql.DB that counts errors. It begins
// transactions as gorm.ConnPoolBeginner, so that they are counted too; it
// is not a gorm.TxCommitter, which gorm would take for a transaction.
type pool struct {
	conn   *sql.DB
	errors prometheus.Counter
}

func (p *pool) counted() counted { return counted{p.conn, p.errors} }

func (p *pool) PrepareContext(ctx context.Context, query string) (*sql.Stmt, error) {
	return p.counted().PrepareContext(ctx, query)
}

func (p *pool) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	return p.counted().ExecContext(ctx, query, args...)
}

func (p *pool) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	return p.counted().QueryContext(ctx, query, args...)
}

func (p *pool) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	return p.counted().QueryRowContext(ctx, query, args...)
}

// BeginTx begins a transaction whose statements and COMMIT are counted.
func (p *pool) BeginTx(ctx context.Context, opts *sql.TxOptions) (gorm.ConnPool, error) {
	t, err := p.conn.BeginTx(ctx, opts)
	count(ctx, p.errors, err, mysqlFailed)
	if err != nil {
		return nil, err
	}
	return &tx{counted: counted{t, p.errors}, tx: t, ctx: ctx}, nil
}

// GetDBConn returns the *sql.DB, for gorm.DB.DB.
func (p *pool) GetDBConn() (*sql.DB, error) { return p.conn, nil }

// tx is a transaction of pool: a gorm.ConnPool and gorm.TxCommitter.
type tx struct {
	counted
	tx *sql.Tx
	// ctx is the transaction's: once it is done, database/sql rolls the
	// transaction back and a COMMIT fails for that reason, the caller's.
	ctx context.Context
}

func (t *tx) Commit() error {
	err := t.tx.Commit()
	if !errors.Is(err, sql.ErrTxDone) {
		count(t.ctx, t.errors, err, mysqlFailed)
	}
	return err
}

func (t *tx) Rollback() error { return t.tx.Rollback() }

// StmtContext is gorm.Tx's: a prepared statement of the pool, run in the
// transaction.
func (t *tx) StmtContext(ctx context.Context, stmt *sql.Stmt) *sql.Stmt {
	return t.tx.StmtContext(ctx, stmt)
}
