package main

import (
	"log/slog"
	"time"

	"shop/internal/cache"
	"shop/internal/handler"
	"shop/internal/lock"
	"shop/internal/stock"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
)

// The product cache of a replica, and of the tools that reset it.

// bloomCopyEvery is how often a replica reads its copy of the Bloom filter
// again (cache.Settings.BloomCopy). The copy's "no" is only trusted while
// it is of the catalog MySQL has (checked at most a second apart), and a
// seed has every replica drop its copy once the new filter is built, so
// this bounds nothing a buyer sees: only how often a replica asks for a
// filter that has not changed.
const bloomCopyEvery = 10 * time.Second

// cacheMutexTTL is the lease of a product cache's load mutex: far longer
// than a load (its watchdog renews it meanwhile).
const cacheMutexTTL = 5 * time.Second

// pageLoadTimeout bounds a replica's load of a product page into its own
// copy (cache.Pages), which may wait for another replica's load of the
// product (cache.Settings.Wait, 1s) and then for MySQL (LoadTimeout, 3s).
const pageLoadTimeout = 5 * time.Second

// handlerPages is pages as the handler takes it: none when nil.
func handlerPages(pages *cache.Pages) handler.Pages {
	if pages == nil {
		return nil
	}
	return pages
}

// newCache is the product cache on rdb in front of catalog, and what closes
// it: its background work, then the client of its load mutexes. Its metrics
// go to reg when it is not nil; hook, when not nil, is added to the mutexes'
// client (the dependency errors' count).
//
// The mutexes have a client of their own, which never retries, as the order
// lock's (lockRedisOptions): a retry of a SET NX whose reply was lost finds
// the key held by its own token, and the mutex would stay taken for a whole
// TTL by a try nobody knows of, every replica's read of that product
// waiting for it and then falling back to MySQL. Seen as an error, the lost
// reply makes the lock give the key back at once.
//
// With announcer, every invalidation is announced to the replicas, and
// pages, when not nil, is this replica's own copy of the pages, which it
// drops from too. Tools that only seed pass neither.
func newCache(cfg config, rdb redis.UniversalClient, catalog *stock.Catalog, reg prometheus.Registerer, log *slog.Logger, hook redis.Hook,
	announcer cache.Announcer, pages *cache.Pages) (*cache.Products, func()) {
	mutexRdb := withHook(newLockRedis(cfg.Redis, cacheMutexTTL), hook)
	mutex := lock.NewRedis(mutexRdb, lock.RedisOptions{Prefix: cfg.Redis.Prefix + "cache:mutex:", TTL: cacheMutexTTL, NoFencing: true})
	jitter := cfg.Cache.Jitter
	if jitter == 0 {
		jitter = -1 // none; zero would mean the default
	}
	products := cache.New(cache.Deps{
		Redis:      rdb,
		Source:     catalog,
		Mutex:      mutex,
		Announcer:  announcer,
		Pages:      pages,
		Registerer: reg,
		Logger:     log,
	}, cache.Settings{
		Prefix:    cfg.Redis.Prefix + "cache:",
		TTL:       cfg.Cache.TTL,
		Jitter:    jitter,
		NullTTL:   cfg.Cache.NullTTL,
		Bloom:     cfg.Cache.Bloom,
		BloomCopy: bloomCopyEvery,
	})
	return products, func() {
		products.Close()
		mutexRdb.Close()
	}
}
