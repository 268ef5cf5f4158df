package lock

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// Redlock is a lock held on a majority of N independent Redis masters (the
// seeds' RedLock), so that one master that dies, or fails over to a replica
// that never saw the lock, cannot hand the lock to a second holder.
//
// An attempt sends the obtain script to every node at once and waits at most
// NodeTimeout for each reply. It has the lock if a majority granted it and
// time is left: the lease is valid until start + TTL − drift, where start is
// taken before the first command was sent and drift = TTL/100 + 2ms allows for
// the nodes' clocks running at different rates. Otherwise it releases
// whatever it took, on every node (a node that timed out may still have
// granted it). The watchdog renews on every node and keeps the lease while a
// majority confirms it; once more than a minority deny it, the lease is lost.
// Release deletes the lock on every node.
//
// # Fencing tokens
//
// Each node keeps a counter per key, but the nodes' counters disagree: a node
// may have been down during some acquisitions, or may come back empty. A
// counter INCRemented on one node is therefore not monotonic. Instead the
// token is agreed on by majorities, in two rounds:
//
//  1. the obtain script, run under the node's share of the lock, returns the
//     node's counter; the holder takes the maximum m over the majority that
//     granted the lock;
//  2. the holder writes m+1 to the nodes it holds (the fence script raises a
//     counter, never lowers it, and only while the caller holds that node's
//     share) and uses the token only once a majority has stored it.
//
// Any two majorities of the same N nodes share a node, so an acquisition
// that starts after an earlier holder stored its token reads at least that
// token and issues a larger one, even if a node outside that majority lost
// everything. Two holders that overlap (which the lock itself should
// prevent, but a pause longer than the lease can cause) may draw the same
// token; the database's strict fence < token check refuses the second of
// them. Each node answers max(counter, its clock in microseconds), as the
// single Redis lock draws its tokens, so even a majority restarted empty, or
// restored from older snapshots, issues tokens above those already written
// while the clocks move forward. Where they cannot (counters above any
// clock), a node of that majority that comes back empty may leave the token
// on a minority — the third of three nodes stores it only if its grant came
// in time for the fence round — and the next token may be smaller: the
// database refuses its writes, and RaiseFence repairs the counters.
//
// # Waiters
//
// With wake-on-release, an attempt that finds the lock held flags it as
// waited for on every node it reaches, in the obtain script itself, and the
// waiters listen for releases on every node: each node's release announces
// the key where it was flagged. A master that hangs or dies holds up
// neither: any majority still flags and announces.
type Redlock struct {
	nodes  []redis.Scripter
	quorum int
	opt    RedisOptions
	drift  time.Duration
	waiter *waiter
}

// NewRedlock returns a lock on the given independent masters; use an odd
// number of them, three or more. Their clients should not retry commands by
// themselves (see Client). opt.NodeTimeout bounds each node's reply.
// opt.Subscriber, if set, turns on wake-on-release: the waiters then listen
// on every node that is a Subscriber itself (a *redis.Client is), or on
// opt.Subscriber alone when none is.
func NewRedlock(nodes []redis.Scripter, opt RedisOptions) (*Redlock, error) {
	if len(nodes) == 0 {
		return nil, errors.New("lock: redlock needs at least one node")
	}
	opt = opt.withDefaults()
	return &Redlock{
		nodes:  nodes,
		quorum: len(nodes)/2 + 1,
		opt:    opt,
		drift:  opt.TTL/100 + 2*time.Millisecond,
		waiter: newWaiter(opt, true, nodeSubscribers(nodes, opt.Subscriber)),
	}, nil
}

// nodeSubscribers returns where a Redlock's waiters listen for releases:
// every node that is a Subscriber, or sub when none is. None when sub is
// nil.
func nodeSubscribers(nodes []redis.Scripter, sub Subscriber) []Subscriber {
	if sub == nil {
		return nil
	}
	var subs []Subscriber
	for _, node := range nodes {
		if s, ok := node.(Subscriber); ok {
			subs = append(subs, s)
		}
	}
	if len(subs) == 0 {
		return []Subscriber{sub}
	}
	return subs
}

// Key returns the Redis key that holds the lock on key, on every node.
func (r *Redlock) Key(key string) string { return r.opt.key(key) }

// Stats reports what the lock's waiters have done so far.
func (r *Redlock) Stats() Stats { return r.waiter.stats() }

// Close ends the subscription to releases, if there is one.
func (r *Redlock) Close() error { return r.waiter.close() }

// Obtain takes the lock on key on a majority of the nodes, waiting as
// Redis.Obtain does. When no majority can answer at all it returns the
// nodes' errors at once.
func (r *Redlock) Obtain(ctx context.Context, key string) (*Lease, error) {
	return r.ObtainWhile(ctx, key, nil)
}

// ObtainWhile is Obtain that gives up as Redis.ObtainWhile does.
func (r *Redlock) ObtainWhile(ctx context.Context, key string, still func(context.Context) error) (*Lease, error) {
	return r.waiter.obtain(ctx, key, func(ctx, tryCtx context.Context) (*Lease, error) {
		return r.attempt(ctx, tryCtx, key, true)
	}, still)
}

// TryObtain takes the lock on key if a majority grants it at once and
// otherwise returns ErrNotObtained (or the nodes' errors) without waiting.
func (r *Redlock) TryObtain(ctx context.Context, key string) (*Lease, error) {
	return r.waiter.tryObtain(ctx, key, func(ctx, tryCtx context.Context) (*Lease, error) {
		return r.attempt(ctx, tryCtx, key, false)
	})
}

// RaiseFence raises key's fencing counter to at least atLeast on every node
// it reaches, and never lowers one, so that the next acquisition's token is
// above atLeast: see Redis.RaiseFence. It succeeds once a majority has
// stored it (any later majority includes one of them); a slower node still
// gets it within the node timeout.
func (r *Redlock) RaiseFence(ctx context.Context, key string, atLeast int64) error {
	if err := r.opt.raising(key, atLeast); err != nil {
		return err
	}
	counter := r.Key(key) + fenceSuffix
	replies := r.each(ctx, 1, func(ctx context.Context, node redis.Scripter) (int64, error) {
		n, _, err := retryLost(ctx, func(ctx context.Context) (int64, error) {
			return raiseScript.Run(ctx, node, []string{counter}, atLeast).Int64()
		})
		return n, err
	}, nil)
	if stored, _, errs := tally(replies, 1); stored < r.quorum {
		return fmt.Errorf("lock: raise fence %q: %d of %d nodes stored it: %w", key, stored, len(r.nodes), errors.Join(errs...))
	}
	return nil
}

// reply is one node's answer.
type reply struct {
	n   int64
	err error
}

var errNoReply = errors.New("no reply within the node timeout")

// each runs f on every node at once, each under the node timeout, and
// returns the replies in node order as soon as the outcome is known: a
// majority said yes (n ≥ yes) or can no longer say it. It does not wait for
// a node past that, or past the timeout; that node's reply is errNoReply,
// and if late is not nil it is called with the node once f returns there.
func (r *Redlock) each(ctx context.Context, yes int64, f func(context.Context, redis.Scripter) (int64, error), late func(redis.Scripter)) []reply {
	// The calls are not cut short when each returns early, nor when ctx
	// ends: a slower node still gets its command (a grant the lease's
	// release will find, a renewal) within the node timeout.
	callCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.opt.NodeTimeout)
	var running sync.WaitGroup
	defer func() {
		go func() {
			running.Wait()
			cancel()
		}()
	}()
	type indexed struct {
		i int
		reply
	}
	ch := make(chan indexed)
	gone := make(chan struct{}) // closed when replies are no longer taken
	defer close(gone)
	for i, node := range r.nodes {
		running.Go(func() {
			n, err := f(callCtx, node)
			select {
			case ch <- indexed{i, reply{n, err}}:
			case <-gone:
				if late != nil {
					late(node)
				}
			}
		})
	}
	replies := make([]reply, len(r.nodes))
	for i := range replies {
		replies[i].err = errNoReply
	}
	ok, notOK := 0, 0
	for ok < r.quorum && notOK <= len(r.nodes)-r.quorum {
		select {
		case x := <-ch:
			replies[x.i] = x.reply
			if x.err == nil && x.n >= yes {
				ok++
			} else {
				notOK++
			}
		case <-callCtx.Done():
			return replies
		case <-ctx.Done():
			return replies
		}
	}
	return replies
}

// tally counts the nodes that said yes (n ≥ yes), said no, and failed.
func tally(replies []reply, yes int64) (ok, no int, errs []error) {
	for _, rep := range replies {
		switch {
		case rep.err != nil:
			errs = append(errs, rep.err)
		case rep.n >= yes:
			ok++
		default:
			no++
		}
	}
	return ok, no, errs
}

// unreachable returns the errors that are not timeouts.
func unreachable(errs []error) []error {
	var down []error
	for _, err := range errs {
		var ne net.Error
		timeout := errors.Is(err, errNoReply) || errors.Is(err, context.DeadlineExceeded) ||
			errors.Is(err, context.Canceled) || (errors.As(err, &ne) && ne.Timeout())
		if !timeout {
			down = append(down, err)
		}
	}
	return down
}

// attempt tries to take key on a majority, under tryCtx; the lease lives on
// ctx. wait says the caller will wait for the key if it is held.
func (r *Redlock) attempt(ctx, tryCtx context.Context, key string, wait bool) (*Lease, error) {
	token := rand.Text()
	keys := r.opt.obtainKeys(key)
	flag := r.waiter.flags(wait)
	ttl := r.opt.TTL.Milliseconds()
	start := time.Now()
	validUntil := start.Add(r.opt.TTL - r.drift)

	// A node that answers too late may have granted the lock after the
	// attempt gave up and cleaned up, or after the lease was released: its
	// share is given back then. (Once the grant has landed, the lease's own
	// release reaches it.)
	var failed, released atomic.Bool
	decided := make(chan struct{})
	grants := r.each(tryCtx, 0, func(ctx context.Context, node redis.Scripter) (int64, error) {
		return redlockObtainScript.Run(ctx, node, keys, token, ttl, flag).Int64()
	}, func(node redis.Scripter) {
		if <-decided; failed.Load() || released.Load() {
			r.releaseOn(ctx, node, key, token)
		}
	})
	defer close(decided)
	held, _, errs := tally(grants, 0)
	if held < r.quorum || !time.Now().Before(validUntil) {
		failed.Store(true)
		r.cleanup(ctx, key, token, grants)
		// Nodes that refuse connections will not come back within the
		// wait: report the outage at once. Slow nodes are retried.
		if down := unreachable(errs); len(down) > len(r.nodes)-r.quorum {
			return nil, fmt.Errorf("lock: obtain %q: %d of %d nodes unreachable: %w",
				key, len(down), len(r.nodes), errors.Join(down...))
		}
		return nil, ErrNotObtained
	}

	var fence int64
	if !r.opt.NoFencing {
		for _, rep := range grants {
			if rep.err == nil {
				fence = max(fence, rep.n+1)
			}
		}
		fenceKeys := []string{keys[0], r.Key(key) + fenceSuffix}
		replies := r.each(tryCtx, 1, func(ctx context.Context, node redis.Scripter) (int64, error) {
			return redlockFenceScript.Run(ctx, node, fenceKeys, token, fence).Int64()
		}, nil)
		if stored, _, _ := tally(replies, 1); stored < r.quorum || !time.Now().Before(validUntil) {
			failed.Store(true)
			r.cleanup(ctx, key, token, grants)
			return nil, ErrNotObtained
		}
	}

	var l *Lease
	l = newLease(ctx, key, fence, func(ctx context.Context) error {
		// A grant still on its way to a slow node may land after the
		// release there: it is given back when it has (above). The release
		// does not wait for it, so a hung node does not hold it up.
		released.Store(true)
		err := r.release(ctx, key, token)
		if cause := context.Cause(l.ctx); err == nil && errors.Is(cause, ErrNotHeld) {
			// Released where it was left, but it had been lost.
			return fmt.Errorf("lock: release %q: %w", key, cause)
		}
		return err
	})
	l.watch(nil, r.opt.After, r.opt.TTL/3, validUntil, func(ctx context.Context, validUntil time.Time) (time.Time, error) {
		start := time.Now()
		replies := r.each(ctx, 1, func(ctx context.Context, node redis.Scripter) (int64, error) {
			return renewScript.Run(ctx, node, []string{r.Key(key)}, token, ttl).Int64()
		}, nil)
		ok, no, errs := tally(replies, 1)
		switch {
		case ok >= r.quorum:
			return start.Add(r.opt.TTL - r.drift), nil
		case no > len(r.nodes)-r.quorum:
			return validUntil, ErrNotHeld
		}
		return validUntil, fmt.Errorf("lock: renew %q: %d of %d nodes confirmed: %w", key, ok, len(r.nodes), errors.Join(errs...))
	})
	return l, nil
}

// cleanup gives back what an attempt that failed may hold, by the nodes'
// replies to its obtain script (grants): it waits, within the node
// timeout, for the nodes that granted it; it releases in the background
// where the reply was an error (the script may have run); a node that has
// not answered is left to the attempt's late call, which releases it once
// it has. So a node that hangs does not hold up the attempt's caller. It
// does not announce the release: the lock was never held, and waking the
// other contenders of a split vote at once would only split it again — they
// retry on their jittered backoff instead.
func (r *Redlock) cleanup(ctx context.Context, key, token string, grants []reply) {
	granted, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.opt.NodeTimeout)
	defer cancel()
	var releasing sync.WaitGroup
	for i, node := range r.nodes {
		switch rep := grants[i]; {
		case rep.err == nil && rep.n >= 0:
			releasing.Go(func() { _, _ = r.releaseNode(granted, node, []string{r.Key(key)}, token) })
		case rep.err != nil && !errors.Is(rep.err, errNoReply):
			go r.releaseOn(ctx, node, key, token)
		}
	}
	releasing.Wait()
}

// releaseOn gives back token's share of key on one node, in the background
// of an attempt or a release that did not wait for it, with a second chance
// as long as a lease could last.
func (r *Redlock) releaseOn(ctx context.Context, node redis.Scripter, key, token string) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.opt.TTL)
	defer cancel()
	_, _ = r.releaseNode(ctx, node, []string{r.Key(key)}, token)
}

// releaseNode runs the release script on one node (see releaseLost).
func (r *Redlock) releaseNode(ctx context.Context, node redis.Scripter, keys []string, args ...any) (int64, error) {
	return releaseLost(ctx, func(ctx context.Context) (int64, error) {
		return releaseScript.Run(ctx, node, keys, args...).Int64()
	})
}

// release deletes the lock on every node where token holds it, and tells
// the key's waiters where they flagged it. It succeeds when the lock is free
// on a majority and was released on at least one node; ErrNotHeld when no
// node had it any more.
func (r *Redlock) release(ctx context.Context, key, token string) error {
	keys, args := r.waiter.release(r.Key(key), key, token)
	replies := r.each(ctx, 1, func(ctx context.Context, node redis.Scripter) (int64, error) {
		return r.releaseNode(ctx, node, keys, args...)
	}, func(node redis.Scripter) { r.releaseOn(ctx, node, key, token) })
	released, no, errs := tally(replies, 1)
	switch {
	case released+no < r.quorum:
		return fmt.Errorf("lock: release %q: %d of %d nodes confirmed: %w", key, released, len(r.nodes), errors.Join(errs...))
	case released == 0:
		return fmt.Errorf("lock: release %q: %w", key, ErrNotHeld)
	}
	// Free on a majority; a node that did not answer lets its share expire.
	return nil
}
