package stock

import (
	"context"
	"shop/internal/lock"
)

// After a change of a SKU's stock has committed (or may have), the fleet is
// told: the product cache drops the product, and every replica forgets that
// it sold out, or learns that it did, by the fencing token of the hold that
// made the change (fence). The orders' changes of status are counted
// (transitions).

// invalidate tells the cache that sku's stock changed. It runs after COMMIT,
// still under the SKU lock, and even when the caller has gone: the order
// stands, and a cache left holding the old stock would show it until the
// entry expires, which is what the log line reports.
func (s *Service) invalidate(ctx context.Context, sku int64) { s.changed(ctx, sku, 0) }

// changed tells the cache that sku changed; with soldOutAt, the fencing
// token of the hold that found it sold out, it also tells every replica
// that it sold out, when the cache can (SoldOutInvalidator).
func (s *Service) changed(ctx context.Context, sku, soldOutAt int64) {
	if s.deps.Cache == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), InvalidateTimeout)
	defer cancel()
	var err error
	if c, ok := s.deps.Cache.(SoldOutInvalidator); ok && soldOutAt > 0 {
		err = c.InvalidateSoldOut(ctx, sku, soldOutAt)
	} else {
		err = s.deps.Cache.Invalidate(ctx, sku)
	}
	if err != nil {
		s.log.WarnContext(ctx, "invalidate cached product", "sku", sku, "err", err)
	}
}

// returned tells this Service, the other replicas (Deps.Returned) and
// the cache that sku's stock went up under the hold with fencing token
// fence (0: none).
func (s *Service) returned(ctx context.Context, sku, fence int64) {
	s.Raised(sku, fence)
	if s.deps.Returned != nil {
		s.deps.Returned(ctx, sku, fence)
	}
	s.invalidate(ctx, sku)
}

// fence is the token a write under lease carries when writes are fenced:
// the lease's, or 0 for none.
func (s *Service) fence(lease *lock.Lease) int64 {
	if lease == nil || !s.set.Fencing {
		return 0
	}
	return lease.Fence()
}

// transitions counts n orders that went to status (or refunds owed).
func (s *Service) transitions(status string, n int) {
	if s.deps.Transitions != nil {
		s.deps.Transitions(status, n)
	}
}
