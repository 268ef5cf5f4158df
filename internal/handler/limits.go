package handler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"

	"shop/internal/ratelimit"
)

// RateLimiter keeps allowances that every replica shares;
// *ratelimit.Limiter implements it. Take takes one request from key's
// allowance, Check only looks; both return 0 when the request may go on,
// else how long until it could, and an error when they could not tell.
type RateLimiter interface {
	Take(ctx context.Context, key string, l ratelimit.Limit) (time.Duration, error)
	Check(ctx context.Context, key string, l ratelimit.Limit) (time.Duration, error)
}

// Limits are the API's rate limits. A zero Limit limits nothing, and with
// no Deps.Limiter nothing is limited at all.
type Limits struct {
	// User bounds each buyer's orders (POST /api/v1/orders), counted once
	// the request is known to be well formed and whose it is. The same
	// limit, in an allowance of its own, bounds each buyer's reads of
	// MySQL that are not orders: cancellations, checkouts, an order's
	// look-up by a buyer with a bearer token, and the replay of an order
	// over the limit (see replayOver).
	User ratelimit.Limit
	// Client bounds each client address's requests to /api/v1/ (the
	// balancers' probes are not counted).
	Client ratelimit.Limit
	// AdminAuth bounds each client address's failed admin token checks:
	// past it, the admin API answers 429 without looking at the token, so
	// that guessing it is bounded too.
	AdminAuth ratelimit.Limit
}

// AdminAuthLimit is the default of Limits.AdminAuth: ten failed token
// checks a minute per address. An operator mistyping a token is never near
// it; a guesser is held to 14400 guesses a day, against a token of at least
// 16 characters.
func AdminAuthLimit() ratelimit.Limit {
	return ratelimit.Limit{Rate: 10, Burst: 10, Period: time.Minute}
}

// errRateLimited is a request over one of the rate limits; it comes as a
// *rateLimited, which says for how long.
var errRateLimited = errors.New("too many requests: wait as long as Retry-After says, then retry")

// rateLimited is a request refused by the limit named limit, which would
// let it through after retryAfter.
type rateLimited struct {
	limit      string
	retryAfter time.Duration
}

func (e *rateLimited) Error() string {
	return fmt.Sprintf("over the %s rate limit for %s", e.limit, e.retryAfter)
}

func (e *rateLimited) Is(target error) bool { return target == errRateLimited }

// retryAfterHeader is the Retry-After of err's 429: whole seconds, at
// least one.
func retryAfterHeader(err error) string {
	var rl *rateLimited
	if !errors.As(err, &rl) {
		return retryAfterSeconds
	}
	return strconv.Itoa(max(1, int(math.Ceil(rl.retryAfter.Seconds()))))
}

// limiter applies Limits and counts its decisions.
type limiter struct {
	Limits
	store     RateLimiter // nil: nothing is limited
	log       *slog.Logger
	decisions *prometheus.CounterVec
}

// The limits' names, in the metrics' limit label.
const (
	limitUser      = "user"
	limitAction    = "user_action"
	limitClient    = "client"
	limitAdminAuth = "admin_auth"
)

func newLimiter(store RateLimiter, l Limits, log *slog.Logger, reg prometheus.Registerer) *limiter {
	decisions := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "shop_rate_limit_total",
		Help: "Rate limit decisions by limit (user: orders per buyer, user_action: a buyer's cancellations, checkouts, order reads and replays over the order limit, client: requests per address, admin_auth: failed admin token checks per address) " +
			"and result: allowed, limited (answered 429), failed_open (Redis did not answer; let through).",
	}, []string{"limit", "result"})
	reg.MustRegister(decisions)
	for _, name := range []string{limitUser, limitAction, limitClient, limitAdminAuth} {
		for _, result := range []string{"allowed", "limited", "failed_open"} {
			decisions.WithLabelValues(name, result)
		}
	}
	return &limiter{Limits: l, store: store, log: log, decisions: decisions}
}

// take takes one request from key's allowance under the limit name, lim:
// an error wrapping errRateLimited when it is used up. When Redis does not
// answer the request goes on (fail open), counted and logged at debug: a
// rate limit protects the sale, and an outage of it must not end the sale
// too.
func (l *limiter) take(c *gin.Context, name, key string, lim ratelimit.Limit) error {
	if l.store == nil || lim.IsZero() {
		return nil
	}
	wait, err := l.store.Take(c.Request.Context(), key, lim)
	return l.decide(c, name, wait, err)
}

// check is take without taking.
func (l *limiter) check(c *gin.Context, name, key string, lim ratelimit.Limit) error {
	if l.store == nil || lim.IsZero() {
		return nil
	}
	wait, err := l.store.Check(c.Request.Context(), key, lim)
	return l.decide(c, name, wait, err)
}

func (l *limiter) decide(c *gin.Context, name string, wait time.Duration, err error) error {
	switch {
	case err != nil:
		l.decisions.WithLabelValues(name, "failed_open").Inc()
		l.log.DebugContext(c.Request.Context(), "rate limit: let through, Redis did not answer", "limit", name, "err", err)
		return nil
	case wait > 0:
		l.decisions.WithLabelValues(name, "limited").Inc()
		return &rateLimited{limit: name, retryAfter: wait}
	}
	l.decisions.WithLabelValues(name, "allowed").Inc()
	return nil
}

// perClient limits each client address's requests (Limits.Client). The
// address is the socket's peer, or what a trusted proxy says it is.
func (l *limiter) perClient() gin.HandlerFunc {
	return func(c *gin.Context) {
		if err := l.take(c, limitClient, "client:"+c.ClientIP(), l.Client); err != nil {
			writeError(c, err)
			return
		}
		c.Next()
	}
}

// perUser takes one order from user's allowance (Limits.User).
func (l *limiter) perUser(c *gin.Context, user int64) error {
	return l.take(c, limitUser, "user:"+strconv.FormatInt(user, 10), l.User)
}

// perAction takes one of user's actions other than an order from their
// allowance of them: Limits.User's rate, apart from the orders', so that a
// buyer who ordered up to the limit can still cancel, and one polling an
// order's status never uses up their orders.
func (l *limiter) perAction(c *gin.Context, user int64) error {
	return l.take(c, limitAction, "user-action:"+strconv.FormatInt(user, 10), l.User)
}
