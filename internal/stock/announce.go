package stock

import (
	"context"
	"time"

	"shop/internal/lock"
	"shop/internal/notify"
)

// After a change of a SKU's stock has committed (or may have), the fleet is
// told through the Announcer: the product cache drops the product, and every
// replica — this one too — hears the event (Hear) and forgets that the
// product sold out (Raised), or learns that it did (SoldOut), by the fencing
// token of the hold that made the change. The orders' changes of status are
// counted (transitions).

// Announcer tells the fleet that a product changed: the shared copies of
// it are dropped, and every replica hears e (Service.Hear). *cache.Products
// implements it, in one round trip.
type Announcer interface {
	Announce(ctx context.Context, e notify.Event) error
}

// Hear is what this Service makes of an announcement heard from any
// replica, this one included: a raise of the stock forgets that the
// product (every product, for notify.All) sold out, as of the raise's
// fencing token; another replica's finding that it sold out is remembered.
// A raise and a change of the product (an order's, or an operator's change
// of its window) forget its sale window: the next transaction or read
// finds it again.
func (s *Service) Hear(e notify.Event) {
	switch e.Kind {
	case notify.Raised:
		s.windows.forget(e.SKU)
		s.Raised(e.SKU, e.Fence)
	case notify.Changed:
		s.windows.forget(e.SKU)
	case notify.SoldOut:
		s.SoldOutElsewhere(e.SKU, e.Fence)
	}
}

// announce tells the fleet of e (Deps.Announcer). It runs after COMMIT,
// still under the SKU lock, and even when the caller has gone: the change
// stands, and a cache left holding the old stock would show it until the
// entry expires, and a replica not told of a raise refuses the product from
// memory until that lapses (DefaultSoldOutTTL), which is what the log line
// reports: "invalidate cached product", or "announce units returned to the
// sale" for a raise (operators and the tests look for these two).
//
// A raise that failed to go out is tried again, after a short pause that
// doubles each time, until it goes through or InvalidateTimeout has
// passed: a connection reset or a failover costs a retry, not the
// announcement, whose loss would have replicas refuse the units that came
// back. The first try has at most half the time, so that one that hangs
// leaves time for another on a new connection. A raise may be made twice:
// a listener takes it heard twice as once. An order's change or sell-out
// is tried once, as before: its loss costs a stale page or a read, and a
// Redis that refuses every try would otherwise hold each batch's lock for
// the whole InvalidateTimeout.
func (s *Service) announce(ctx context.Context, e notify.Event) {
	if s.announcer == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), InvalidateTimeout)
	defer cancel()
	first := InvalidateTimeout
	if e.Kind == notify.Raised {
		first /= 2
	}
	err := s.tryAnnounce(ctx, e, first)
	for pause := announceRetryPause; err != nil && e.Kind == notify.Raised && ctx.Err() == nil; pause *= 2 {
		select {
		case <-ctx.Done():
		case <-time.After(pause):
			err = s.tryAnnounce(ctx, e, InvalidateTimeout)
		}
	}
	if err != nil {
		msg := "invalidate cached product"
		if e.Kind == notify.Raised {
			msg = "announce units returned to the sale"
		}
		s.log.WarnContext(ctx, msg, "sku", e.SKU, "kind", e.Kind, "err", err)
	}
}

// announceRetryPause is the pause before announce's first retry.
const announceRetryPause = 25 * time.Millisecond

// tryAnnounce is one try of announce, given at most limit of ctx's time.
func (s *Service) tryAnnounce(ctx context.Context, e notify.Event, limit time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	return s.announcer.Announce(ctx, e)
}

// changed announces that sku's stock changed, or may have. With
// soldOutAt, the fencing token of the hold that found it sold out, it
// announces that it sold out.
func (s *Service) changed(ctx context.Context, sku, soldOutAt int64) {
	if soldOutAt > 0 {
		s.announce(ctx, notify.Event{Kind: notify.SoldOut, SKU: sku, Fence: soldOutAt})
		return
	}
	s.announce(ctx, notify.Event{Kind: notify.Changed, SKU: sku})
}

// returned makes this Service forget that sku sold out, and announces that
// its stock went up, under the hold with fencing token fence (0: none).
func (s *Service) returned(ctx context.Context, sku, fence int64) {
	s.Raised(sku, fence)
	s.announce(ctx, notify.Event{Kind: notify.Raised, SKU: sku, Fence: fence})
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
	if s.transitioned != nil {
		s.transitioned(status, n)
	}
}
