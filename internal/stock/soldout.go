package stock

import (
	"sync"
	"time"
)

// soldOut is what one replica remembers of the products it found sold out,
// so that later orders for them are refused without a round trip to MySQL
// or Redis.
//
// Stock goes up again only when the catalog is reseeded or a product is
// restocked, and then the memory must not refuse: Forget clears it (every
// replica is told through a broadcast, see Service.ForgetSoldOut), and each
// entry also lapses after ttl, so that a broadcast that was missed — or a
// change made behind the service's back — costs at most ttl of refusals.
//
// A finding made by a transaction that began before a Forget is dropped:
// marks carry the generation read before the product was, and Forget moves
// the generation on.
type soldOut struct {
	ttl time.Duration
	now func() time.Time

	mu    sync.Mutex
	gen   uint64
	skus  map[int64]time.Time // when each entry lapses
	known int                 // entries added since the last sweep
}

func newSoldOut(ttl time.Duration, now func() time.Time) *soldOut {
	return &soldOut{ttl: ttl, now: now, skus: make(map[int64]time.Time)}
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
	if ok && !s.now().Before(until) {
		delete(s.skus, sku)
		return false
	}
	return ok
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
	now := s.now()
	s.skus[sku] = now.Add(s.ttl)
	// Entries are dropped when looked up after they lapse; a sweep every so
	// many marks keeps SKUs that are never asked for again from piling up.
	if s.known++; s.known >= 1024 {
		s.known = 0
		for k, until := range s.skus {
			if !now.Before(until) {
				delete(s.skus, k)
			}
		}
	}
}

// forget clears sku, or every product when sku is 0, and moves the
// generation on.
func (s *soldOut) forget(sku int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.gen++
	if sku == 0 {
		clear(s.skus)
		return
	}
	delete(s.skus, sku)
}
