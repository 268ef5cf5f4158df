package cache

import (
	"context"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/maypok86/otter/v2"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/singleflight"

	"shop/internal/stock"
)

// Pages is a replica's own copy of product pages, in front of Products:
// each page as the bytes it is sent as, so that a page read in a crowd
// costs neither a Redis round trip nor an encoding.
//
// A page is dropped when its product changes: every change of a product
// (an order's commit, a sell-out, a return of units, a restock) is
// announced to every replica with the invalidation of its cached entry
// (Products.Announce), and each replica forgets the page when it hears
// the announcement (Products.Hear); the replica that made the change
// forgets its own copy before it answers. A replica that resubscribes, having perhaps missed
// announcements, forgets every page. And each page lapses after the TTL in
// any case: the bound on how stale a page may be when an announcement is
// lost without the subscription noticing.
//
// So a page another replica serves may lag an acknowledged order by the
// time its announcement takes to arrive (docs/cache.md measures it), where
// the Redis entry alone would show it as soon as the order is answered:
// the product page's stock may lag, as the API says; the authoritative
// stock is GET /api/v1/products/{id}/stock.
//
// A load that began before a Forget of its page does not store what it
// read: each page has a version, moved on by Forget before the page is
// dropped, and a load stores its bytes only if the version is still the
// one it began with.
type Pages struct {
	pages    *otter.Cache[int64, []byte]
	versions [pageStripes]atomic.Uint64
	all      atomic.Uint64 // moved on by every Forget of All
	loads    singleflight.Group
	timeout  time.Duration
	hits     prometheus.Counter
	misses   prometheus.Counter
}

const (
	// pageStripes is how many version counters the pages share: two
	// pages share one when their ids are equal modulo it, and then a
	// Forget of one only costs the other a store.
	pageStripes = 1024
	// maxPages bounds how many pages a replica keeps: far more than a sale
	// has products, a few hundred bytes each.
	maxPages = 1 << 16
)

// NewPages returns a replica's copy of product pages that keeps each for at
// most ttl. A load of a page (Page's load) is bounded by loadTimeout,
// whoever waits for it. Its hit and miss counters register with reg,
// unless nil.
func NewPages(ttl, loadTimeout time.Duration, reg prometheus.Registerer) (*Pages, error) {
	return newPages(ttl, loadTimeout, reg, nil)
}

// newPages is NewPages on clock (nil: the time of day).
func newPages(ttl, loadTimeout time.Duration, reg prometheus.Registerer, clock otter.Clock) (*Pages, error) {
	if ttl <= 0 || loadTimeout <= 0 {
		return nil, fmt.Errorf("cache: pages: ttl %s and load timeout %s must be positive", ttl, loadTimeout)
	}
	c, err := otter.New(&otter.Options[int64, []byte]{
		MaximumSize:      maxPages,
		ExpiryCalculator: otter.ExpiryWriting[int64, []byte](ttl),
		Clock:            clock,
	})
	if err != nil {
		return nil, fmt.Errorf("cache: pages: %w", err)
	}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: "shop", Subsystem: "cache", Name: name, Help: help})
	}
	p := &Pages{pages: c, timeout: loadTimeout,
		hits:   counter("page_hits_total", "Product pages answered from the replica's own copy (Pages), without Redis."),
		misses: counter("page_misses_total", "Product pages the replica's own copy did not hold: read from the cache in Redis."),
	}
	if reg != nil {
		reg.MustRegister(p.hits, p.misses)
	}
	return p, nil
}

// Page returns the page of product id: the copy this replica holds, or
// what load returns, which it keeps unless the product changed meanwhile.
// Concurrent misses of one page share one load, which runs on a context
// of its own, bounded by the load timeout, so that a caller who leaves
// does not fail the others. load's errors are returned as they are, and
// nothing is kept for them.
func (p *Pages) Page(ctx context.Context, id int64, load func(context.Context) ([]byte, error)) ([]byte, error) {
	if b, ok := p.pages.GetIfPresent(id); ok {
		p.hits.Inc()
		return b, nil
	}
	p.misses.Inc()
	v := p.version(id)
	ch := p.loads.DoChan(strconv.FormatInt(id, 10)+":"+strconv.FormatUint(v, 10), func() (any, error) {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.timeout)
		defer cancel()
		b, err := load(ctx)
		if err == nil && p.version(id) == v {
			p.pages.Set(id, b)
		}
		return b, err
	})
	select {
	case <-ctx.Done():
		return nil, fmt.Errorf("%w: waiting for product %d: %w", stock.ErrBusy, id, context.Cause(ctx))
	case res := <-ch:
		if res.Err != nil {
			return nil, res.Err
		}
		return res.Val.([]byte), nil
	}
}

// Forget drops the page of product id, or every page when id is All (0).
func (p *Pages) Forget(id int64) {
	if id == 0 {
		p.all.Add(1)
		p.pages.InvalidateAll()
		return
	}
	p.stripe(id).Add(1)
	p.pages.Invalidate(id)
}

func (p *Pages) stripe(id int64) *atomic.Uint64 { return &p.versions[uint64(id)%pageStripes] }

// version is what a load of id's page begins with: it changes with every
// Forget of the page, or of every page.
func (p *Pages) version(id int64) uint64 {
	return p.stripe(id).Load() + p.all.Load()
}
