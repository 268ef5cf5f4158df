// Package lock provides the per-key mutual exclusion that guards the order
// path, in the strengths chosen by SHOP_LOCK_MODE:
//
//   - Redis: a lease in one Redis (SET NX PX with a random token) that a
//     watchdog renews while it is held, with a fencing token per acquisition;
//   - Redlock: the same lease taken on a majority of independent Redis
//     masters, so that losing one master (or a failover that loses its
//     writes) does not hand the lock to a second holder;
//   - MySQL: the seeds' lock table, a row per key with a lease and a fencing
//     counter;
//   - Etcd and ZooKeeper: a key (a znode) in a consensus cluster, held for
//     as long as the process's session lives;
//   - Local: a mutex per key inside one process — the seeds' "synchronized",
//     correct on one replica and useless across several;
//   - None: no exclusion at all.
//
// Every one of them has the same four methods, which are all the order path
// uses: Obtain, ObtainWhile (Obtain that gives up when the caller's reason
// to wait has gone), RaiseFence (repair a fencing counter that fell behind
// the rows it fences) and Stats. Where a family cannot do what a method
// offers, the method says so and does the least: None's ObtainWhile never
// waits, so never calls its check; RaiseFence does nothing where there is
// no counter of the lock's own to raise (Etcd, ZooKeeper, Local, None); and
// Stats counts only what the family does (None's is zero).
//
// Reentrant is the seeds' reentrant lock (a Redis hash of owner and depth)
// for code that takes a lock it may already hold.
//
// All of them hand out a *Lease. A Lease's Context is cancelled when the lease
// is lost (or released), so work done under it aborts instead of running on
// without the lock.
package lock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

var (
	// ErrNotObtained is returned when a lock could not be obtained within the
	// wait budget or before the caller's context ended. It is joined with the
	// context's cause.
	ErrNotObtained = errors.New("lock: not obtained")
	// ErrNotHeld is returned when an operation needs the lock and the caller
	// no longer holds it: its lease expired or was taken over. It is also the
	// cause of a lost lease's Context.
	ErrNotHeld = errors.New("lock: not held")
	// errReleased is the cause of a released lease's Context.
	errReleased = errors.New("lock: released")
)

// Lease is one holding of a lock.
type Lease struct {
	key     string
	fence   int64
	ctx     context.Context
	cancel  context.CancelCauseFunc
	release func(context.Context) error
	// watchdog is closed when the lease's watchdog has stopped; nil when the
	// lease has none (or, with renewals, until it is started).
	watchdog chan struct{}
	// firstRenewal, on the real clock, starts the watchdog when its first
	// renewal is due (see watch), for a lease without renewals.
	firstRenewal *time.Timer
	// renewals, the lock's, on the real clock, starts the watchdog when its
	// first renewal is due (see watch): at due, with validUntil (the
	// lease's end until then), interval and renew. index is the lease's
	// place in renewals' heap, -1 once out of it.
	renewals   *renewals
	due        time.Time
	validUntil time.Time
	interval   time.Duration
	renew      renewFunc
	index      int
	// until is when the lease runs out unless renewed, in Unix nanoseconds;
	// zero for a lease that does not expire.
	until atomic.Int64
	// contended is set by a release that announced the key to a waiter of
	// another process.
	contended atomic.Bool

	once sync.Once
	err  error
}

func newLease(parent context.Context, key string, fence int64, release func(context.Context) error) *Lease {
	ctx, cancel := context.WithCancelCause(parent)
	return &Lease{key: key, fence: fence, ctx: ctx, cancel: cancel, release: release}
}

// Key returns the key the lease is held on.
func (l *Lease) Key() string { return l.key }

// Fence returns the lease's fencing token: larger than the token of every
// earlier lease on the same key. Zero means the lock gives no tokens (Local,
// None), so writes cannot be fenced.
func (l *Lease) Fence() int64 { return l.fence }

// Until returns when the lease runs out unless its watchdog renews it first:
// for a Redlock, the start of the acquisition or renewal plus the TTL, less
// the time allowed for clock drift. It is the zero time for a lease that does
// not expire (Local, None).
func (l *Lease) Until() time.Time {
	if n := l.until.Load(); n != 0 {
		return time.Unix(0, n)
	}
	return time.Time{}
}

// Context is cancelled when the lease is lost or released, or when the
// context passed to Obtain ends. context.Cause tells which; a lost lease has
// a cause that wraps ErrNotHeld.
func (l *Lease) Context() context.Context { return l.ctx }

// Release gives the lock up. It stops the watchdog first, so the lease cannot
// be renewed after it is released. It returns an error wrapping ErrNotHeld if
// the lease had already been lost. Calling Release again returns the first
// result.
func (l *Lease) Release(ctx context.Context) error {
	l.once.Do(func() {
		l.cancel(errReleased)
		switch {
		case l.renewals != nil:
			if !l.renewals.remove(l) {
				<-l.watchdog // started: remove has seen it set
			}
		case l.firstRenewal != nil && l.firstRenewal.Stop():
			// It never started.
		case l.watchdog != nil:
			<-l.watchdog
		}
		l.err = l.release(ctx)
	})
	return l.err
}

// Contended reports, once Release has returned, whether the release was
// announced to a waiter: another process was waiting for the key. Only the
// Redis lock with wake-on-release knows; other leases report false. A holder
// that is about to take the key again can first give that waiter its turn.
func (l *Lease) Contended() bool { return l.contended.Load() }

// notObtained builds the error for a wait that ended without the lock.
func notObtained(ctx context.Context) error {
	cause := context.Cause(ctx)
	if cause == nil { // past its deadline; see ended
		cause = context.DeadlineExceeded
	}
	return errors.Join(ErrNotObtained, cause)
}

// ended reports whether ctx is done or past its deadline. A command whose
// connection deadline came from ctx's (go-redis's ContextTimeoutEnabled)
// fails with a timeout at that instant, while ctx.Err may still be nil
// until ctx's own timer has fired: on a loaded machine a moment later.
func ended(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	d, ok := ctx.Deadline()
	return ok && !time.Now().Before(d)
}

// renewFunc extends a lease that is valid until validUntil and returns until
// when it is valid now. An error wrapping ErrNotHeld means the lease is gone;
// any other error is retried while the lease lasts.
type renewFunc func(ctx context.Context, validUntil time.Time) (time.Time, error)

// watch starts l's watchdog: every interval (sooner if the lease would run
// out first) it calls renew, until l's Context ends. When the lease is gone,
// or runs out while renew keeps failing, it cancels l's Context with a cause
// wrapping ErrNotHeld. after is the timer it sleeps on; nil is the real
// clock, and then nothing runs until the first renewal is due: a lease
// released before that (most are) costs neither a goroutine that Release
// has to wake and wait for nor, with rs (the lock's renewals), a timer of
// its own: starting and stopping a timer per lease wakes another thread of
// the runtime on every Obtain. Without rs it has a timer that Release stops.
func (l *Lease) watch(rs *renewals, after func(time.Duration) <-chan time.Time, interval time.Duration, validUntil time.Time, renew renewFunc) {
	l.until.Store(validUntil.UnixNano())
	switch {
	case after != nil:
		l.watchdog = make(chan struct{})
		go l.renewEvery(after, interval, validUntil, renew, false)
	case rs != nil:
		l.renewals, l.validUntil, l.interval, l.renew = rs, validUntil, interval, renew
		l.due = time.Now().Add(min(interval, time.Until(validUntil)))
		rs.add(l)
	default:
		l.watchdog = make(chan struct{})
		l.firstRenewal = time.AfterFunc(min(interval, time.Until(validUntil)), func() {
			l.renewEvery(time.After, interval, validUntil, renew, true)
		})
	}
}

// renewals starts the watchdogs of one lock's leases, on the real clock,
// when their first renewals are due: a heap of the leases by due time and
// one timer, set for the earliest, that runs only while the lock has leases
// waiting for a first renewal. A lease taken while the timer is set for an
// earlier one costs no timer at all, and one released before it is due only
// leaves the heap; the timer, when it fires, starts the watchdogs that are
// due, and is set again for the next, if any. The zero value is ready.
type renewals struct {
	mu     sync.Mutex
	leases []*Lease // a heap by due
	timer  *time.Timer
	// at is when the timer fires; zero when it is not set.
	at time.Time
}

// add puts l, whose due is set, in the heap, and sets the timer sooner if
// l is due before it.
func (rs *renewals) add(l *Lease) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	l.index = len(rs.leases)
	rs.leases = append(rs.leases, l)
	rs.up(l.index)
	if rs.at.IsZero() || l.due.Before(rs.at) {
		rs.set(l.due)
	}
}

// remove takes l out of the heap and reports whether it was there: its
// watchdog had not started. Otherwise it had, and l.watchdog is set.
func (rs *renewals) remove(l *Lease) bool {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	if l.index < 0 {
		return false
	}
	rs.cut(l.index)
	return true
}

// set sets the timer for at; rs.mu is held.
func (rs *renewals) set(at time.Time) {
	rs.at = at
	if rs.timer == nil {
		rs.timer = time.AfterFunc(time.Until(at), rs.fire)
		return
	}
	rs.timer.Reset(time.Until(at))
}

// fire starts the watchdog of every lease that is due, each on a goroutine
// of its own, and sets the timer for the next. A fire that comes early (a
// timer that was set again while it ran) starts nothing.
func (rs *renewals) fire() {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	rs.at = time.Time{}
	now := time.Now()
	for len(rs.leases) > 0 && !rs.leases[0].due.After(now) {
		l := rs.leases[0]
		rs.cut(0)
		l.watchdog = make(chan struct{})
		go l.renewEvery(time.After, l.interval, l.validUntil, l.renew, true)
	}
	if len(rs.leases) > 0 {
		rs.set(rs.leases[0].due)
	}
}

// cut takes the lease at i out of the heap.
func (rs *renewals) cut(i int) {
	h := rs.leases
	last := len(h) - 1
	h[i].index = -1
	if i != last {
		h[i] = h[last]
		h[i].index = i
	}
	h[last] = nil
	rs.leases = h[:last]
	if i != last {
		rs.down(i)
		rs.up(i)
	}
}

// up and down restore the heap's order around i.
func (rs *renewals) up(i int) {
	h := rs.leases
	for i > 0 {
		p := (i - 1) / 2
		if !h[i].due.Before(h[p].due) {
			return
		}
		rs.swap(i, p)
		i = p
	}
}

func (rs *renewals) down(i int) {
	h := rs.leases
	for {
		c := 2*i + 1
		if c >= len(h) {
			return
		}
		if c+1 < len(h) && h[c+1].due.Before(h[c].due) {
			c++
		}
		if !h[c].due.Before(h[i].due) {
			return
		}
		rs.swap(i, c)
		i = c
	}
}

func (rs *renewals) swap(i, j int) {
	h := rs.leases
	h[i], h[j] = h[j], h[i]
	h[i].index, h[j].index = i, j
}

// renewEvery is the watchdog's loop (see watch), which closes l.watchdog
// when it returns. due says the first renewal is due now.
func (l *Lease) renewEvery(after func(time.Duration) <-chan time.Time, interval time.Duration, validUntil time.Time, renew renewFunc, due bool) {
	defer close(l.watchdog)
	for ; ; due = false {
		if !due {
			select {
			case <-l.ctx.Done():
				return
			case <-after(min(interval, time.Until(validUntil))):
			}
		}
		if l.ctx.Err() != nil {
			return
		}
		next, err := l.renewBy(after, validUntil, renew)
		switch {
		case l.ctx.Err() != nil:
			return
		case err == nil:
			validUntil = next
			l.until.Store(next.UnixNano())
		case errors.Is(err, ErrNotHeld):
			l.cancel(fmt.Errorf("%w: lease on %q was taken over or expired", ErrNotHeld, l.key))
			return
		case errors.Is(err, errUnanswered) || !time.Now().Before(validUntil):
			l.cancel(fmt.Errorf("%w: lease on %q ran out unrenewed: %w", ErrNotHeld, l.key, err))
			return
		}
	}
}

// errUnanswered is the error of a renewal that had not answered when the
// lease ran out.
var errUnanswered = errors.New("renewal unanswered when the lease ran out")

// renewBy calls renew and waits for its answer until validUntil at most
// (on after), then gives up on it with errUnanswered. renew bounds its own
// calls too (leaseIn's by validUntil, Redlock's by the node timeout), but
// the lease must not depend on the client honouring that (a go-redis client
// without ContextTimeoutEnabled waits for its read timeout), nor on every
// renew bounding every wait: a holder that is told late that its lease is
// gone writes on without it.
func (l *Lease) renewBy(after func(time.Duration) <-chan time.Time, validUntil time.Time, renew renewFunc) (time.Time, error) {
	type renewal struct {
		next time.Time
		err  error
	}
	done := make(chan renewal, 1) // an abandoned renewal ends on its own
	go func() {
		next, err := renew(l.ctx, validUntil)
		done <- renewal{next, err}
	}()
	select {
	case r := <-done:
		return r.next, r.err
	case <-l.ctx.Done():
		return validUntil, context.Cause(l.ctx)
	case <-after(time.Until(validUntil)):
		select {
		case r := <-done: // answered just in time
			return r.next, r.err
		default:
			return validUntil, errUnanswered
		}
	}
}
