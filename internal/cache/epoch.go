package cache

import (
	"context"
	"sync/atomic"
	"time"

	"golang.org/x/sync/singleflight"
)

// epochEvery is how often, at most, a replica asks MySQL for the catalog's
// epoch to judge the Bloom filter's "no" by (see trusted); the question is
// bounded by Settings.EpochTimeout.
const epochEvery = time.Second

// catalogEpoch is what a replica knows of the catalog's epoch
// (Source.Epoch).
type catalogEpoch struct {
	known atomic.Int64 // what MySQL last answered; -1 before any answer
	asked atomic.Int64 // Unix ns when MySQL last answered, or failed to
	seen  atomic.Int64 // the newest shard epoch that had MySQL asked at once
	asks  singleflight.Group
}

// trusted reports whether a shard of the Bloom filter that ruled an id out,
// built from the catalog at epoch shard, describes the catalog MySQL has:
// whether shard is the catalog's epoch as this replica learned it from
// MySQL at most epochEvery ago. A shard of another epoch (one whose reset
// failed after a seed, say) is no filter: it may turn away new products.
//
// Only a "no" needs the question: a "maybe", right or wrong, sends the read
// on to the cache and MySQL anyway. So MySQL is asked when a shard rules an
// id out and what the replica knows is older than epochEvery — at most once
// per epochEvery, the reads that need it meanwhile sharing the one question —
// and at once the first time a shard shows an epoch newer than the one the
// replica knows: the shards a successful seed's reset has just swapped in,
// which are then trusted at once rather than after epochEvery of absent ids
// let through. Under a flood of absent ids that is about one query a second
// per replica, not one per read. When MySQL cannot answer, the epoch it
// last gave stands; before it has given one, every shard is trusted, as
// before shards had epochs.
func (p *Products) trusted(ctx context.Context, shard int64) bool {
	e := &p.epoch
	known := e.known.Load()
	newer := shard > known && e.firstSight(shard)
	if newer || time.Since(time.Unix(0, e.asked.Load())) >= epochEvery {
		known = p.askEpoch(ctx, newer)
	}
	return known < 0 || shard == known
}

// firstSight records shard as seen, and reports whether no newer or equal
// one had been.
func (e *catalogEpoch) firstSight(shard int64) bool {
	for {
		seen := e.seen.Load()
		if shard <= seen {
			return false
		}
		if e.seen.CompareAndSwap(seen, shard) {
			return true
		}
	}
}

// askEpoch asks MySQL for the catalog's epoch — unless, when not at once,
// it was asked less than epochEvery ago — and returns what the replica knows
// then. Concurrent callers share one question; a caller whose context ends
// first gets what the replica knew before.
func (p *Products) askEpoch(ctx context.Context, atOnce bool) int64 {
	e := &p.epoch
	key := "every"
	if atOnce {
		key = "at once"
	}
	ch := e.asks.DoChan(key, func() (any, error) {
		if !atOnce && time.Since(time.Unix(0, e.asked.Load())) < epochEvery {
			return nil, nil // asked meanwhile
		}
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.set.EpochTimeout)
		defer cancel()
		epoch, err := p.src.Epoch(ctx)
		if err != nil {
			p.log.WarnContext(ctx, "cache: catalog epoch: the Bloom filter is judged by the last one known", "known", e.known.Load(), "err", err)
		} else {
			e.known.Store(epoch)
		}
		e.asked.Store(time.Now().UnixNano())
		return nil, nil
	})
	select {
	case <-ctx.Done():
	case <-ch:
	}
	return e.known.Load()
}
