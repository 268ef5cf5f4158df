package handler

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"

	"shop/internal/ratelimit"
)

// RateLimiter keeps allowances that every replica shares;
// *ratelimit.Limiter implements it. Take takes one request from key's
// allowance: it returns 0 when the request may go on, else how long until
// it could, and an error when it could not tell. Give gives back one
// request taken, for a limit that counts only some outcomes.
type RateLimiter interface {
	Take(ctx context.Context, key string, l ratelimit.Limit) (time.Duration, error)
	Give(ctx context.Context, key string, l ratelimit.Limit) error
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
	// that guessing it is bounded too. The address is the socket's peer:
	// the operators' listener trusts no proxy. While Redis does not answer
	// (or with no Deps.Limiter), each replica keeps this limit in its own
	// memory: guessing stays bounded, and operators still get in.
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
	store RateLimiter // nil: nothing is limited but AdminAuth, in local
	// local keeps AdminAuth while store does not answer, or without one.
	local     *ratelimit.Local
	log       *slog.Logger
	failures  *failureLog
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
			"and result: allowed, limited (answered 429), failed_open (Redis did not answer; let through). " +
			"admin_auth never fails open: without Redis, each replica decides it in its own memory.",
	}, []string{"limit", "result"})
	reg.MustRegister(decisions)
	for _, name := range []string{limitUser, limitAction, limitClient, limitAdminAuth} {
		for _, result := range []string{"allowed", "limited", "failed_open"} {
			decisions.WithLabelValues(name, result)
		}
	}
	return &limiter{Limits: l, store: store, local: &ratelimit.Local{}, log: log, failures: &failureLog{every: failureLogEvery},
		decisions: decisions}
}

// take takes one request from key's allowance under the limit name, lim:
// an error wrapping errRateLimited when it is used up. When Redis does not
// answer the request goes on (fail open), counted and logged at warn (at
// most once every failureLogEvery per limit): a rate limit protects the
// sale, and an outage of it must not end the sale too.
func (l *limiter) take(c *gin.Context, name, key string, lim ratelimit.Limit) error {
	if l.off(lim) {
		return nil
	}
	wait, err := l.store.Take(c.Request.Context(), key, lim)
	if err != nil {
		l.decisions.WithLabelValues(name, "failed_open").Inc()
		l.failures.warn(c.Request.Context(), l.log, name, "let through", err)
		return nil
	}
	return l.decide(name, wait)
}

// off reports that lim limits nothing: it is zero, or there is no store.
func (l *limiter) off(lim ratelimit.Limit) bool { return l.store == nil || lim.IsZero() }

// takeGuess takes one guess at the admin token from key's allowance
// (Limits.AdminAuth) before the token is compared: taken after, a burst of
// guesses at once would all be compared before any was counted. give gives
// the guess back, for a right token, so that only failed checks count.
//
// When Redis does not answer, or there is no store, the guess is taken
// from this replica's own allowance at the same rate (never let through):
// the token guards the catalog, and an outage of Redis must not open it to
// guessing.
func (l *limiter) takeGuess(c *gin.Context, key string) (give func(), err error) {
	lim := l.AdminAuth
	if lim.IsZero() {
		return func() {}, nil
	}
	ctx := c.Request.Context()
	store := l.store
	var wait time.Duration
	if store != nil {
		if wait, err = store.Take(ctx, key, lim); err != nil {
			l.failures.warn(ctx, l.log, limitAdminAuth, "the admin token's guesses are limited in this replica's memory", err)
		}
	}
	if store == nil || err != nil {
		store = l.local
		wait, _ = l.local.Take(ctx, key, lim)
	}
	if err := l.decide(limitAdminAuth, wait); err != nil {
		return nil, err
	}
	return func() {
		// Given back to where it was taken from, even if the client is gone.
		if err := store.Give(context.WithoutCancel(ctx), key, lim); err != nil {
			l.log.WarnContext(ctx, "rate limit: a right admin token's guess was not given back; it counts as a failed check", "err", err)
		}
	}, nil
}

// decide counts a decision of the limit name whose store answered wait:
// an error wrapping errRateLimited when it is more than 0.
func (l *limiter) decide(name string, wait time.Duration) error {
	if wait > 0 {
		l.decisions.WithLabelValues(name, "limited").Inc()
		return &rateLimited{limit: name, retryAfter: wait}
	}
	l.decisions.WithLabelValues(name, "allowed").Inc()
	return nil
}

// failureLogEvery is how often, at most, a limit's Redis failures are
// logged: an outage fails every request, and a line for each would be a
// flood of its own.
const failureLogEvery = 10 * time.Second

// failureLog logs the limits' Redis failures at warn, at most once every
// `every` per limit, with how many went unlogged since the last line.
type failureLog struct {
	every time.Duration

	mu     sync.Mutex
	last   map[string]time.Time
	missed map[string]int
}

// warn logs that limit name's Redis did not answer (err), and what was
// done about it, unless the limit's last line is more recent than every.
func (f *failureLog) warn(ctx context.Context, log *slog.Logger, name, done string, err error) {
	f.mu.Lock()
	now := time.Now()
	if last, ok := f.last[name]; ok && now.Sub(last) < f.every {
		f.missed[name]++
		f.mu.Unlock()
		return
	}
	if f.last == nil {
		f.last, f.missed = map[string]time.Time{}, map[string]int{}
	}
	missed := f.missed[name]
	f.last[name], f.missed[name] = now, 0
	f.mu.Unlock()
	log.WarnContext(ctx, "rate limit: Redis did not answer; "+done, "limit", name, "err", err,
		"unlogged_failures", missed, "logged_every", f.every.String())
}

// perClient limits each client address's requests (Limits.Client). The
// address is the socket's peer, or what a trusted proxy says it is.
func (l *limiter) perClient() gin.HandlerFunc {
	return func(c *gin.Context) {
		if l.off(l.Client) {
			// Off (SHOP_RATE_IP=0, the default): not even the key is made.
			c.Next()
			return
		}
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
