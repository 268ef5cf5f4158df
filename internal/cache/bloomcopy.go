package cache

import (
	"context"
	"errors"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"
)

// bloomCopy is a replica's own copy of one shard of the Bloom filter: its
// bitmap, parameters and catalog epoch, read from Redis in one
// transaction, so that a check of an id needs no round trip. A flood of
// made-up ids then costs the replica a few hashes each and Redis nothing;
// asked in Redis, each was a script run and a round trip, over a third of a
// replica's CPU under such a flood.
//
// A copy answers as the shard it was read from did, and its "no" is
// judged as the shard's is (Products.trusted): a copy of a filter built
// from another catalog than MySQL's is no filter, dropped, and the read
// asks Redis. A copy is used until its until, then read again; a seed tells
// every replica to drop theirs (Hear) once the filter of the
// new catalog is in Redis.
type bloomCopy struct {
	bits    []byte
	params  bloomParams
	catalog int64 // -1 when the builder recorded none
	until   time.Time
}

// verdict is the copy's answer about id.
func (c *bloomCopy) verdict(id int64) bloomVerdict {
	for _, pos := range c.params.positions(id) {
		if i := pos / 8; i >= uint64(len(c.bits)) || c.bits[i]&(0x80>>(pos%8)) == 0 {
			return bloomVerdict{catalog: c.catalog}
		}
	}
	return bloomVerdict{maybe: true}
}

// copyShard reads shard s into a copy good for ttl. A shard that is not
// in Redis (never built, or lost) leaves no copy: reads ask Redis, which
// has it rebuilt.
func (f *bloomFilter) copyShard(ctx context.Context, s *bloomShard, ttl time.Duration) error {
	pipe := f.rdb.TxPipeline() // the shard's keys share its hash tag
	meta, catalog, bits := pipe.Get(ctx, s.meta), pipe.Get(ctx, s.catalog), pipe.Get(ctx, s.bits)
	if _, err := pipe.Exec(ctx); err != nil && !errors.Is(err, redis.Nil) {
		return err
	}
	if meta.Err() != nil || bits.Err() != nil {
		s.copy.Store(nil)
		return nil
	}
	params, err := parseBloomParams(meta.Val())
	if err != nil {
		return err
	}
	c := &bloomCopy{bits: []byte(bits.Val()), params: params, catalog: -1, until: time.Now().Add(ttl)}
	if n, err := strconv.ParseInt(catalog.Val(), 10, 64); err == nil {
		c.catalog = n
	}
	s.copy.Store(c)
	return nil
}

// fromCopy answers whether id may be a product from this replica's copy of
// its shard: ok is false when there is no copy to answer from (none kept,
// none fresh, or one of another catalog, which is dropped), and the read
// asks Redis. A copy missing or past its time is read again in the
// background.
func (p *Products) fromCopy(ctx context.Context, id int64) (maybe, ok bool) {
	if p.set.BloomCopy <= 0 {
		return false, false
	}
	s := p.bloom.shardOf(id)
	c := s.copy.Load()
	if c == nil || time.Now().After(c.until) {
		p.goBackground("bloom copy "+s.bits, func(ctx context.Context) error { return p.bloom.copyShard(ctx, s, p.set.BloomCopy) })
		return false, false
	}
	v := c.verdict(id)
	switch {
	case v.maybe:
		return true, true
	case p.trusted(ctx, v.catalog):
		return false, true
	}
	s.copy.CompareAndSwap(c, nil)
	return false, false
}

// forgetBloomCopies drops this replica's copies of the Bloom filter, so
// that the next checks ask Redis and read it again: for a seed, once the
// filter of the new catalog is in Redis (see Hear).
func (p *Products) forgetBloomCopies() {
	for _, s := range p.bloom.shards {
		s.copy.Store(nil)
	}
}
