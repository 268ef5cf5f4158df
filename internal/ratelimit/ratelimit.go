// Package ratelimit bounds how often one user or one client address may
// ask, over every replica at once: GCRA (the generic cell rate algorithm)
// in Redis, by github.com/go-redis/redis_rate. Each limit is one key, so
// it works on a Redis Cluster as on one server, and every replica shares
// the same allowance. Local is the same algorithm in one process's memory,
// for a limit that must hold while Redis does not answer.
package ratelimit

import (
	"context"
	"fmt"
	"time"

	"github.com/go-redis/redis_rate/v10"
	"github.com/redis/go-redis/v9"
)

// Timeout bounds a limiter's call to Redis, as the service's other Redis
// commands are bounded. A Redis slower than that lets the request through:
// a limit is a guard, not the work. Much shorter, a Redis merely slowed by
// the very flood the limit is for would open it.
const Timeout = time.Second

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
	rdb    redis.UniversalClient
	rl     *redis_rate.Limiter
	prefix string
}

// New returns a Limiter keeping its keys in rdb under prefix.
func New(rdb redis.UniversalClient, prefix string) *Limiter {
	return &Limiter{rdb: rdb, rl: redis_rate.NewLimiter(rdb), prefix: prefix}
}

// Take takes one request from key's allowance under l. It returns 0 when
// the request may go on, or how long until it could. An error means Redis
// did not answer in time, and nothing is known: the caller decides
// whether to let the request through.
func (l *Limiter) Take(ctx context.Context, key string, lim Limit) (time.Duration, error) {
	return l.allow(ctx, key, lim, 1)
}

// Give gives back one request taken from key's allowance under lim: for
// limits that count only some outcomes (failed token checks), whose request
// is taken before its outcome is known and given back when it is not one
// to count. It never raises the allowance past its burst.
//
// redis_rate's AllowN at cost -1 would not do: it writes nothing when the
// request given back is the only one outstanding, which leaves it taken.
func (l *Limiter) Give(ctx context.Context, key string, lim Limit) error {
	ctx, cancel := context.WithTimeout(ctx, Timeout)
	defer cancel()
	if err := give.Run(ctx, l.rdb, []string{redisRatePrefix + l.prefix + key}, emission(lim).Seconds()).Err(); err != nil {
		return fmt.Errorf("rate limit %s: give back: %w", key, err)
	}
	return nil
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

// redisRatePrefix is what redis_rate puts before every key it keeps.
const redisRatePrefix = "rate:"

// give moves a key's theoretical arrival time (redis_rate's value, in
// seconds since 2017, on Redis's clock) one emission interval back, and
// drops the key once that time is past: as if one request had not come.
var give = redis.NewScript(`
redis.replicate_commands()
local tat = redis.call("GET", KEYS[1])
if not tat then
  return 0
end
local now = redis.call("TIME")
now = (now[1] - 1483228800) + (now[2] / 1000000)
local new_tat = tonumber(tat) - tonumber(ARGV[1])
if new_tat <= now then
  redis.call("DEL", KEYS[1])
  return 0
end
redis.call("SET", KEYS[1], new_tat, "EX", math.ceil(new_tat - now))
return 1
`)
