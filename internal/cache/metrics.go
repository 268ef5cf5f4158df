package cache

import "github.com/prometheus/client_golang/prometheus"

// metrics are the cache's counters. The hit ratio is
//
//	(hits + null_hits) / (hits + null_hits + misses)
//
// Bloom rejects are answered before the cache and count in none of the three.
type metrics struct {
	hits, nullHits, misses, bloomRejects prometheus.Counter
	bloomStale                           prometheus.Counter
	loads, loadErrors, refreshes         prometheus.Counter
	skips                                prometheus.Counter
	fallbacks                            *prometheus.CounterVec
}

func newMetrics(reg prometheus.Registerer) *metrics {
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Namespace: "shop", Subsystem: "cache", Name: name, Help: help})
	}
	m := &metrics{
		hits:         counter("hits_total", "Product reads answered from a cached product."),
		nullHits:     counter("null_hits_total", "Product reads answered from a cached placeholder: the product does not exist."),
		misses:       counter("misses_total", "Product reads that found nothing cached."),
		bloomRejects: counter("bloom_rejects_total", "Product reads the Bloom filter answered as not found, touching neither the cache nor MySQL."),
		bloomStale:   counter("bloom_stale_total", "Product reads the Bloom filter ruled out with a shard built from another catalog than MySQL's current one: let through to the cache and MySQL, as with no filter, while a replica rebuilds the shard."),
		loads:        counter("loads_total", "Products loaded from MySQL into the cache, refreshes included."),
		loadErrors:   counter("load_errors_total", "Loads from MySQL that failed."),
		refreshes:    counter("refreshes_total", "Entries renewed ahead of expiry in the background."),
		skips:        counter("skips_total", "Product reads sent to the MySQL fallback without asking Redis, because a Redis call had shown it down less than a second before."),
		fallbacks: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "shop", Subsystem: "cache", Name: "fallbacks_total",
			Help: "Product reads that went to MySQL without the cache (Redis failed, or a rebuild took too long): served, or rejected because the fallback was at its limit.",
		}, []string{"result"}),
	}
	if reg != nil {
		reg.MustRegister(m.hits, m.nullHits, m.misses, m.bloomRejects, m.bloomStale, m.loads, m.loadErrors, m.refreshes, m.skips, m.fallbacks)
	}
	return m
}
