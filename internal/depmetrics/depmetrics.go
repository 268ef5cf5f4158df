// Package depmetrics counts the errors a replica's dependencies, MySQL and
// Redis, return to it: shop_dependency_errors_total{dependency="mysql"|"redis"}.
//
// The count is taken where every call passes, so that no code path can
// forget it: a go-redis hook on each Redis client, and a wrapper of the
// connection pool under a gorm.DB, which sees every statement, BEGIN and
// COMMIT. What a dependency answers as a business outcome is not an error
// here: a missing key (redis.Nil), a lock that is not obtained (the lock's
// scripts answer it as a number), a row not found, a duplicate key (an
// order already placed). Nor is a call its own caller gave up on: its
// context was cancelled or ran out first, which is the caller's budget
// (counted where it is decided: busy orders, client_closed_request) and not
// a fault of the server.
package depmetrics

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"strings"

	"github.com/go-sql-driver/mysql"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"
)

// The dependency label's values.
const (
	MySQL = "mysql"
	Redis = "redis"
)

// errDuplicateKey is MySQL's ER_DUP_ENTRY: a unique key refused a row, the
// way an order placed twice is refused (already_ordered).
const errDuplicateKey = 1062

// Errors counts dependency errors. The zero value is not usable; use New.
type Errors struct {
	mysql, redis prometheus.Counter
}

// New returns the counters, registered with reg when it is not nil. Both
// series exist from the start, at zero, so that a dashboard's rate shows 0
// and not "no data" on a replica that has seen no error.
func New(reg prometheus.Registerer) *Errors {
	vec := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "shop_dependency_errors_total",
		Help: "Errors MySQL or Redis returned to this replica, by dependency; not counted: a missing key, a lock not obtained, " +
			"a row not found, a duplicate key (already_ordered), a call whose caller had given up.",
	}, []string{"dependency"})
	if reg != nil {
		reg.MustRegister(vec)
	}
	return &Errors{mysql: vec.WithLabelValues(MySQL), redis: vec.WithLabelValues(Redis)}
}

// count adds one to c when err is a dependency error of a call made with
// ctx; failed says which errors are.
func count(ctx context.Context, c prometheus.Counter, err error, failed func(error) bool) {
	if err != nil && ctx.Err() == nil && failed(err) {
		c.Inc()
	}
}

// redisFailed reports whether err, returned by a Redis command, is a
// failure: not redis.Nil (no such key, or no reply value), and not the
// NOSCRIPT with which go-redis's Script.Run learns that the server has not
// cached a script yet before it sends the script itself. The lock's
// scripts answer "not obtained", "not held" and "already released" with
// numbers, not errors, so those never come here.
func redisFailed(err error) bool {
	return !errors.Is(err, redis.Nil) && !errors.Is(err, redis.ErrNoScript) && !redis.HasErrorPrefix(err, "NOSCRIPT")
}

// mysqlFailed reports whether err, returned by MySQL through database/sql
// or gorm, is a failure: not a row not found, and not a duplicate key.
func mysqlFailed(err error) bool {
	var me *mysql.MySQLError
	switch {
	case errors.Is(err, gorm.ErrRecordNotFound), errors.Is(err, sql.ErrNoRows):
		return false
	case errors.As(err, &me) && me.Number == errDuplicateKey:
		return false
	}
	return true
}

// RedisHook returns the go-redis hook that counts a client's errors. Add it
// to every client the replica makes (AddHook): the general one, the lock's,
// each Redlock node. A command counts once whatever go-redis did inside it
// (dials, retries, redirections), and a pipeline once if any of its
// commands failed, as one lost connection fails them all.
func (e *Errors) RedisHook() redis.Hook { return redisHook{e.redis} }

type redisHook struct{ errors prometheus.Counter }

// DialHook counts nothing: a failed dial fails the command that needed the
// connection, which is counted.
func (h redisHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h redisHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if !handshake(cmd) {
			count(ctx, h.errors, err, redisFailed)
		}
		return err
	}
}

func (h redisHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		count(ctx, h.errors, pipelineErr(err, cmds), redisFailed)
		return err
	}
}

// pipelineErr is what a pipeline that returned err failed with: the first
// of its commands' errors that is a failure, else err, the pipeline's own
// (which go-redis sets to the first command's error, redis.Nil included).
func pipelineErr(err error, cmds []redis.Cmder) error {
	if !slices.ContainsFunc(cmds, func(cmd redis.Cmder) bool { return !handshake(cmd) }) {
		return nil
	}
	for _, cmd := range cmds {
		if e := cmd.Err(); e != nil && redisFailed(e) {
			return e
		}
	}
	return err
}

// handshakeCommands are the commands go-redis sends on a new connection
// before the command that needed it (shop sends none of them itself). They
// pass through the hooks too, and some fail as a matter of course: CLIENT
// SETINFO and CLIENT MAINT_NOTIFICATIONS on a server that predates them,
// which go-redis ignores. Their errors are not counted: one that matters
// (a wrong password, a dead server) fails the connection, and with it the
// command that needed it, which is.
var handshakeCommands = []string{"hello", "auth", "select", "readonly", "client"}

// handshake reports whether cmd is one of handshakeCommands.
func handshake(cmd redis.Cmder) bool {
	return slices.Contains(handshakeCommands, strings.ToLower(cmd.Name()))
}
