package stock

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"
)

// soldOut is what one replica remembers of the products found sold out —
// by itself, or by another replica that said so (Service.SoldOutElsewhere)
// — so that later orders for them are refused without a round trip to
// MySQL or Redis.
//
// Stock goes up again only when the catalog is reseeded, a product
// restocked or units returned, and then the memory must not refuse: a
// raise clears it (every replica is told through a broadcast, see
// Service.Raised), and each entry also lapses, so that a broadcast that
// was missed — or a change made behind the service's back — costs a
// bounded time of refusals: ttl for this replica's own findings, which it
// made with a read of its own, and heardTTL, a few seconds, for those
// heard from another replica, which this one cannot check.
//
// A finding must not outlive a raise that came after it:
//
//   - this replica's own finding, made by a transaction that began before
//     a raise, is dropped: marks carry the generation read before the
//     product was, and a raise moves the generation on;
//   - another replica's finding carries the SKU's fencing token of the hold
//     that took the last unit — which moved the row's fence to it, so that
//     every later raise of the stock, a return or a restock, is made under
//     a later token — and is dropped when a raise with a later token has
//     been heard; a finding heard within quiet of a raise of its SKU (or of
//     every product) is dropped too, since a raise made without a token (a
//     seed, a restock with fencing off) cannot be ordered against it. The
//     quiet window is no bound — a PUBLISH may run later still — so what
//     slips past it lapses after heardTTL.
type soldOut struct {
	ttl      time.Duration
	heardTTL time.Duration
	quiet    time.Duration
	now      func() time.Time

	mu     sync.Mutex
	gen    uint64
	skus   map[int64]time.Time // when each entry lapses
	raised map[int64]raise     // the last raise of each SKU, while it matters
	allAt  time.Time           // the last raise of every product
	known  int                 // entries added since the last sweep
}

// ForgetSoldOut makes this Service forget that product sku (every product
// when sku is 0) was sold out: call it on every replica when stock goes up,
// after the change has committed. It is Raised without a fencing token.
func (s *Service) ForgetSoldOut(sku int64) { s.Raised(sku, 0) }

// Raised makes this Service forget that product sku (every product when sku
// is 0) was sold out, as ForgetSoldOut does, for a change made under the
// SKU's lock with fencing token fence: a finding that it sold out made
// under an older token, heard later, is not believed (SoldOutElsewhere).
func (s *Service) Raised(sku, fence int64) { s.soldOut.raise(sku, fence) }

// KnownSoldOut reports whether this Service refuses sku's orders from
// memory, found sold out here or elsewhere (PlaceOrder answers them
// ErrSoldOut without a round trip, but for a key's replay).
func (s *Service) KnownSoldOut(sku int64) bool { return s.soldOut.has(sku) }

// SoldOutElsewhere tells this Service that another replica's hold with
// fencing token fence took product sku's last unit, so that it refuses the
// product's orders from memory too, without a read of its own, for
// SoldOutHeardTTL. A finding older than a raise heard already is dropped
// (see soldOut).
func (s *Service) SoldOutElsewhere(sku, fence int64) {
	if sku > 0 && fence > 0 {
		s.soldOut.heard(sku, fence)
	}
}

// soldOutError is ErrSoldOut for product sku.
func soldOutError(sku int64) error { return fmt.Errorf("%w: sku %d", ErrSoldOut, sku) }

// stocked reads sku's stock and sale window before its lock, remembering a
// product found sold out, and its window. A drain reads only a product it
// knew sold out until lately (soldOut.lapsed): one with stock goes straight
// to the lock, whose transaction refuses what the read would have.
// Errors: ErrNotFound, ErrSoldOut, and MySQL's.
func (s *Service) stocked(ctx context.Context, sku int64) (Product, error) {
	gen, seen := s.soldOut.generation(), s.windows.seen()
	var p Product
	err := readProduct(s.reads.WithContext(ctx), &p, sqlStockOf, sku)
	if err == nil {
		s.windows.learn(sku, p.window(), seen)
		if p.Stock <= 0 {
			err = soldOutError(sku)
		}
	}
	s.learn(sku, gen, err)
	return p, err
}

// learn remembers sku as sold out when err, the outcome of a read or a
// transaction that began at generation gen, says it is.
func (s *Service) learn(sku int64, gen uint64, err error) {
	if errors.Is(err, ErrSoldOut) {
		s.soldOut.mark(sku, gen)
	}
}

// raise is what soldOut keeps of a raise of a SKU's stock.
type raise struct {
	fence int64 // 0: made without a token
	at    time.Time
}

// soldOutQuiet is how long after a raise of a product another replica's
// finding that it sold out is not believed: longer than an announcement
// takes from a finding's commit to its PUBLISH, which happens before the
// lock is released and within InvalidateTimeout.
const soldOutQuiet = 2 * InvalidateTimeout

// SoldOutHeardTTL is how long a replica refuses a product from another
// replica's finding that it sold out (at most the memory's own ttl). It is
// short: the finding saves the replica's reads during a sellout, and a
// raise that was not heard, or a finding heard late, costs no more than
// this of refusals. Once it lapses, the replica's own read of the stock
// finds the product sold out again, or not.
const SoldOutHeardTTL = 5 * time.Second

func newSoldOut(ttl time.Duration, now func() time.Time) *soldOut {
	return &soldOut{ttl: ttl, heardTTL: min(ttl, SoldOutHeardTTL), quiet: soldOutQuiet, now: now,
		skus: make(map[int64]time.Time), raised: make(map[int64]raise)}
}

// generation returns the generation to pass to mark for a read that starts
// now.
func (s *soldOut) generation() uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.gen
}

// has reports whether sku is known to be sold out.
func (s *soldOut) has(sku int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	until, ok := s.skus[sku]
	return ok && s.now().Before(until)
}

// lapsed reports whether sku was known to be sold out until lately: its
// entry lapsed less than the memory's ttl ago, and no raise of its stock
// has been heard since. Such a product is most likely still gone, and a
// read before its lock refuses a crowd for the price of one statement,
// where the lock and a transaction cost more. An entry that lapsed longer
// ago is dropped.
func (s *soldOut) lapsed(sku int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	until, ok := s.skus[sku]
	switch now := s.now(); {
	case !ok || now.Before(until):
		return false
	case !now.Before(until.Add(s.ttl)):
		delete(s.skus, sku)
		return false
	}
	return true
}

// mark records that sku was found sold out by a read that started at
// generation gen; nothing is recorded if the memory was cleared since.
func (s *soldOut) mark(sku int64, gen uint64) {
	if s.ttl <= 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if gen != s.gen {
		return
	}
	s.add(sku, s.ttl)
}

// heard records that another replica found sku sold out under the SKU's
// lock with fencing token fence, unless a raise came after it (see
// soldOut).
func (s *soldOut) heard(sku, fence int64) {
	if s.ttl <= 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	if now.Before(s.allAt.Add(s.quiet)) {
		return
	}
	if r, ok := s.raised[sku]; ok && (fence <= r.fence || now.Before(r.at.Add(s.quiet))) {
		return
	}
	s.add(sku, s.heardTTL)
}

// add records sku as sold out for ttl, or longer if it was already; s.mu
// is held.
func (s *soldOut) add(sku int64, ttl time.Duration) {
	now := s.now()
	if until, ok := s.skus[sku]; !ok || until.Before(now.Add(ttl)) {
		s.skus[sku] = now.Add(ttl)
	}
	// Entries are kept for a ttl after they lapse (see lapsed), and dropped
	// when looked up after that; a sweep every so many marks keeps SKUs
	// that are never asked for again from piling up.
	if s.known++; s.known < 1024 {
		return
	}
	s.known = 0
	for k, until := range s.skus {
		if !now.Before(until.Add(s.ttl)) {
			delete(s.skus, k)
		}
	}
	for k, r := range s.raised {
		if !now.Before(r.at.Add(max(s.ttl, s.quiet))) {
			delete(s.raised, k)
		}
	}
}

// raise clears sku, or every product when sku is 0, whose stock went up
// under the SKU's lock with fencing token fence (0: without one), and moves
// the generation on.
func (s *soldOut) raise(sku, fence int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gen++
	now := s.now()
	if sku == 0 {
		clear(s.skus)
		s.allAt = now
		return
	}
	delete(s.skus, sku)
	r := s.raised[sku]
	s.raised[sku] = raise{fence: max(r.fence, fence), at: now}
}
