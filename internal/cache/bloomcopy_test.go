package cache_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"shop/internal/cache"
	"shop/internal/lock"
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
	t.Parallel()
	f := newFixtureOn(t, testenv.TopologyNamed(t, "single"), 200, 1)
	ctx := context.Background()
	builder := f.replica(t, cache.Settings{Bloom: true})
	if _, err := builder.Reset(ctx); err != nil {
		t.Fatal(err)
	}
	rdb := f.topo.Client(t, nil)
	var sent testenv.RoundTrips
	rdb.AddHook(&sent)
	r := f.replicaOn(t, cache.Deps{Redis: rdb}, rdb, cache.Settings{Bloom: true, BloomCopy: time.Hour}, lock.RedisOptions{})
	// Every shard asked, each copied in the background, until the copies
	// answer every product without Redis.
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		before := sent.N()
		for id := int64(1); id <= 200; id++ {
			if err := r.RuleOut(ctx, id); err != nil {
				t.Fatalf("product %d ruled out: %v", id, err)
			}
		}
		if sent.N() == before {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("the shards are not all copied 10s on")
		}
	}

	// absent returns the ids 5001..5100, above every product, that the
	// filter in Redis rules out, as builder (which keeps no copy) finds
	// them: all but the few it lets through (false positives, which a copy
	// lets through too).
	absent := func() []int64 {
		t.Helper()
		var ids []int64
		for id := int64(5001); id <= 5100; id++ {
			if errors.Is(builder.RuleOut(ctx, id), stock.ErrNotFound) {
				ids = append(ids, id)
			}
		}
		if len(ids) < 90 {
			t.Fatalf("the filter rules out %d of 100 absent ids", len(ids))
		}
		return ids
	}
	ruledOut := absent()
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
	for _, id := range ruledOut {
		if err := r.RuleOut(ctx, id); !errors.Is(err, stock.ErrNotFound) {
			t.Fatalf("absent id %d with the filter gone from Redis: %v; want it ruled out by the copy", id, err)
		}
	}
	allFound(t, r, 1, 200)
	r.Close() // waits for a rebuild, had a check asked Redis
	if keys := bloomKeys(); len(keys) > 0 {
		t.Errorf("the filter was rebuilt in Redis (%d keys): a check asked Redis", len(keys))
	}

	// A seed and its reset by another replica, this one not told: its
	// copies are of the old catalog, found out within seconds.
	if err := stock.NewCatalog(f.db.Gorm).Seed(ctx, 400, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := builder.Reset(ctx); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	for {
		_, err := r.Product(ctx, 300)
		if err == nil {
			break
		}
		if !errors.Is(err, stock.ErrNotFound) || time.Since(start) > 5*time.Second {
			t.Fatalf("product 300 after a seed, %s on: %v", time.Since(start).Round(time.Millisecond), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("a replica not told of the seed found its new product after %s", time.Since(start).Round(time.Millisecond))

	// Told: at once.
	if err := stock.NewCatalog(f.db.Gorm).Seed(ctx, 600, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := builder.Reset(ctx); err != nil {
		t.Fatal(err)
	}
	r.Hear(notify.Event{Kind: notify.Raised, SKU: notify.All}) // the seed's announcement
	allFound(t, r, 401, 600)
	for _, id := range absent() {
		if err := r.RuleOut(ctx, id); !errors.Is(err, stock.ErrNotFound) {
			t.Fatalf("absent id %d after the seed: %v", id, err)
		}
	}
}
