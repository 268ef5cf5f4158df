// Package ratelimit bounds how often one user or one client address may
// ask, over every replica at once: GCRA (the generic cell rate algorithm)
// in Redis, by github.com/go-redis/redis_rate. Each limit is one key, so
// it works on a Redis Cluster as on one server, and every replica shares
// the same allowance.
package ratelimit

import (
	"context"
	"fmt"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
)

// Timeout bounds a limiter's call to Redis. A limit is a guard, not the
// work: a Redis too slow to answer in this time lets the request through
// rather than making every buyer wait for it.
const Timeout = 200 * time.Millisecond

// Limit is how many requests a Period allows, in bursts of up to Burst.
type Limit = redis_rate.Limit

// PerSecond is rate requests a second in bursts of burst (the rate's own
// when burst is 0); the zero Limit, no limit, when rate is 0.
func PerSecond(rate, burst int) Limit {
	if rate == 0 {
		return Limit{}
	}
	if burst == 0 {
		burst = rate
	}
	return Limit{Rate: rate, Burst: burst, Period: time.Second}
}

// Limiter keeps the allowances in Redis.
type Limiter struct {
	rl     *redis_rate.Limiter
	prefix string
}

// New returns a Limiter keeping its keys in rdb under prefix.
func New(rdb redis.UniversalClient, prefix string) *Limiter {
	return &Limiter{rl: redis_rate.NewLimiter(rdb), prefix: prefix}
}

// Take takes one request from key's allowance under l. It returns 0 when
// the request may go on, or how long until it could. An error means Redis
// did not answer in time, and nothing is known: the caller decides
// whether to let the request through.
func (l *Limiter) Take(ctx context.Context, key string, lim Limit) (time.Duration, error) {
	return l.allow(ctx, key, lim, 1)
}

// Check tells, as Take does, whether a request over key would go on now,
// and takes nothing: for limits that count only some outcomes (failed
// token checks), taken with Take once the outcome is known.
//
// GCRA refuses a request of cost 1 when, with the burst one smaller, even
// a request of cost 0 would be refused; redis_rate takes nothing at cost 0,
// so asking that is a check.
func (l *Limiter) Check(ctx context.Context, key string, lim Limit) (time.Duration, error) {
	lim.Burst--
	return l.allow(ctx, key, lim, 0)
}

func (l *Limiter) allow(ctx context.Context, key string, lim Limit, n int) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	res, err := l.rl.AllowN(ctx, l.prefix+key, lim, n)
	if err != nil {
		return 0, fmt.Errorf("rate limit %s: %w", key, err)
	}
	// RetryAfter is -1 for a request let through.
	if res.RetryAfter > 0 {
		return res.RetryAfter, nil
	}
	return 0, nil
}
