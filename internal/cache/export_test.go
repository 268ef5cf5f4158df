package cache

import (
	"context"
	"time"

	"github.com/maypok86/otter/v2"
)

// RebuildBloom runs the rebuild of a missing Bloom filter in the caller's
// goroutine, so that a test can interleave it with a reset step by step.
func (p *Products) RebuildBloom(ctx context.Context) error { return p.rebuildBloom(ctx) }

// BloomShardKeys returns the keys of the Bloom filter's shard that holds id:
// its bitmap, its parameters and its epoch.
func (p *Products) BloomShardKeys(id int64) []string {
	s := p.bloom.shardOf(id)
	return []string{s.bits, s.meta, s.epoch}
}

// BloomBitmaps returns the bitmap key of every shard of the Bloom filter.
func (p *Products) BloomBitmaps() []string {
	var keys []string
	for _, s := range p.bloom.shards {
		keys = append(keys, s.bits)
	}
	return keys
}

// KeySlot is the Cluster slot of a key without a hash tag, as the cache
// computes it to place the shards.
func KeySlot(key string) uint16 { return keySlot(key) }

// NewPagesOn is NewPages on clock, with no metrics.
func NewPagesOn(ttl, loadTimeout time.Duration, clock otter.Clock) (*Pages, error) {
	return newPages(ttl, loadTimeout, nil, clock)
}
