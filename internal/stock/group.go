package stock

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"sync"

	"gorm.io/gorm"

	"shop/internal/lock"
	"shop/internal/mysqldb"
)

// A group is the batches of several SKUs, each under its own SKU's lock,
// placed in one transaction with one COMMIT. A drain that has taken its
// batch hands it to the group committer as a part and waits; the parts that
// wait while the groups in flight commit form the next group, up to
// Settings.Group parts, never waiting for more. A group of one is the same
// code: with Settings.Group 1 (the default) no part ever waits, and each
// batch is its own transaction.
//
// Each part stays fenced by its own lease's token: its statements are the
// batch's (batch.go), one guarded UPDATE per SKU with AND fence < token. A
// part's outcome never costs the others theirs:
//
//   - a part that MySQL refuses without a write of its own — a stale fence,
//     no unit left, no such product — is answered its refusal after the
//     COMMIT of the rest;
//   - a part that wrote and then met what it cannot judge (an order its
//     buyers hold already, a counter that refuses) rolls the transaction
//     back, and the group runs again with that part careful: the others'
//     buyers never see it;
//   - a part whose lease is lost, or whose earliest buyer's deadline comes,
//     before the COMMIT rolls the transaction back too; that part is
//     answered ErrBusy, as a batch alone would be, and the rest runs again
//     without it;
//   - a COMMIT whose answer is lost is ErrOutcomeUnknown for every part:
//     MySQL committed all of them or none.
//
// Groups of different replicas never lock the same product's row at once
// while the lock excludes: each product is in the group of its lock's
// holder only. Where it does not (lock.None, lock.Local on several
// replicas), a group's batches run in the order of their SKUs, so that two
// groups lock the products' rows in one order.

// errRedo rolls a group's transaction back so that it runs again.
var errRedo = errors.New("stock: the group runs again")

// part is one SKU's batch in a group, and what the group decided for it.
type part struct {
	lease *lock.Lease
	sku   int64
	batch []*ticket
	// ctx ends at the earliest deadline of the batch's buyers, or when the
	// lease is lost: the part is then answered ErrBusy, and the group goes
	// on without it.
	ctx     context.Context
	careful bool // the next attempt reads before it writes
	tries   int  // careful attempts so far

	sale sale
	err  error
	// out is set once the part's outcome is decided before its group's
	// COMMIT: it takes no part in the transaction.
	out bool

	lead  chan []*part  // the group this part's goroutine is to run
	done  chan struct{} // closed once sale and err are final
	after func()        // what Hooks.BeforeWrite returned in the last attempt
}

// grouper forms the groups of a Service.
type grouper struct {
	mu      sync.Mutex
	waiting []*part
	running int // groups in flight
}

// groupsInFlight is how many groups a Service commits at once: with groups
// of one, as many as there are batches (each drain holds a slot); with
// larger ones, as many as fill the slots, and at least one. The parts that
// arrive meanwhile wait, and form the next group.
func (s *Service) groupsInFlight() int {
	if s.set.Group <= 1 {
		return int(^uint(0) >> 1)
	}
	return max(1, s.set.Concurrency/s.set.Group)
}

// commit places p's batch in a group's transaction and returns once its
// outcome (p.sale, p.err) is final.
func (s *Service) commit(p *part) {
	g := &s.group
	g.mu.Lock()
	if g.running < s.groupsInFlight() {
		g.running++
		g.mu.Unlock()
		s.runGroup([]*part{p})
		return
	}
	p.lead = make(chan []*part, 1)
	g.waiting = append(g.waiting, p)
	g.mu.Unlock()
	select {
	case <-p.done:
		return
	case parts := <-p.lead:
		s.runGroup(parts)
		return
	case <-p.ctx.Done():
	}
	// Its buyers' deadline came, or its lease was lost, while it waited:
	// answered now, unless a group has taken it meanwhile.
	g.mu.Lock()
	if i := slices.Index(g.waiting, p); i >= 0 {
		g.waiting = slices.Delete(g.waiting, i, i+1)
		g.mu.Unlock()
		p.err = p.ended()
		return
	}
	g.mu.Unlock()
	select {
	case <-p.done:
	case parts := <-p.lead:
		s.runGroup(parts)
	}
}

// ended is the answer of a part whose context ended before its COMMIT.
func (p *part) ended() error {
	return fmt.Errorf("%w: sku %d: %w", ErrBusy, p.sku, context.Cause(p.ctx))
}

// runGroup runs parts' transaction, hands the lead to the parts that
// waited meanwhile, and then tells parts their outcome.
func (s *Service) runGroup(parts []*part) {
	orders := 0
	for _, p := range parts {
		orders += len(p.batch)
	}
	s.count(orders)
	s.groupTx(parts)

	g := &s.group
	g.mu.Lock()
	if len(g.waiting) > 0 {
		n := min(len(g.waiting), max(1, s.set.Group))
		next := g.waiting[:n:n]
		g.waiting = g.waiting[n:]
		next[0].lead <- next
	} else {
		g.running--
	}
	g.mu.Unlock()
	for _, p := range parts {
		close(p.done)
	}
}

// groupTx runs the transaction of parts as many times as it must: fast
// first (but for the naive update), then careful for a part that needs it,
// at most maxCareful times; each run leaves out the parts decided since.
// The parts run in the order of their SKUs, so that two groups lock the
// products' rows in one order and never wait for each other in a cycle:
// without a lock that excludes (lock.None), or across replicas with one
// that does not (lock.Local), two groups may hold batches of one SKU.
func (s *Service) groupTx(parts []*part) {
	parts = slices.SortedStableFunc(slices.Values(parts), func(a, b *part) int { return cmp.Compare(a.sku, b.sku) })
	for {
		live := parts[:0:0]
		for _, p := range parts {
			if !p.out && p.ctx.Err() != nil {
				p.out, p.err = true, p.ended()
			}
			if !p.out {
				live = append(live, p)
			}
		}
		if len(live) == 0 || !s.attempt(live) {
			return
		}
	}
}

// attempt is one run of the transaction of live, each part's batch after
// the other's in one transaction on a context that ends when any part's
// does. It reports whether the group must run again; otherwise each part's
// outcome is set.
func (s *Service) attempt(live []*part) (again bool) {
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	for _, p := range live {
		stop := context.AfterFunc(p.ctx, func() { cancel(context.Cause(p.ctx)) })
		defer stop()
	}
	sales := make([]sale, len(live))
	refused := make([]error, len(live))
	var redo *part
	var redoErr error
	err := s.transaction(ctx, ErrOutcomeUnknown, groupAbout(live), func(tx *gorm.DB) error {
		for i, p := range live {
			p.after = nil
			sl, err := s.sellIn(ctx, tx, &p.after, p.lease.Fence(), p.sku, p.batch, p.careful || s.set.Update == Naive)
			switch {
			case err == nil:
				sales[i] = sl
			case errors.Is(err, errCareful) || mysqldb.Duplicate(err):
				redo, redoErr = p, err
				return errRedo
			case refusedUnwritten(err):
				refused[i] = err
			default:
				return err
			}
		}
		return nil
	})
	for _, p := range live {
		if p.after != nil {
			p.after()
			p.after = nil
		}
	}
	switch {
	case errors.Is(err, ErrOutcomeUnknown):
	case redo != nil && errors.Is(err, errRedo):
		redo.careful = true
		if redo.tries++; redo.tries > maxCareful {
			redo.out, redo.err = true, fmt.Errorf("%w: sku %d: orders of the same buyers came in during each of %d attempts: %w", ErrBusy, redo.sku, redo.tries, redoErr)
		}
		return true
	case err != nil:
		// A part that ended rolled back the whole transaction: answer
		// it, and run the others again.
		ended := false
		for _, p := range live {
			if p.ctx.Err() != nil {
				p.out, p.err, ended = true, classifyTx(p.ctx, err), true
			}
		}
		if ended && len(live) > 1 {
			return true
		}
	}
	for i, p := range live {
		switch {
		case p.out:
		case err != nil:
			p.err = err
		case refused[i] != nil:
			p.err = refused[i]
		default:
			p.sale = sales[i]
		}
	}
	return false
}

// refusedUnwritten reports whether err is a part's refusal that MySQL's
// answers decided after the part had written nothing: the transaction goes
// on for the other parts.
func refusedUnwritten(err error) bool {
	return errors.Is(err, ErrStaleFence) || errors.Is(err, ErrSoldOut) || errors.Is(err, ErrNotFound) || errors.Is(err, ErrBusy)
}

// groupAbout names a group's transaction in its errors: its lock keys.
func groupAbout(live []*part) string {
	if len(live) == 1 {
		return live[0].lease.Key()
	}
	about := live[0].lease.Key()
	for _, p := range live[1:] {
		about += "," + p.lease.Key()
	}
	return about
}
