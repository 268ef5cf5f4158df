package stock

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"math/rand/v2"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"shop/internal/lock"
)

// The sweep gives back the units of lapsed reservations (giveBack, with
// sqlExpirable). Every replica sweeps, and a sale can leave thousands of
// SKUs lapsing together, so the sweep is built to share that work and to
// keep going past what it cannot do:
//
//   - The SKUs are split into sweepShards shards (SKU n is in shard n mod
//     sweepShards). A sweeper walks a shard's SKUs only while it holds the
//     shard's claim, a lease on sweepClaimKey taken from the SKU locks'
//     Locker only if it is free (claim): a shard another sweeper holds is
//     skipped, not waited for. Two replicas' sweeps therefore walk
//     different SKUs at once, each list read after its claim was taken.
//     With a lock that excludes nothing (lock.None) every claim is granted
//     and sweepers may meet on a SKU; the product row's lock and the
//     conditional flip still return each unit once.
//   - Oldest first: the shards are visited in the order of their oldest
//     lapsed pay_by, and a shard's SKUs in the order of theirs.
//   - A SKU's lock is waited for sweepLockWait at most (an order's turn
//     holds it for milliseconds); a SKU still busy then is skipped and left
//     to the next sweep, without an error.
//   - A SKU that fails otherwise (its row fenced above the lock's tokens,
//     MySQL refusing its transaction) is left alone by this Service for a
//     while (sweeper.done), from sweepRetryMin doubling to sweepRetryMax,
//     so that SKUs that always fail cost one try each per backoff and never
//     hold up the others.
//   - One sweep stops starting work after sweepBudget; the next sweep goes
//     on from the oldest again.
const (
	// sweepShards is how many shards the SKUs are split into: enough that
	// a fleet's replicas each find one free, few enough that a sweep asks
	// for their claims in a few round trips.
	sweepShards = 16
	// sweepSKUs bounds the SKUs one visit of a shard walks, beside those
	// it skips because they failed lately.
	sweepSKUs = 100
	// sweepClaimWait is how long a sweeper waits for a shard's claim when
	// its Locker cannot try without waiting (see claim): a claim held is
	// held for a whole walk, so it is skipped at once.
	sweepClaimWait = 20 * time.Millisecond
	// sweepLockWait is how long the sweep waits for a SKU's lock.
	sweepLockWait = 100 * time.Millisecond
	// sweepBudget is how long one sweep starts new work; what it left is
	// the next sweep's.
	sweepBudget = 10 * time.Second
	// sweepRetryMin and sweepRetryMax bound how long a SKU that failed is
	// left out of this Service's sweeps: long beside a sweep, so that one
	// that found many SKUs failing does not find them again in its next
	// round; short beside how long a reservation waits to be paid.
	sweepRetryMin = 15 * time.Second
	sweepRetryMax = 5 * time.Minute
	// sweepErrors is how many failures a sweep's error names; it counts
	// the rest.
	sweepErrors = 5
)

// sweepClaimKey is the key of shard's claim in the SKU locks' Locker.
func sweepClaimKey(shard int64) string { return "sweep:" + strconv.FormatInt(shard, 10) }

// sweeper is what a Service keeps between its sweeps.
type sweeper struct {
	mu     sync.Mutex
	failed map[int64]sweepFailure // SKUs that failed lately
	// oldest is the age of the oldest lapsed reservation still reserved
	// when it was last measured, in microseconds (0: none), and measured
	// when, in Unix microseconds (0: never).
	oldest, measured atomic.Int64
}

// sweepFailure is a SKU that failed in a row tries times; it is not tried
// again before until.
type sweepFailure struct {
	tries int
	until time.Time
}

// skip reports whether sku is to be left alone now. A failure whose wait
// is over is kept until the SKU succeeds (done), so that its next failure
// waits twice as long.
func (w *sweeper) skip(sku int64, now time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	f, ok := w.failed[sku]
	return ok && now.Before(f.until)
}

// failing is how many SKUs have failed lately.
func (w *sweeper) failing() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return len(w.failed)
}

// done records the outcome of sku's return: a success forgets its
// failures, a failure leaves it out for twice as long as the last.
func (w *sweeper) done(sku int64, now time.Time, err error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if err == nil {
		delete(w.failed, sku)
		return
	}
	if w.failed == nil {
		w.failed = map[int64]sweepFailure{}
	}
	f := w.failed[sku]
	f.tries++
	f.until = now.Add(min(sweepRetryMin<<min(f.tries-1, 16), sweepRetryMax))
	w.failed[sku] = f
}

// OldestLapsed is the age, by MySQL's clock, of the oldest reservation whose
// payment window has ended and whose unit is not back yet, as this
// Service's last sweep found it after its work, aged since; zero when that
// sweep found none, or before the first.
func (s *Service) OldestLapsed() time.Duration {
	oldest, at := s.sweep.oldest.Load(), s.sweep.measured.Load()
	if oldest == 0 {
		return 0
	}
	// Aged since, so that a sweeper that stopped sweeping does not show
	// the age it last saw for ever.
	return time.Duration(oldest)*time.Microsecond + s.now().Sub(time.UnixMicro(at))
}

// Sweep gives back the units of lapsed reservations, shard by shard and
// SKU by SKU (see above), each SKU in a transaction of its own under its
// lock (giveBack), until it finds none it can return or its budget is
// spent, and returns how many it gave back. A SKU that fails is left to a
// later sweep, and its error returned with the others'; the other SKUs are
// returned all the same.
func (s *Service) Sweep(ctx context.Context) (int, error) {
	start := time.Now()
	var errs sweepErrs
	total := 0
	for time.Since(start) < sweepBudget && ctx.Err() == nil {
		n, err := s.sweepShards(ctx, start, &errs)
		total += n
		if err != nil {
			errs.add(err)
			break
		}
		if n == 0 {
			break
		}
	}
	s.measureLapsed(ctx)
	return total, errs.err()
}

// sweepShards visits every shard with lapsed reservations once, the one of
// the oldest first, and returns the units it gave back. Failures of SKUs go
// to errs; the error returned is that the shards could not be found.
func (s *Service) sweepShards(ctx context.Context, start time.Time, errs *sweepErrs) (int, error) {
	var shards []int64
	if _, err := read(s.reads.WithContext(ctx), &shards, sqlLapsedShards, sweepShards); err != nil {
		return 0, classify(ctx, "sweep", err)
	}
	total := 0
	for _, shard := range shards {
		if time.Since(start) >= sweepBudget || ctx.Err() != nil {
			break
		}
		claim, done := s.claim(ctx, sweepClaimKey(shard))
		if claim == nil {
			// Another sweeper walks it (or the lock did not answer: the
			// next sweep asks again).
			continue
		}
		n, err := s.sweepShard(ctx, claim.Context(), start, shard, errs)
		done()
		total += n
		if err != nil {
			errs.add(err)
		}
	}
	return total, nil
}

// claim takes the claim key if no other sweeper holds it, without waiting
// for it, and returns it with done, which releases it; nil when it is held
// or the lock did not answer. A TryLocker is asked once, however long its
// answer takes; another Locker (in process, or none) is waited for
// sweepClaimWait at most.
func (s *Service) claim(ctx context.Context, key string) (_ *lock.Lease, done func()) {
	if t, ok := s.locks.(TryLocker); ok {
		l, err := t.TryObtain(ctx, key)
		if err != nil {
			return nil, nil
		}
		return l, func() { s.release(ctx, l) }
	}
	wctx, kept, end := waitWithin(ctx, sweepClaimWait)
	l, err := s.locks.Obtain(wctx, key)
	if err != nil || !kept() {
		if l != nil {
			s.release(ctx, l)
		}
		end()
		return nil, nil
	}
	return l, func() {
		s.release(ctx, l)
		end()
	}
}

// sweepShard walks shard's SKUs with lapsed reservations, the oldest first,
// while its claim, whose context claimed is, lasts, and returns the units
// it gave back. Failures of SKUs go to errs; the error returned is that the
// SKUs could not be found.
func (s *Service) sweepShard(ctx, claimed context.Context, start time.Time, shard int64, errs *sweepErrs) (int, error) {
	var skus []int64
	// Room for the SKUs it will skip, so that they do not fill the list.
	limit := sweepSKUs + s.sweep.failing()
	if _, err := read(s.reads.WithContext(ctx), &skus, sqlLapsedSKUs, sweepShards, shard, limit); err != nil {
		return 0, classify(ctx, "sweep", err)
	}
	total := 0
	for _, sku := range skus {
		if time.Since(start) >= sweepBudget || claimed.Err() != nil {
			break
		}
		if s.sweep.skip(sku, s.now()) {
			continue
		}
		n, err := s.giveBack(withLockWait(ctx, sweepLockWait), sku, StatusExpired, sqlExpirable)
		total += n
		switch {
		case err == nil:
			s.sweep.done(sku, s.now(), nil)
		case errors.Is(err, errWaitEnded) || ctx.Err() != nil:
			// Busy: an order's turn holds the SKU. Not a failure of the
			// SKU, and the next sweep tries it again.
		default:
			s.sweep.done(sku, s.now(), err)
			errs.add(fmt.Errorf("sku %d: %w", sku, err))
		}
	}
	return total, nil
}

// measureLapsed measures the age of the oldest lapsed reservation still
// reserved, for OldestLapsed. A measure that fails keeps the last one,
// which goes on ageing.
func (s *Service) measureLapsed(ctx context.Context) {
	var age sql.NullInt64
	if _, err := read(s.reads.WithContext(ctx), &age, sqlOldestLapsed); err != nil {
		return
	}
	s.sweep.oldest.Store(max(age.Int64, 0)) // NULL, none, scans as 0
	s.sweep.measured.Store(s.now().UnixMicro())
}

// sweepErrs collects a sweep's failures: the first sweepErrors of them, and
// how many there were.
type sweepErrs struct {
	first []error
	n     int
}

func (e *sweepErrs) add(err error) {
	e.n++
	if len(e.first) < sweepErrors {
		e.first = append(e.first, err)
	}
}

func (e *sweepErrs) err() error {
	if e.n > len(e.first) {
		return errors.Join(append(e.first, fmt.Errorf("and %d more", e.n-len(e.first)))...)
	}
	return errors.Join(e.first...)
}

// RunSweeper sweeps (Sweep) every interval, give or take a fifth, at
// random, so that replicas started together do not sweep in step, until
// ctx ends. Failures are logged: the next sweep tries again.
func (s *Service) RunSweeper(ctx context.Context, interval time.Duration) {
	for {
		d := time.Duration(float64(interval) * (0.8 + 0.4*rand.Float64()))
		select {
		case <-ctx.Done():
			return
		case <-time.After(d):
		}
		sctx, cancel := context.WithTimeout(ctx, TurnTimeout)
		n, err := s.Sweep(sctx)
		cancel()
		if err != nil && ctx.Err() == nil {
			s.log.WarnContext(ctx, "sweep lapsed reservations", "returned", n, "err", err)
		} else if n > 0 {
			s.log.InfoContext(ctx, "swept lapsed reservations", "returned", n)
		}
	}
}

// errWaitEnded is the cause of a wait bounded by waitWithin that ended.
var errWaitEnded = errors.New("stock: waited long enough")

// waitWithin returns a context to wait on that ends d from now (with cause
// errWaitEnded), or with ctx; kept, called once what was waited for is
// had, lets the context live as long as ctx, and reports false when the
// wait had ended first (what was had is then on an ended context); and
// end, which ends the context and must be called once it is no longer
// needed.
func waitWithin(ctx context.Context, d time.Duration) (_ context.Context, kept func() bool, end func()) {
	wctx, cancel := context.WithCancelCause(ctx)
	t := time.AfterFunc(d, func() { cancel(errWaitEnded) })
	return wctx, t.Stop, func() {
		t.Stop()
		cancel(nil)
	}
}

// lockWaitKey is the key of the bound withLockWait puts on a context.
type lockWaitKey struct{}

// withLockWait bounds how long withLease, run on the context it returns,
// waits for its slot and its SKU's lock: d, instead of the lock's own wait.
// A wait that ends first is ErrBusy wrapping errWaitEnded. The sweep uses
// it, to skip a busy SKU rather than wait for it.
func withLockWait(ctx context.Context, d time.Duration) context.Context {
	return context.WithValue(ctx, lockWaitKey{}, d)
}

// leaseWait is the context withLease waits on for its slot and lock, as
// withLockWait bounds it (or ctx itself), with waitWithin's kept and end.
func leaseWait(ctx context.Context) (_ context.Context, kept func() bool, end func()) {
	d, ok := ctx.Value(lockWaitKey{}).(time.Duration)
	if !ok {
		return ctx, func() bool { return true }, func() {}
	}
	return waitWithin(ctx, d)
}
