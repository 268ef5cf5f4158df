package cache_test

import (
	"context"
	"fmt"
	"maps"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"shop/internal/cache"
	"shop/internal/lock"
	"shop/internal/stock"
	"shop/internal/testenv"
)

// BenchmarkBloomShards measures product reads (Products.Product on cached
// products: the Bloom check and the entry's GET, one pipeline) from many
// goroutines on the test Redis Cluster, with the Bloom filter under one hash
// tag (BloomShards 1, the unsharded layout) and split in DefaultBloomShards
// shards, side by side: the two take turns in rounds of the same size, so
// that a noisy machine slows both alike. It reports each layout's reads/s,
// their ratio, and the share of the Bloom checks (the masters' EVALSHA calls,
// INFO commandstats) that the busiest master took.
//
//	make bench   # or, with SHOP_TEST_* set: go test -run '^$' -bench BloomShards ./internal/cache
func BenchmarkBloomShards(b *testing.B) {
	const (
		products = 5000
		workers  = 64
		round    = 1000
	)
	addrs := os.Getenv(testenv.RedisClusterEnv)
	if addrs == "" {
		b.Fatalf("%s is not set: this benchmark measures the Bloom filter on a Redis Cluster; `make bench` starts one", testenv.RedisClusterEnv)
	}
	topo := testenv.Topology{Name: "cluster", Addrs: strings.Split(addrs, ",")}
	ctx := context.Background()
	db := testenv.MySQL(b)
	catalog := stock.NewCatalog(db.Gorm)
	if err := catalog.Seed(ctx, products, 1); err != nil {
		b.Fatal(err)
	}
	rdb, prefix := testenv.RedisOn(b, topo)
	cluster := rdb.(*redis.ClusterClient)
	layouts := []struct {
		name   string
		shards int
		c      *cache.Products
		took   time.Duration
		n      int
		checks map[string]int64 // Bloom checks per master
	}{
		{name: "one-tag", shards: 1},
		{name: "sharded", shards: cache.DefaultBloomShards},
	}
	for i := range layouts {
		l := &layouts[i]
		p := prefix + l.name + ":"
		l.c = cache.New(cache.Deps{Redis: rdb, Source: catalog, Mutex: lock.NewRedis(rdb, lock.RedisOptions{Prefix: p + "mutex:", NoFencing: true})},
			cache.Settings{Prefix: p + "cache:", Bloom: true, BloomShards: l.shards})
		b.Cleanup(l.c.Close)
		l.checks = map[string]int64{}
		if _, err := l.c.Reset(ctx); err != nil {
			b.Fatal(err)
		}
		for id := int64(1); id <= products; id++ { // warm: this measures hits
			if _, err := l.c.Product(ctx, id); err != nil {
				b.Fatal(err)
			}
		}
	}

	// get reads n random products through c from all workers at once.
	get := func(c *cache.Products, n int) time.Duration {
		start := time.Now()
		errs := reads(n, workers, func(int) error {
			_, err := c.Product(ctx, 1+rand.Int64N(products))
			return err
		})
		took := time.Since(start)
		for _, err := range errs {
			if err != nil {
				b.Fatal(err)
			}
		}
		return took
	}

	for i := range layouts { // connections and scripts warm up
		get(layouts[i].c, workers*10)
	}
	b.ResetTimer()
	for left := b.N; left > 0; left -= round {
		for i := range layouts {
			l := &layouts[i]
			n := min(round, left)
			b.StopTimer()
			before := evalshaCalls(b, cluster)
			b.StartTimer()
			l.took += get(l.c, n)
			l.n += n
			b.StopTimer()
			for addr, calls := range evalshaCalls(b, cluster) {
				l.checks[addr] += calls - before[addr]
			}
			b.StartTimer()
		}
	}
	b.StopTimer()
	rate := func(i int) float64 { return float64(layouts[i].n) / layouts[i].took.Seconds() }
	for i, l := range layouts {
		var total, busiest int64
		for _, n := range l.checks {
			total += n
			busiest = max(busiest, n)
		}
		var spread []string
		for _, addr := range slices.Sorted(maps.Keys(l.checks)) {
			spread = append(spread, fmt.Sprintf("%s %.1f%%", addr, 100*float64(l.checks[addr])/float64(total)))
		}
		b.Logf("%s (%d shards): %d reads in %v, %.0f reads/s; Bloom checks (EVALSHA) per master: %s",
			l.name, l.shards, l.n, l.took.Round(time.Millisecond), rate(i), strings.Join(spread, ", "))
		b.ReportMetric(rate(i), l.name+"-reads/s")
		b.ReportMetric(100*float64(busiest)/float64(total), l.name+"-busiest-master-%")
	}
	b.ReportMetric(rate(1)/rate(0), "sharded/one-tag")
}

// evalshaCalls returns each master's count of EVALSHA calls so far, from
// INFO commandstats.
func evalshaCalls(b *testing.B, cluster *redis.ClusterClient) map[string]int64 {
	var mu sync.Mutex
	calls := map[string]int64{}
	err := cluster.ForEachMaster(context.Background(), func(ctx context.Context, node *redis.Client) error {
		info, err := node.Info(ctx, "commandstats").Result()
		if err != nil {
			return err
		}
		var n int64
		for line := range strings.Lines(info) {
			if rest, ok := strings.CutPrefix(line, "cmdstat_evalsha:calls="); ok {
				n, _ = strconv.ParseInt(rest[:strings.IndexByte(rest, ',')], 10, 64)
			}
		}
		mu.Lock()
		defer mu.Unlock()
		calls[node.Options().Addr] = n
		return nil
	})
	if err != nil {
		b.Fatal(err)
	}
	return calls
}

// BenchmarkReset measures Products.Reset, which follows every seed within
// its 15 s budget, on a cache holding b.N products — an entry and its
// generation each, as a load leaves them — on one Redis server and on the
// test Cluster. ns/op is the reset's time per cached product; s/reset is
// its whole time, the Bloom filter's rebuild from b.N product ids included.
//
//	go test -run '^$' -bench Reset -benchtime 100000x ./internal/cache
func BenchmarkReset(b *testing.B) {
	addrs := os.Getenv(testenv.RedisClusterEnv)
	if addrs == "" {
		b.Fatalf("%s is not set: this benchmark resets a cache on a Redis Cluster too; `make bench` starts one", testenv.RedisClusterEnv)
	}
	for _, topo := range []testenv.Topology{
		{Name: "single", Addrs: []string{testenv.RedisAddr(b)}},
		{Name: "cluster", Addrs: strings.Split(addrs, ",")},
	} {
		b.Run(topo.Name, func(b *testing.B) {
			ctx := context.Background()
			catalog := stock.NewCatalog(testenv.MySQL(b).Gorm)
			if err := catalog.Seed(ctx, b.N, 1); err != nil {
				b.Fatal(err)
			}
			rdb, prefix := testenv.RedisOn(b, topo)
			c := cache.New(cache.Deps{Redis: rdb, Source: catalog, Mutex: lock.NewRedis(rdb, lock.RedisOptions{Prefix: prefix + "mutex:", NoFencing: true})},
				cache.Settings{Prefix: prefix + "cache:", Bloom: true})
			b.Cleanup(c.Close)
			fillEntries(b, rdb, prefix+"cache:", b.N)

			b.ResetTimer()
			start := time.Now()
			dropped, err := c.Reset(ctx)
			took := time.Since(start)
			b.StopTimer()
			if err != nil {
				b.Fatal(err)
			}
			if dropped != b.N {
				b.Fatalf("Reset dropped %d entries, want %d", dropped, b.N)
			}
			b.Logf("%s: Reset of %d cached products took %v", topo.Name, b.N, took.Round(time.Millisecond))
			b.ReportMetric(took.Seconds(), "s/reset")
		})
	}
}
