package cache_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"shop/internal/cache"
	"shop/internal/notify"
	"shop/internal/stock"
	"shop/internal/testenv"
)

// A replica with copies of the Bloom filter's shards turns absent ids away
// without asking Redis: with the filter gone from Redis, it still does, and
// nothing has it rebuilt (a check that asked Redis would). A seed's new
// products are found once the replica drops its copies, as the seed's
// announcement has it do; without that, within a few seconds all the same,
// as the copy of the old catalog is found out.
func TestBloomCopyAnswersWithoutRedis(t *testing.T) {
	f := newFixtureOn(t, testenv.TopologyNamed(t, "single"), 1000, 1)
	ctx := context.Background()
	builder := f.replica(t, cache.Settings{Bloom: true})
	if _, err := builder.Reset(ctx); err != nil {
		t.Fatal(err)
	}
	r := f.replica(t, cache.Settings{Bloom: true, BloomCopy: time.Hour})
	for id := int64(1); id <= 1000; id++ { // every shard asked: each copied in the background
		if err := r.RuleOut(ctx, id); err != nil {
			t.Fatalf("product %d ruled out: %v", id, err)
		}
	}
	time.Sleep(500 * time.Millisecond)

	bloomKeys := func() []string {
		keys, err := f.rdb.Keys(ctx, f.prefix+"cache:{bloom*").Result()
		if err != nil {
			t.Fatal(err)
		}
		return keys
	}
	if err := f.rdb.Del(ctx, bloomKeys()...).Err(); err != nil {
		t.Fatal(err)
	}
	for id := int64(5001); id <= 5100; id++ {
		if err := r.RuleOut(ctx, id); !errors.Is(err, stock.ErrNotFound) {
			t.Fatalf("absent id %d with the filter gone from Redis: %v; want it ruled out by the copy", id, err)
		}
	}
	allFound(t, r, 1, 1000)
	time.Sleep(200 * time.Millisecond)
	if keys := bloomKeys(); len(keys) > 0 {
		t.Errorf("the filter was rebuilt in Redis (%d keys): a check asked Redis", len(keys))
	}

	// A seed and its reset by another replica, this one not told: its
	// copies are of the old catalog, found out within seconds.
	if err := stock.NewCatalog(f.db.Gorm).Seed(ctx, 2000, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := builder.Reset(ctx); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for {
		_, err := r.Product(ctx, 1500)
		if err == nil {
			break
		}
		if !errors.Is(err, stock.ErrNotFound) || time.Since(start) > 5*time.Second {
			t.Fatalf("product 1500 after a seed, %s on: %v", time.Since(start).Round(time.Millisecond), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("a replica not told of the seed found its new product after %s", time.Since(start).Round(time.Millisecond))

	// Told: at once.
	if err := stock.NewCatalog(f.db.Gorm).Seed(ctx, 3000, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := builder.Reset(ctx); err != nil {
		t.Fatal(err)
	}
	r.Hear(notify.Event{Kind: notify.Raised, SKU: notify.All}) // the seed's announcement
	allFound(t, r, 2001, 3000)
	for id := int64(5001); id <= 5100; id++ {
		if err := r.RuleOut(ctx, id); !errors.Is(err, stock.ErrNotFound) {
			t.Fatalf("absent id %d after the seed: %v", id, err)
		}
	}
}
