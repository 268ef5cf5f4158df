package lock

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Owner identifies who holds a reentrant lock: a request, a job, a worker —
// whatever should be able to take the same lock again while it holds it. It
// travels in the context (WithOwner), not in goroutine identity: an owner may
// span goroutines, and two owners may share one.
type Owner struct{ id string }

// NewOwner returns a new, unique owner.
func NewOwner() Owner { return Owner{rand.Text()} }

type ownerKey struct{}

// WithOwner returns ctx carrying owner, for Reentrant.Obtain.
func WithOwner(ctx context.Context, owner Owner) context.Context {
	return context.WithValue(ctx, ownerKey{}, owner)
}

// OwnerFrom returns the owner ctx carries.
func OwnerFrom(ctx context.Context) (Owner, bool) {
	o, ok := ctx.Value(ownerKey{}).(Owner)
	return o, ok && o.id != ""
}

// ErrNoOwner is returned by Reentrant.Obtain for a context without an owner.
var ErrNoOwner = errors.New("lock: reentrant lock needs an owner: lock.WithOwner")

var (
	reentrantObtainScript  = redis.NewScript(fenceLua + reentrantObtainLua)
	reentrantReleaseScript = redis.NewScript(reentrantReleaseLua)
	reentrantRenewScript   = redis.NewScript(reentrantRenewLua)
)

// Reentrant is the seeds' reentrant lock in one Redis: a hash holding the
// owner, how many times it has taken the lock (its depth) and the hold's
// fencing token. The owner may take the lock again while it holds it (the
// depth grows and the lease is extended); each Release undoes one
// acquisition and the last frees the lock. Another owner waits, as for
// Redis.Obtain. Every Lease of the hold carries the same fencing token, and
// the watchdog of any of them keeps the whole hold alive.
type Reentrant struct {
	client redis.Scripter
	opt    RedisOptions
	waiter *waiter
}

// NewReentrant returns a reentrant lock on client. Close it when done if
// opt.Subscriber is set.
func NewReentrant(client redis.Scripter, opt RedisOptions) *Reentrant {
	opt = opt.withDefaults()
	// No in-process line: an owner taking the lock again must not queue
	// behind itself. Every waiter is woken by the announced release.
	return &Reentrant{client: client, opt: opt, waiter: newWaiter(opt, false, opt.subscribers())}
}

// Key returns the Redis key of the hash that holds the lock on key.
func (r *Reentrant) Key(key string) string { return r.opt.key(key) }

// Stats reports what the lock's waiters have done so far.
func (r *Reentrant) Stats() Stats { return r.waiter.stats() }

// Close ends the subscription to releases, if there is one.
func (r *Reentrant) Close() error { return r.waiter.close() }

// Obtain takes the lock on key for the owner in ctx, or takes it again if
// that owner holds it already. Without an owner in ctx it returns
// ErrNoOwner.
func (r *Reentrant) Obtain(ctx context.Context, key string) (*Lease, error) {
	owner, ok := OwnerFrom(ctx)
	if !ok {
		return nil, ErrNoOwner
	}
	return r.waiter.obtain(ctx, key, func(ctx, tryCtx context.Context) (*Lease, error) {
		return r.attempt(ctx, tryCtx, key, owner.id)
	}, nil)
}

func (r *Reentrant) attempt(ctx, tryCtx context.Context, key, owner string) (*Lease, error) {
	start := time.Now()
	ttl := r.opt.TTL.Milliseconds()
	fence, err := reentrantObtainScript.Run(tryCtx, r.client, r.opt.obtainKeys(key), owner, ttl, r.waiter.flags(true)).Int64()
	switch {
	case err != nil && tryCtx.Err() != nil:
		return nil, notObtained(tryCtx)
	case err != nil:
		return nil, fmt.Errorf("lock: obtain %q: %w", key, err)
	case fence < 0:
		return nil, ErrNotObtained
	}
	return leaseIn(ctx, r.opt, key, fence, start,
		func(ctx context.Context) (bool, error) {
			keys, args := r.waiter.release(r.Key(key), key, owner)
			n, err := reentrantReleaseScript.Run(ctx, r.client, keys, args...).Int64()
			return n >= 0, err
		},
		func(ctx context.Context) (int64, error) {
			return reentrantRenewScript.Run(ctx, r.client, []string{r.Key(key)}, owner, ttl).Int64()
		}), nil
}
