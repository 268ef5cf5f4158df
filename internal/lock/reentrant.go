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
// owner, the hold's id, how many times the owner has taken the lock (its
// depth), the hold's fencing token and a field per acquisition. The owner
// may take the lock again while it holds it (the depth grows and the lease
// is extended); each Release undoes one acquisition and the last frees the
// lock. Another owner waits, as for Redis.Obtain. Every Lease of the hold
// carries the same fencing token, and the watchdog of any of them keeps the
// whole hold alive.
//
// A hold has an identity: a random id that its first acquisition stores and
// every re-acquisition returns. Releases and renewals compare the owner and
// the hold's id, so a lease of a hold that ended (expired while its owner
// was stopped, lost with its Redis) can neither free nor extend a later
// hold of the same owner. Each acquisition has its own id as well, so that
// it is undone exactly once and only in its own hold: by its Release,
// retried or not, or by the clean-up of an attempt whose reply was lost,
// which cannot know whether it started a hold or joined one.
type Reentrant struct {
	client   redis.Scripter
	opt      RedisOptions
	waiter   *waiter
	renewals renewals
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
	acq := rand.Text()
	start := time.Now()
	hold, fence, err := r.take(tryCtx, key, owner, acq)
	if err := settle(tryCtx, key, start, r.opt.TTL, fence, err, func() { r.cleanup(ctx, key, owner, acq) }); err != nil {
		return nil, err
	}
	ttl := r.opt.TTL.Milliseconds()
	return leaseIn(ctx, r.opt, &r.renewals, key, fence, start,
		func(ctx context.Context) (bool, error) {
			n, err := r.release(ctx, key, owner, hold, acq)
			return n >= 0, err
		},
		func(ctx context.Context) (int64, error) {
			return reentrantRenewScript.Run(ctx, r.client, []string{r.Key(key)}, owner, hold, ttl).Int64()
		}), nil
}

// take runs the obtain script for owner's acquisition acq and returns the
// hold's id and fencing token, or a token of -1 when another owner holds the
// lock.
func (r *Reentrant) take(ctx context.Context, key, owner, acq string) (hold string, fence int64, err error) {
	reply, err := reentrantObtainScript.Run(ctx, r.client, r.opt.obtainKeys(key), owner, r.opt.TTL.Milliseconds(),
		r.waiter.flags(true), acq).Slice()
	if err != nil {
		return "", -1, err
	}
	if len(reply) == 2 {
		// Nil for a hold taken by a version without hold ids: a lease
		// that joins it is given up at its first renewal.
		hold, _ = reply[0].(string)
		if fence, ok := reply[1].(int64); ok {
			return hold, fence, nil
		}
	}
	return "", -1, fmt.Errorf("unexpected reply %v", reply)
}

// cleanup undoes owner's acquisition acq, if it happened, after an attempt
// that failed: whichever hold it started or joined.
func (r *Reentrant) cleanup(ctx context.Context, key, owner, acq string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
	defer cancel()
	_, _ = r.release(ctx, key, owner, "", acq)
}

// release undoes owner's acquisition acq of hold (any hold if empty) and
// returns the depth left, or -1 if the acquisition is not in the owner's
// hold. A -1 that follows a try whose reply was lost is that try's release,
// and answers 0.
func (r *Reentrant) release(ctx context.Context, key, owner, hold, acq string) (int64, error) {
	keys, args := r.waiter.release(r.Key(key), key, owner, hold, acq)
	n, lost, err := retryLost(ctx, func(ctx context.Context) (int64, error) {
		return reentrantReleaseScript.Run(ctx, r.client, keys, args...).Int64()
	})
	if err == nil && lost && n < 0 {
		n = 0
	}
	return n, err
}
