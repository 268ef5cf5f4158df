package lockbench_test

import (
	"context"
	"testing"

	"github.com/redis/go-redis/v9"

	"shop/internal/testenv"
)

// BenchmarkUncontended is BenchmarkCompare's uncontended scenario alone, as
// an ordinary benchmark with a sub-benchmark per Redis lock, for a quick
// before and after and for profiles (-cpuprofile, -memprofile) of one lock:
//
//	go test -run '^$' -bench '^BenchmarkUncontended$/^ours$' -benchmem ./internal/lock/lockbench
//
// Each sub-benchmark has its own client on one private redis-server, and
// obtains and releases one key on one goroutine b.N times. BenchmarkCompare
// remains the comparison of record: it interleaves the locks' rounds, which
// a shared machine needs to compare them fairly.
func BenchmarkUncontended(b *testing.B) {
	addr, _ := testenv.RedisServer(b)
	ctx := context.Background()
	for _, c := range contenders {
		b.Run(c.name, func(b *testing.B) {
			cl := redis.NewClient(&redis.Options{Addr: addr, PoolSize: poolSize})
			defer cl.Close()
			l := c.new(cl, "bench:"+testenv.Name()+":")
			const key = "solo"
			cycle := func() {
				release, err := l.obtain(ctx, key)
				if err != nil {
					b.Fatalf("%s: obtain: %v", c.name, err)
				}
				if err := release(ctx); err != nil {
					b.Fatalf("%s: release: %v", c.name, err)
				}
			}
			for range 200 { // load the scripts, dial, warm the path
				cycle()
			}
			b.ReportAllocs()
			for b.Loop() {
				cycle()
			}
		})
	}
}
