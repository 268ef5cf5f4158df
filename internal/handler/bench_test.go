package handler_test

import (
	"context"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/gin-gonic/gin"

	"shop/internal/cache"
	"shop/internal/handler"
	"shop/internal/lock"
	"shop/internal/stock"
	"shop/internal/testenv"
)

// BenchmarkProductGET measures GET /api/v1/products/{id} over loopback HTTP,
// served from the Redis cache (with and without its Bloom filter) and
// straight from MySQL, side by side: the servers take turns in rounds of the
// same size, so that a noisy machine slows all alike. It reports each rate
// and its ratio to MySQL's.
//
//	make bench   # or: go test -run '^$' -bench ProductGET ./internal/handler
func BenchmarkProductGET(b *testing.B) {
	const (
		products = 5000
		workers  = 32
		round    = 2000
	)
	gin.SetMode(gin.ReleaseMode)
	db := testenv.MySQL(b)
	catalog := stock.NewCatalog(db.Gorm)
	ctx := context.Background()
	if err := catalog.Seed(ctx, products, 1); err != nil {
		b.Fatal(err)
	}
	rdb, prefix := testenv.Redis(b)
	newCache := func(bloom bool) *cache.Products {
		c := cache.New(cache.Deps{Redis: rdb, Source: catalog, Mutex: lock.NewRedis(rdb, lock.RedisOptions{Prefix: prefix + "mutex:", NoFencing: true})},
			cache.Settings{Prefix: prefix + "cache:", Bloom: bloom})
		b.Cleanup(c.Close)
		return c
	}
	withBloom, withoutBloom := newCache(true), newCache(false)
	if _, err := withBloom.Reset(ctx); err != nil {
		b.Fatal(err)
	}
	for id := int64(1); id <= products; id++ { // warm: this measures hits
		if _, err := withBloom.Product(ctx, id); err != nil {
			b.Fatal(err)
		}
	}
	serve := func(p handler.Products) string {
		srv := httptest.NewServer(both(handler.New(handler.Deps{Products: p, Stock: catalog}, handler.Settings{})))
		b.Cleanup(srv.Close)
		return srv.URL
	}
	targets := []struct {
		name string
		url  string
		took time.Duration
		n    int
	}{
		{name: "cache", url: serve(withBloom)},
		{name: "cache-nobloom", url: serve(withoutBloom)},
		{name: "mysql", url: serve(catalog)},
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: workers}}
	b.Cleanup(client.CloseIdleConnections)

	// get sends n GETs of random products to url from all workers at once.
	get := func(url string, n int) time.Duration {
		var (
			left atomic.Int64
			wg   sync.WaitGroup
			fail atomic.Value
		)
		left.Store(int64(n))
		start := time.Now()
		for range workers {
			wg.Go(func() {
				for left.Add(-1) >= 0 {
					res, err := client.Get(fmt.Sprintf("%s/api/v1/products/%d", url, 1+rand.IntN(products)))
					if err == nil {
						_, err = io.Copy(io.Discard, res.Body)
						res.Body.Close()
						if res.StatusCode != http.StatusOK {
							err = fmt.Errorf("status %d", res.StatusCode)
						}
					}
					if err != nil {
						fail.CompareAndSwap(nil, err)
					}
				}
			})
		}
		wg.Wait()
		if err, _ := fail.Load().(error); err != nil {
			b.Fatal(err)
		}
		return time.Since(start)
	}

	for i := range targets { // connections and code paths warm up
		get(targets[i].url, workers*10)
	}
	b.ResetTimer()
	for left := b.N; left > 0; left -= round {
		for i := range targets {
			n := min(round, left)
			targets[i].took += get(targets[i].url, n)
			targets[i].n += n
		}
	}
	b.StopTimer()
	rate := func(i int) float64 { return float64(targets[i].n) / targets[i].took.Seconds() }
	mysql := rate(len(targets) - 1)
	for i, t := range targets {
		b.ReportMetric(rate(i), t.name+"-req/s")
		if t.name != "mysql" {
			b.ReportMetric(rate(i)/mysql, t.name+"/mysql")
		}
	}
}
