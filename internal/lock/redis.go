package lock

import (
	"context"
	"crypto/rand"
	_ "embed"
	"errors"
	"fmt"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/redis/go-redis/v9"
)

var (
	//go:embed obtain.lua
	obtainLua string
	//go:embed release.lua
	releaseLua string
	//go:embed renew.lua
	renewLua string

	obtainScript  = redis.NewScript(obtainLua)
	releaseScript = redis.NewScript(releaseLua)
	renewScript   = redis.NewScript(renewLua)
)

// RedisOptions configures a Redis lock. Zero fields take the defaults.
type RedisOptions struct {
	// Prefix is put before every key; default "shop:lock:".
	Prefix string
	// TTL is the lease length; default 5s. The watchdog renews at TTL/3.
	TTL time.Duration
	// Wait bounds how long Obtain waits for a held key; default 2s.
	Wait time.Duration
	// MinBackoff and MaxBackoff bound the exponential backoff between tries;
	// defaults 2ms and 100ms.
	MinBackoff, MaxBackoff time.Duration
	// NoFencing takes the lock without a fencing token (Lease.Fence is 0)
	// and keeps no counter key: for mutexes that guard no writes a database
	// checks, such as a cache rebuild.
	NoFencing bool
	// After is the timer the watchdog sleeps on; default time.After. A test
	// freezes a holder, as a stop-the-world pause would, by handing it a
	// timer that never fires.
	After func(time.Duration) <-chan time.Time
}

// Redis is a lock held as a lease in one Redis server.
//
// Obtain runs one script that sets the key with NX and PX to a random token
// and, only when that succeeded, increments the key's fencing counter: the
// lock and its token are taken atomically. Release and renewal are
// compare-and-delete and compare-and-PEXPIRE scripts, so a holder whose lease
// expired can neither free nor extend the lock of whoever holds it now.
//
// Keys are hash-tagged ("{sku:42}") so a key and its counter share a slot on
// Redis Cluster.
type Redis struct {
	client redis.Scripter
	opt    RedisOptions
}

// NewRedis returns a Redis lock on client.
func NewRedis(client redis.Scripter, opt RedisOptions) *Redis {
	if opt.Prefix == "" {
		opt.Prefix = "shop:lock:"
	}
	if opt.TTL <= 0 {
		opt.TTL = 5 * time.Second
	}
	if opt.Wait <= 0 {
		opt.Wait = 2 * time.Second
	}
	if opt.MinBackoff <= 0 {
		opt.MinBackoff = 2 * time.Millisecond
	}
	if opt.MaxBackoff < opt.MinBackoff {
		opt.MaxBackoff = max(100*time.Millisecond, opt.MinBackoff)
	}
	if opt.After == nil {
		opt.After = time.After
	}
	return &Redis{client: client, opt: opt}
}

// Key returns the Redis key that holds the lock on key.
func (r *Redis) Key(key string) string { return r.opt.Prefix + "{" + key + "}" }

// FenceKey returns the Redis key of key's fencing counter.
func (r *Redis) FenceKey(key string) string { return r.Key(key) + ":fence" }

// Obtain takes the lock on key. While the key is held by someone else it
// retries with exponential backoff and full jitter, for at most the
// configured wait and never past ctx; then it returns an error wrapping
// ErrNotObtained and the context's cause. A Redis error ends the wait at
// once.
//
// The lease's watchdog renews it every TTL/3 until Release. If a renewal finds
// the lock gone, or the lease runs out while Redis cannot be reached, the
// lease's Context is cancelled with a cause wrapping ErrNotHeld.
func (r *Redis) Obtain(ctx context.Context, key string) (*Lease, error) {
	waitCtx, cancel := context.WithTimeout(ctx, r.opt.Wait)
	defer cancel()

	b := &backoff.ExponentialBackOff{
		InitialInterval: r.opt.MinBackoff,
		// Full jitter: each sleep is drawn uniformly from [0, 2×interval].
		RandomizationFactor: 1,
		Multiplier:          2,
		MaxInterval:         r.opt.MaxBackoff,
	}
	b.Reset()
	var timer *time.Timer
	for {
		l, err := r.attempt(ctx, waitCtx, key)
		if !errors.Is(err, ErrNotObtained) {
			return l, err
		}
		if waitCtx.Err() != nil {
			return nil, notObtained(waitCtx)
		}
		d := b.NextBackOff()
		if timer == nil {
			timer = time.NewTimer(d)
			defer timer.Stop()
		} else {
			timer.Reset(d)
		}
		select {
		case <-waitCtx.Done():
			return nil, notObtained(waitCtx)
		case <-timer.C:
		}
	}
}

// TryObtain takes the lock on key if it is free and otherwise returns
// ErrNotObtained at once. The lease is watched as Obtain's is.
func (r *Redis) TryObtain(ctx context.Context, key string) (*Lease, error) {
	return r.attempt(ctx, ctx, key)
}

// attempt runs the obtain script once, under tryCtx; the lease lives on ctx.
// A key held by someone else is ErrNotObtained.
func (r *Redis) attempt(ctx, tryCtx context.Context, key string) (*Lease, error) {
	token := rand.Text()
	start := time.Now()
	keys := []string{r.Key(key)}
	if !r.opt.NoFencing {
		keys = append(keys, r.FenceKey(key))
	}
	fence, err := obtainScript.Run(tryCtx, r.client, keys, token, r.opt.TTL.Milliseconds()).Int64()
	switch {
	case err != nil && tryCtx.Err() != nil:
		// The script may have run although its reply was lost.
		r.cleanup(ctx, key, token)
		return nil, notObtained(tryCtx)
	case err != nil:
		return nil, fmt.Errorf("lock: obtain %q: %w", key, err)
	case fence == 0:
		return nil, ErrNotObtained
	}
	return r.lease(ctx, key, token, max(fence, 0), start), nil
}

// cleanup releases a lock whose obtain reply was lost, if it was ours.
func (r *Redis) cleanup(ctx context.Context, key, token string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
	defer cancel()
	_, _ = r.release(ctx, key, token)
}

// release deletes key's lock if token holds it, reporting whether it did.
func (r *Redis) release(ctx context.Context, key, token string) (bool, error) {
	n, err := releaseScript.Run(ctx, r.client, []string{r.Key(key)}, token).Int64()
	return n == 1, err
}

func (r *Redis) lease(ctx context.Context, key, token string, fence int64, start time.Time) *Lease {
	l := newLease(ctx, key, fence, func(ctx context.Context) error {
		released, err := r.release(ctx, key, token)
		switch {
		case err != nil:
			return fmt.Errorf("lock: release %q: %w", key, err)
		case !released:
			return fmt.Errorf("lock: release %q: %w", key, ErrNotHeld)
		}
		return nil
	})
	l.watchdog = make(chan struct{})
	go r.watch(l, token, start.Add(r.opt.TTL))
	return l
}

// watch renews l until its Context ends. validUntil is when the lease runs
// out if no renewal succeeds; it is reckoned from before the command that
// obtained or renewed it was sent, so it never overestimates.
func (r *Redis) watch(l *Lease, token string, validUntil time.Time) {
	defer close(l.watchdog)
	interval := r.opt.TTL / 3
	for {
		select {
		case <-l.ctx.Done():
			return
		case <-r.opt.After(min(interval, time.Until(validUntil))):
		}
		start := time.Now()
		ok, err := r.renew(l.ctx, l.key, token, validUntil)
		switch {
		case l.ctx.Err() != nil:
			return
		case err == nil && ok:
			validUntil = start.Add(r.opt.TTL)
		case err == nil:
			l.cancel(fmt.Errorf("%w: lease on %q was taken over or expired", ErrNotHeld, l.key))
			return
		case !time.Now().Before(validUntil):
			l.cancel(fmt.Errorf("%w: lease on %q ran out unrenewed: %w", ErrNotHeld, l.key, err))
			return
		}
	}
}

func (r *Redis) renew(ctx context.Context, key, token string, validUntil time.Time) (bool, error) {
	ctx, cancel := context.WithDeadline(ctx, validUntil)
	defer cancel()
	n, err := renewScript.Run(ctx, r.client, []string{r.Key(key)}, token, r.opt.TTL.Milliseconds()).Int64()
	return n == 1, err
}
