package cache_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"shop/internal/cache"
	"shop/internal/keyspace"
	"shop/internal/lock"
	"shop/internal/stock"
	"shop/internal/testenv"
)

// The Bloom filter's shards land on every master of the test Cluster, as
// evenly as their count allows, and the slots the cache computes for their
// tags are the Cluster's own.
func TestBloomShardsOnEveryMaster(t *testing.T) {
	topo := testenv.TopologyNamed(t, "cluster")
	cluster := topo.Client(t, nil).(*redis.ClusterClient)
	ctx := context.Background()
	shards, err := cluster.ClusterShards(ctx).Result()
	if err != nil {
		t.Fatal(err)
	}
	masters := len(shards)
	for _, n := range []int{3, cache.DefaultBloomShards} {
		c := cache.New(cache.Deps{Redis: cluster}, cache.Settings{Prefix: "test:", Bloom: true, BloomShards: n})
		perMaster := map[string]int{}
		for _, key := range c.BloomBitmaps() {
			tag := key[strings.Index(key, "{")+1 : strings.Index(key, "}")]
			slot, err := cluster.ClusterKeySlot(ctx, key).Result()
			if err != nil {
				t.Fatal(err)
			}
			if want := cache.KeySlot(tag); slot != int64(want) {
				t.Errorf("%s: the Cluster puts it in slot %d, the cache computed %d", key, slot, want)
			}
			node, err := cluster.MasterForKey(ctx, key)
			if err != nil {
				t.Fatal(err)
			}
			perMaster[node.Options().Addr]++
		}
		t.Logf("%d shards over %d masters: %v", n, masters, perMaster)
		if len(perMaster) != masters {
			t.Errorf("%d shards on %d of %d masters: %v", n, len(perMaster), masters, perMaster)
		}
		for addr, got := range perMaster {
			if least, most := n/masters-1, (n+masters-1)/masters+1; got < least || got > most {
				t.Errorf("%d shards: %d on %s, want %d to %d", n, got, addr, least, most)
			}
		}
	}
}

// A shard of the filter lost while the others stand — its master restarted
// empty, or its bitmap evicted — turns away none of its products, and is
// rebuilt: its absent ids are turned away again. The shard lost is not
// product 1's, which a rebuild that looked only for a missing filter by
// asking it about one id would not notice.
func TestBloomShardLost(t *testing.T) {
	t.Parallel()
	testenv.EachTopology(t, func(t *testing.T, topo testenv.Topology) {
		cases := []struct {
			name string
			lost func(keys []string) []string // of bitmap, parameters, epoch
		}{
			{"restarted empty", func(keys []string) []string { return keys }},
			{"bitmap evicted", func(keys []string) []string { return keys[:1] }},
		}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				const products = 300 // about 19 a shard
				f := newFixtureOn(t, topo, products, 1)
				ctx := context.Background()
				r := f.replica(t, cache.Settings{Bloom: true})
				if _, err := r.Reset(ctx); err != nil {
					t.Fatal(err)
				}
				id := int64(2)
				for r.BloomShardKeys(id)[0] == r.BloomShardKeys(1)[0] {
					id++
				}
				keys := r.BloomShardKeys(id)
				if err := f.rdb.Del(ctx, c.lost(keys)...).Err(); err != nil {
					t.Fatal(err)
				}
				allFound(t, r, 1, products)

				deadline := time.Now().Add(10 * time.Second)
				for f.rdb.Exists(ctx, keys[0], keys[1]).Val() != 2 {
					if time.Now().After(deadline) {
						t.Fatalf("shard %s not rebuilt 10s after it was lost", keys[0])
					}
					time.Sleep(20 * time.Millisecond)
				}
				var absent []int64
				for id := int64(products + 1); len(absent) < 200; id++ {
					if r.BloomShardKeys(id)[0] == keys[0] {
						absent = append(absent, id)
					}
				}
				before := r.counter(t, "bloom_rejects_total")
				for _, id := range absent {
					if _, err := r.Product(ctx, id); !errors.Is(err, stock.ErrNotFound) {
						t.Fatalf("GET of absent product %d: %v", id, err)
					}
				}
				// With p = 0.001, 10 or more false positives among 200 ids
				// has a probability below 1e-15.
				if rejects := r.counter(t, "bloom_rejects_total") - before; rejects < float64(len(absent)-10) {
					t.Errorf("the rebuilt shard turned away %.0f of %d absent ids of its own", rejects, len(absent))
				}
				allFound(t, r, 1, products)
			})
		}
	})
}

// Reset drops every cached entry, wherever it is: on a Cluster, the entries
// are spread over the masters, and each one is scanned. And the rebuilt
// filter admits the products of the new catalog.
func TestResetDropsEveryEntry(t *testing.T) {
	t.Parallel()
	testenv.EachTopology(t, func(t *testing.T, topo testenv.Topology) {
		// More entries than a reset drops in one pipeline (resetBatch).
		const cached, reseeded = 1500, 2000
		f := newFixtureOn(t, topo, cached, 1)
		ctx := context.Background()
		r := f.replica(t, cache.Settings{Bloom: true})
		if _, err := r.Reset(ctx); err != nil {
			t.Fatal(err)
		}
		// Every product cached, as placeholders: one left behind by the
		// reset would answer "not found" below.
		fillEntries(t, f.rdb, f.prefix+"cache:", cached)
		spread := entriesPerMaster(t, f)
		t.Logf("%d products cached on %s: %v entries per master", cached, topo.Name, spread)
		if topo.Name == "cluster" && len(spread) < 3 {
			t.Fatalf("the entries are on %d masters: %v; the test needs them spread", len(spread), spread)
		}

		// A reseed with two units each: a stale entry would show one.
		if err := stock.NewCatalog(f.db.Gorm).Seed(ctx, reseeded, 2); err != nil {
			t.Fatal(err)
		}
		dropped, err := r.Reset(ctx)
		if err != nil {
			t.Fatal(err)
		}
		left := entries(t, f)
		t.Logf("Reset dropped %d entries; %d left", dropped, left)
		if dropped != cached {
			t.Errorf("Reset dropped %d entries, want %d", dropped, cached)
		}
		if left != 0 {
			t.Errorf("%d entries left after Reset: %v per master", left, entriesPerMaster(t, f))
		}
		// The rebuilt filter admits every product of the new catalog; with
		// no entry left, a read loads what MySQL has, as every fifth
		// product shows, of the old catalog's ids and of the new ones.
		for id := int64(1); id <= reseeded; id++ {
			if err := r.RuleOut(ctx, id); err != nil {
				t.Fatalf("product %d after the reset: %v", id, err)
			}
		}
		for i, err := range reads(reseeded/5, 32, func(i int) error {
			p, err := r.Product(ctx, int64(5*i+1))
			if err == nil && p.Stock != 2 {
				err = fmt.Errorf("%d units, want 2: a stale entry", p.Stock)
			}
			return err
		}) {
			if err != nil {
				t.Fatalf("product %d after the reset: %v (%.0f Bloom rejects)", 5*i+1, err, r.counter(t, "bloom_rejects_total"))
			}
		}
	})
}

// entriesPerMaster counts f's cached entries on each master of a Cluster,
// or on the one server.
func entriesPerMaster(t *testing.T, f *fixture) map[string]int {
	t.Helper()
	cluster, ok := f.rdb.(*redis.ClusterClient)
	if !ok {
		return map[string]int{f.topo.Name: entries(t, f)}
	}
	var mu sync.Mutex
	counts := map[string]int{}
	err := cluster.ForEachMaster(context.Background(), func(ctx context.Context, node *redis.Client) error {
		n := 0
		err := keyspace.Scan(ctx, node, f.prefix+"cache:product:*}", func(string) { n++ })
		mu.Lock()
		defer mu.Unlock()
		if n > 0 {
			counts[node.Options().Addr] = n
		}
		return err
	})
	if err != nil {
		t.Fatal(fmt.Errorf("count entries per master: %w", err))
	}
	return counts
}

// Reset drops the entries it finds a pipeline at a time, not one per round
// trip: with 20 000 products cached, it sends Redis a few dozen commands
// and pipelines (the Bloom filter's shards, the SCANs, the drops), where
// one invalidation per round trip took 20 000. And every entry is dropped,
// on every master, and every generation bumped, so that a load under way
// cannot write back what it read before. The entries are of a larger
// catalog than the one the reset rebuilds the filter from (1000 products,
// as after a reseed to fewer): a shard of the filter costs a few round
// trips whatever its ids.
func TestResetPipelined(t *testing.T) {
	t.Parallel()
	testenv.EachTopology(t, func(t *testing.T, topo testenv.Topology) {
		const cached = 20_000
		f := newFixtureOn(t, topo, 1000, 1)
		ctx := context.Background()
		rdb := f.topo.Client(t, nil)
		var sent testenv.RoundTrips
		rdb.AddHook(&sent)
		r := f.replicaOn(t, cache.Deps{Redis: rdb}, rdb, cache.Settings{Bloom: true}, lock.RedisOptions{})
		fillEntries(t, f.rdb, f.prefix+"cache:", cached)
		if topo.Name == "cluster" {
			if spread := entriesPerMaster(t, f); len(spread) < 3 {
				t.Fatalf("the entries are on %d masters: %v; the test needs them spread", len(spread), spread)
			}
		}

		start := time.Now()
		dropped, err := r.Reset(ctx)
		took := time.Since(start)
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("%s: Reset of %d cached products in %s, %d commands or pipelines sent", topo.Name, cached, took.Round(time.Millisecond), sent.N())
		if dropped != cached {
			t.Errorf("Reset dropped %d entries, want %d", dropped, cached)
		}
		if left := entries(t, f); left != 0 {
			t.Errorf("%d entries left after Reset: %v per master", left, entriesPerMaster(t, f))
		}
		if n := sent.N(); n > cached/100 {
			t.Errorf("Reset sent %d commands or pipelines for %d cached products, want at most %d", n, cached, cached/100)
		}
		pipe := f.rdb.Pipeline()
		gens := make([]*redis.StringCmd, cached)
		for i := range gens {
			gens[i] = pipe.Get(ctx, f.prefix+"cache:product:{"+strconv.Itoa(i+1)+"}:gen")
		}
		if _, err := pipe.Exec(ctx); err != nil {
			t.Fatal(err)
		}
		for i, g := range gens {
			if g.Val() != "1" {
				t.Fatalf("product %d's generation is %q after Reset, want 1: a load under way could write back what it read before", i+1, g.Val())
			}
		}
	})
}

// fillEntries caches products 1..n under prefix as loads leave them: a
// placeholder entry (a real product's JSON is as good to a reset) and its
// generation, written in pipelines.
func fillEntries(tb testing.TB, rdb redis.UniversalClient, prefix string, n int) {
	tb.Helper()
	ctx := context.Background()
	const batch = 1000
	for from := 1; from <= n; from += batch {
		pipe := rdb.Pipeline()
		for id := from; id < from+batch && id <= n; id++ {
			key := prefix + "product:{" + strconv.Itoa(id) + "}"
			pipe.Set(ctx, key, `{"product":null}`, 10*time.Minute)
			pipe.Set(ctx, key+":gen", "0", time.Minute)
		}
		if _, err := pipe.Exec(ctx); err != nil {
			tb.Fatalf("cache %d products: %v", n, err)
		}
	}
}
