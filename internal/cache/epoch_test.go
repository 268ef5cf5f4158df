package cache_test

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"shop/internal/cache"
	"shop/internal/stock"
	"shop/internal/testenv"
)

// A seed whose cache reset failed (Redis failed right after the commit)
// leaves the filter of the old catalog in Redis, which knows none of the
// new products. Its "no" is not taken: the shards record the catalog epoch
// they were built from, a replica learns MySQL's at most a second late, and
// a shard of an older catalog lets its ids through and is rebuilt. Here the
// filter of 200 products is built by a read (the rebuild of a missing
// filter), 400 are seeded with no reset at all, and product 300 must be
// found within a few seconds — and every new product, once the filter is
// rebuilt, and absent ids turned away again. Then a seed that is followed
// by its reset is seen at once, as before: the new products found and
// absent ids turned away without MySQL.
func TestBloomOfAnOlderCatalogIsNoFilter(t *testing.T) {
	t.Parallel()
	testenv.EachTopology(t, func(t *testing.T, topo testenv.Topology) {
		f := newFixtureOn(t, topo, 200, 1)
		ctx := context.Background()
		r := f.replica(t, cache.Settings{Bloom: true})
		if _, err := r.Product(ctx, 1); err != nil { // no filter yet: one is built
			t.Fatal(err)
		}
		// Not 300: an id read while no filter stood is cached as absent,
		// and a seed whose reset failed leaves that for SHOP_CACHE_NULL_TTL.
		waitRejected(t, r, 5001, "the filter of products 1..200")

		if err := stock.NewCatalog(f.db.Gorm).Seed(ctx, 400, 1); err != nil { // and no reset
			t.Fatal(err)
		}
		start := time.Now()
		for {
			p, err := r.Product(ctx, 300)
			if err == nil && p.ID == 300 {
				break
			}
			if !errors.Is(err, stock.ErrNotFound) {
				t.Fatalf("product 300 after the seed: %v", err)
			}
			if time.Since(start) > 5*time.Second {
				t.Fatalf("product 300, seeded with no cache reset, still not found after %s: the old filter turns it away", time.Since(start).Round(time.Millisecond))
			}
			time.Sleep(20 * time.Millisecond)
		}
		t.Logf("%s: product 300 found %s after a seed with no cache reset; %.0f reads let through a stale shard",
			topo.Name, time.Since(start).Round(time.Millisecond), r.counter(t, "bloom_stale_total"))
		waitRejected(t, r, 5002, "the rebuilt filter of products 1..400")
		allFound(t, r, 201, 400)

		// A seed and its reset: the new filter is taken at once.
		if err := stock.NewCatalog(f.db.Gorm).Seed(ctx, 600, 1); err != nil {
			t.Fatal(err)
		}
		if _, err := r.Reset(ctx); err != nil {
			t.Fatal(err)
		}
		stale, loads := r.counter(t, "bloom_stale_total"), f.q.total.Load()
		for id := int64(601); id <= 700; id++ {
			if _, err := r.Product(ctx, id); !errors.Is(err, stock.ErrNotFound) {
				t.Fatalf("absent product %d after a seed and its reset: %v", id, err)
			}
		}
		if n := r.counter(t, "bloom_stale_total") - stale; n > 0 {
			t.Errorf("%.0f of 100 absent ids let through right after a seed and its reset: the new filter was not trusted at once", n)
		}
		if n := f.q.total.Load() - loads; n > 1 { // a false positive, at most
			t.Errorf("100 absent ids right after a seed and its reset cost %d product queries", n)
		}
		allFound(t, r, 401, 600)
	})
}

// waitRejected waits until r's Bloom filter turns away the absent id; what
// names the filter.
func waitRejected(t *testing.T, r replica, id int64, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		before := r.counter(t, "bloom_rejects_total")
		if _, err := r.Product(context.Background(), id); !errors.Is(err, stock.ErrNotFound) {
			t.Fatalf("absent product %d: %v", id, err)
		}
		if r.counter(t, "bloom_rejects_total") > before {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s turns away no absent id 10s on", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Readers learn the catalog's epoch from MySQL only to judge a "no" of the
// filter, and at most once a second per replica: a flood of absent ids on
// three replicas for two seconds — every read a Bloom reject — asks MySQL
// a few times, not once per read, and the filter keeps them off the
// products table as before. 16 readers are a flood: thousands of reads a
// second on a 2-core machine.
func TestPenetrationAsksTheCatalogEpochRarely(t *testing.T) {
	const (
		products = 5000
		replicas = 3
		flood    = 2 * time.Second
	)
	f := newFixtureOn(t, testenv.TopologyNamed(t, "single"), products, 1)
	ctx := context.Background()
	var rs []replica
	for range replicas {
		rs = append(rs, f.replica(t, cache.Settings{Bloom: true}))
	}
	if _, err := rs[0].Reset(ctx); err != nil {
		t.Fatal(err)
	}
	f.q.total.Store(0)
	f.q.epochs.Store(0)
	var n atomic.Int64
	start := time.Now()
	errs := reads(16, 16, func(i int) error {
		r := rs[i%replicas]
		for j := int64(0); time.Since(start) < flood; j++ {
			n.Add(1)
			if _, err := r.Product(ctx, products+1+(int64(i)*7919+j)%1000); !errors.Is(err, stock.ErrNotFound) {
				return err
			}
		}
		return nil
	})
	took := time.Since(start)
	for _, err := range errs {
		if err != nil {
			t.Fatalf("GET of an absent id: %v", err)
		}
	}
	var rejects float64
	for _, r := range rs {
		rejects += r.counter(t, "bloom_rejects_total")
	}
	epochs, loads := f.q.epochs.Load(), f.q.total.Load()
	t.Logf("%d GETs of absent ids on %d replicas in %s: %.0f Bloom rejects, %d catalog epoch queries, %d product queries",
		n.Load(), replicas, took.Round(time.Millisecond), rejects, epochs, loads)
	// Once a second per replica, and once more each for the epoch of the
	// filter they first see.
	if most := int64(replicas) * (int64(took/time.Second) + 2); epochs > most {
		t.Errorf("%d catalog epoch queries in %s on %d replicas, want at most %d", epochs, took.Round(time.Millisecond), replicas, most)
	}
	if loads > 10 {
		t.Errorf("MySQL saw %d product queries, want at most 10", loads)
	}
	if rejects < float64(n.Load())*0.99 {
		t.Errorf("%.0f Bloom rejects of %d GETs: the filter let absent ids through", rejects, n.Load())
	}
}
