package cache_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"gorm.io/gorm"

	"shop/internal/cache"
	"shop/internal/keyspace"
	"shop/internal/lock"
	"shop/internal/notify"
	"shop/internal/stock"
	"shop/internal/testenv"
)

// TestMain silences go-redis's own log: the Redis-down test makes it print a
// line per failed dial.
func TestMain(m *testing.M) {
	redis.SetLogger(quiet{})
	os.Exit(m.Run())
}

type quiet struct{}

func (quiet) Printf(context.Context, string, ...any) {}

// queries counts what MySQL's products table is asked, across every replica
// of a test; epochs counts the questions for the catalog's epoch.
type queries struct {
	total, inFlight, peak atomic.Int64
	epochs                atomic.Int64
	// delay, when set, is how long each product query takes at least, so
	// that concurrent readers really overlap a load.
	delay time.Duration
	// gate, when set, is called after each product query has run, before its
	// result is used: a test blocks there to pause a load.
	gate func()
}

// fixture is a seeded database and a Redis key space shared by the replicas
// of one test.
type fixture struct {
	db     *testenv.DB
	topo   testenv.Topology
	rdb    redis.UniversalClient // the test's own look at Redis
	prefix string
	q      *queries

	// strict fixtures (newFixtureOn) fail the test when one of their
	// replicas fell back to MySQL or logged a warning (see checkClean).
	strict   bool
	log      testenv.Log
	replicas []replica
}

// newFixture is a fixture on the single test Redis.
func newFixture(t *testing.T, products, units int) *fixture {
	t.Helper()
	rdb, prefix := testenv.Redis(t)
	topo := testenv.Topology{Name: "single", Addrs: []string{testenv.RedisAddr(t)}}
	return seeded(t, &fixture{topo: topo, rdb: rdb, prefix: prefix, q: &queries{}}, products, units)
}

// newFixtureOn is a strict fixture on a Redis deployment: a Redis error that
// a read hides by falling back to MySQL, or that the cache only logs (a
// script whose keys are in different slots of a Cluster: CROSSSLOT), fails
// the test when it ends. Its replicas are patient: a read that fell back
// because a busy machine left it no CPU for RedisTimeout, or a question for
// the catalog's epoch that it logged for outlasting EpochTimeout, would fail
// the test too, for no fault of Redis.
func newFixtureOn(t *testing.T, topo testenv.Topology, products, units int) *fixture {
	t.Helper()
	rdb, prefix := testenv.RedisOn(t, topo)
	f := &fixture{topo: topo, rdb: rdb, prefix: prefix, q: &queries{}, strict: true}
	t.Cleanup(func() { f.checkClean(t) }) // after the replicas have closed
	return seeded(t, f, products, units)
}

func seeded(t *testing.T, f *fixture, products, units int) *fixture {
	t.Helper()
	f.db = testenv.MySQL(t)
	if err := stock.NewCatalog(f.db.Gorm).Seed(context.Background(), products, units); err != nil {
		t.Fatal(err)
	}
	return f
}

// checkClean fails the test if a replica of the fixture fell back to MySQL
// or logged a warning: on a strict fixture, every Redis call must succeed.
func (f *fixture) checkClean(t *testing.T) {
	t.Helper()
	for i, r := range f.replicas {
		if n := r.counter(t, "fallbacks_total"); n != 0 {
			t.Errorf("replica %d: %.0f reads fell back to MySQL: a Redis call failed on %s", i, n, f.topo.Name)
		}
	}
	if log := f.log.String(); log != "" {
		t.Errorf("the replicas logged warnings on %s:\n%s", f.topo.Name, log)
	}
}

// catalog is a replica's own pool on the database, with the fixture's
// counters on it.
func (f *fixture) catalog(t *testing.T) *stock.Catalog {
	t.Helper()
	g := f.db.Open(t)
	// The catalog's reads are SQL of package stock's, run through gorm's
	// Raw: the row callbacks see them, with their text.
	reads := func(tx *gorm.DB, table string) bool {
		return strings.Contains(tx.Statement.SQL.String(), " FROM "+table+" ")
	}
	products := func(tx *gorm.DB) bool { return reads(tx, "products") }
	err := g.Callback().Row().Before("gorm:row").Register("test:before", func(tx *gorm.DB) {
		if reads(tx, "catalog_epoch") {
			f.q.epochs.Add(1)
		}
		if !products(tx) {
			return
		}
		f.q.total.Add(1)
		n := f.q.inFlight.Add(1)
		for p := f.q.peak.Load(); n > p && !f.q.peak.CompareAndSwap(p, n); p = f.q.peak.Load() {
		}
		time.Sleep(f.q.delay)
	})
	if err == nil {
		err = g.Callback().Row().After("gorm:row").Register("test:after", func(tx *gorm.DB) {
			if !products(tx) {
				return
			}
			f.q.inFlight.Add(-1)
			if f.q.gate != nil {
				f.q.gate()
			}
		})
	}
	if err != nil {
		t.Fatal(err)
	}
	return stock.NewCatalog(g)
}

// pauseFirstQuery makes the next product query stop after it has run:
// paused is closed then, and the query goes on when resume is closed.
func (f *fixture) pauseFirstQuery() (paused, resume chan struct{}) {
	paused, resume = make(chan struct{}), make(chan struct{})
	var first atomic.Bool
	f.q.gate = func() {
		if first.CompareAndSwap(false, true) {
			close(paused)
			<-resume
		}
	}
	return paused, resume
}

// replica is one process's cache: its own Redis client, database pool,
// singleflight group and metrics.
type replica struct {
	*cache.Products
	reg *prometheus.Registry
}

func (f *fixture) replica(t *testing.T, s cache.Settings) replica {
	return f.replicaWith(t, s, lock.RedisOptions{})
}

// replicaWith is a replica on a client of its own of the fixture's Redis,
// whose load mutexes have options mutex.
func (f *fixture) replicaWith(t *testing.T, s cache.Settings, mutex lock.RedisOptions) replica {
	t.Helper()
	rdb := f.topo.Client(t, nil)
	return f.replicaOn(t, cache.Deps{Redis: rdb}, rdb, s, mutex)
}

// replicaOn is a replica that caches in d.Redis, with d's Announcer and
// Pages, and takes its load mutexes in mutexRdb (the same client, in the
// service). Its source is a pool of its own on the fixture's database.
func (f *fixture) replicaOn(t *testing.T, d cache.Deps, mutexRdb redis.UniversalClient, s cache.Settings, mutex lock.RedisOptions) replica {
	t.Helper()
	mutex.Prefix = f.prefix + "mutex:"
	mutex.NoFencing = true
	reg := prometheus.NewRegistry()
	s.Prefix = f.prefix + "cache:"
	d.Source, d.Mutex, d.Registerer = f.catalog(t), lock.NewRedis(mutexRdb, mutex), reg
	if f.strict {
		s = patient(s)
		if d.Logger == nil {
			d.Logger = slog.New(slog.NewTextHandler(&f.log, &slog.HandlerOptions{Level: slog.LevelWarn}))
		}
	}
	c := cache.New(d, s)
	t.Cleanup(c.Close)
	r := replica{c, reg}
	f.replicas = append(f.replicas, r)
	return r
}

// patient is s with the timeouts it leaves unset far above what a busy
// machine makes a Redis call, a wait or a load take: for a test about
// something else than them, which a read that fell back to MySQL for want
// of CPU would fail (a read that falls back caches nothing).
func patient(s cache.Settings) cache.Settings {
	for _, d := range []*time.Duration{&s.Wait, &s.LoadTimeout, &s.EpochTimeout, &s.FallbackWait, &s.RedisTimeout} {
		if *d == 0 {
			*d = 10 * time.Second
		}
	}
	return s
}

// client is a client of the Redis at o.Addr with options o — as the
// service's, it honours context deadlines — closed when the test ends.
func client(t *testing.T, o redis.Options) *redis.Client {
	t.Helper()
	o.ContextTimeoutEnabled = true
	c := redis.NewClient(&o)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Ping(ctx).Err(); err != nil {
		t.Fatalf("redis at %s: %v", o.Addr, err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

// counter returns the value of a cache counter, summed over its labels.
func (r replica) counter(t *testing.T, name string) float64 {
	t.Helper()
	families, err := r.reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var sum float64
	for _, f := range families {
		if f.GetName() == "shop_cache_"+name {
			for _, m := range f.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	return sum
}

// reads runs n calls of read on workers goroutines that start together, and
// returns the errors, nil ones included.
func reads(n, workers int, read func(i int) error) []error {
	errs := make([]error, n)
	var (
		next  atomic.Int64
		start = make(chan struct{})
		wg    sync.WaitGroup
	)
	for range workers {
		wg.Go(func() {
			<-start
			for i := int(next.Add(1)) - 1; i < n; i = int(next.Add(1)) - 1 {
				errs[i] = read(i)
			}
		})
	}
	close(start)
	wg.Wait()
	return errs
}

// TestPenetration runs on every Redis deployment: on a Cluster, the
// filter's shards and the entries are spread over the masters.
func TestPenetration(t *testing.T) {
	t.Parallel()
	testenv.EachTopology(t, testPenetration)
}

func testPenetration(t *testing.T, topo testenv.Topology) {
	const (
		products = 5000
		distinct = 500
		gets     = 2000
	)
	absent := func(i int) int64 { return products + 1 + int64(i%distinct) }
	notFoundOnly := func(t *testing.T, errs []error) {
		t.Helper()
		for _, err := range errs {
			if !errors.Is(err, stock.ErrNotFound) {
				t.Fatalf("GET of an absent id: %v, want ErrNotFound", err)
			}
		}
	}

	t.Run("bloom", func(t *testing.T) {
		f := newFixtureOn(t, topo, products, 1)
		r := f.replica(t, cache.Settings{Bloom: true})
		if _, err := r.Reset(context.Background()); err != nil {
			t.Fatal(err)
		}
		f.q.total.Store(0)
		errs := reads(gets, 50, func(i int) error {
			_, err := r.Product(context.Background(), absent(i))
			return err
		})
		notFoundOnly(t, errs)

		// Each id the filter lets through (a false positive) is loaded once
		// and then answered by its placeholder. With p = 0.001, 500 absent
		// ids give 0.5 false positives on average; 10 or more has a
		// probability below 1e-9 (binomial tail), and the hashes are
		// deterministic, so the count is the same on every run.
		rejects := r.counter(t, "bloom_rejects_total")
		loaded := f.q.total.Load()
		t.Logf("%d GETs over %d absent ids: %.0f Bloom rejects, %d GETs passed, %d MySQL queries", gets, distinct, rejects, gets-int(rejects), loaded)
		if loaded > 10 {
			t.Errorf("MySQL saw %d queries, want at most 10", loaded)
		}
		// The GETs the filter let through missed, or found the
		// placeholder; a miss beyond the loads shared a load under way.
		passed := float64(gets) - rejects
		nullHits, misses := r.counter(t, "null_hits_total"), r.counter(t, "misses_total")
		if nullHits+misses != passed || misses < float64(loaded) {
			t.Errorf("placeholder hits = %.0f, misses = %.0f; want %.0f in all (the GETs let through), a miss at least per loaded id (%d)", nullHits, misses, passed, loaded)
		}
		if loads := r.counter(t, "loads_total"); loads != float64(loaded) {
			t.Errorf("loads = %.0f, want one per query (%d)", loads, loaded)
		}
		// Rejected ids leave nothing in Redis: only the passed ones have
		// placeholders.
		if n := entries(t, f); int64(n) != loaded {
			t.Errorf("%d entries cached, want %d (the placeholders of ids the filter let through)", n, loaded)
		}
		// No false negatives: every product passes.
		for id := int64(1); id <= products; id += 97 {
			if _, err := r.Product(context.Background(), id); err != nil {
				t.Fatalf("GET product %d: %v", id, err)
			}
		}
	})

	t.Run("null caching", func(t *testing.T) {
		f := newFixtureOn(t, topo, products, 1)
		r := f.replica(t, cache.Settings{Bloom: false})
		errs := reads(gets, 50, func(i int) error {
			_, err := r.Product(context.Background(), absent(i))
			return err
		})
		notFoundOnly(t, errs)
		loaded := f.q.total.Load()
		nullHits, misses := r.counter(t, "null_hits_total"), r.counter(t, "misses_total")
		t.Logf("%d GETs over %d absent ids without Bloom: %d MySQL queries, %.0f placeholder hits, %.0f misses", gets, distinct, loaded, nullHits, misses)
		if loaded != distinct {
			t.Errorf("MySQL saw %d queries, want one per distinct id (%d)", loaded, distinct)
		}
		// Every GET is answered by a placeholder or misses; the misses
		// beyond the loads shared a load under way (a slow machine may
		// still be loading id i when GET i+500 comes).
		if nullHits+misses != gets || nullHits < gets/2 {
			t.Errorf("placeholder hits = %.0f, misses = %.0f; want %d in all, mostly placeholder hits", nullHits, misses, gets)
		}
	})
}

// entries counts the cached entries (products and placeholders) of f, on
// every master.
func entries(t *testing.T, f *fixture) int {
	t.Helper()
	n := 0
	if err := keyspace.Scan(context.Background(), f.rdb, f.prefix+"cache:product:*}", func(string) { n++ }); err != nil {
		t.Fatal(err)
	}
	return n
}

func scan(rdb *redis.Client, match string) ([]string, error) {
	ctx := context.Background()
	var keys []string
	iter := rdb.Scan(ctx, 0, match, 1000).Iterator()
	for iter.Next(ctx) {
		keys = append(keys, iter.Val())
	}
	return keys, iter.Err()
}

// TestBreakdownOneLoadAcrossReplicas runs on every Redis deployment: the
// load mutex, the entry and its generation share no slot on a Cluster.
func TestBreakdownOneLoadAcrossReplicas(t *testing.T) {
	t.Parallel()
	testenv.EachTopology(t, testBreakdownOneLoadAcrossReplicas)
}

func testBreakdownOneLoadAcrossReplicas(t *testing.T, topo testenv.Topology) {
	f := newFixtureOn(t, topo, 10, 100)
	// The strict fixture's patient timeouts, and a load mutex whose lease
	// outlasts any gap between its renewals: 1000 goroutines on a busy
	// machine must not fall back, or lose the load's lease, for want of
	// CPU (a load starved past the default LoadTimeout of 3s, a renewal
	// past the lease of 5s, were seen); this test is about the number of
	// loads.
	set := cache.Settings{Jitter: -1, RefreshAhead: -1}
	mutex := lock.RedisOptions{TTL: time.Minute}
	replicas := []replica{f.replicaWith(t, set, mutex), f.replicaWith(t, set, mutex), f.replicaWith(t, set, mutex)}
	ctx := context.Background()
	if _, err := replicas[0].Product(ctx, 7); err != nil {
		t.Fatal(err)
	}
	// The hot key expires (its entry goes, its generation stays, as when
	// its TTL runs out), then 1000 buyers come at once, spread over the
	// replicas, while its load takes 100ms. The entry is deleted rather
	// than left to a short TTL, which a slow machine could outlast during
	// the reads and count a second load.
	if err := f.rdb.Del(ctx, f.prefix+"cache:product:{7}").Err(); err != nil {
		t.Fatal(err)
	}
	if n := entries(t, f); n != 0 {
		t.Fatalf("%d entries still cached after the expiry", n)
	}
	warmLoads := replicas[0].counter(t, "loads_total")
	f.q.total.Store(0)
	f.q.delay = 100 * time.Millisecond
	errs := reads(1000, 1000, func(i int) error {
		p, err := replicas[i%3].Product(ctx, 7)
		if err == nil && (p.ID != 7 || p.Stock != 100) {
			return errors.New("wrong product")
		}
		return err
	})
	for _, err := range errs {
		if err != nil {
			t.Fatalf("GET: %v", err)
		}
	}
	loads := -warmLoads
	for _, r := range replicas {
		loads += r.counter(t, "loads_total")
	}
	t.Logf("1000 concurrent GETs of an expired hot key on 3 replicas: %d MySQL queries, %.0f loads", f.q.total.Load(), loads)
	if n := f.q.total.Load(); n != 1 {
		t.Errorf("MySQL saw %d queries, want exactly 1", n)
	}
	if loads != 1 {
		t.Errorf("loads = %.0f, want 1", loads)
	}
}

// Keys cached at once, as a restart or a seed caches them, expire spread
// over the window their TTLs are drawn from, not at once. 1000 keys in
// buckets of 5 seconds over the defaults' window of 2 minutes are 41.7 keys
// per bucket on average, as 5000 keys in buckets of a second were.
func TestAvalancheJitterSpreadsExpiry(t *testing.T) {
	t.Parallel()
	const (
		products = 1000
		bucket   = 5 * time.Second
	)
	f := newFixture(t, products, 1)
	rdb := testenv.RedisAt(t, testenv.RedisAddr(t))

	// warm caches every product at once and returns the most keys expiring
	// in one bucket and the mean over the window the TTLs are drawn from.
	// Its reads are patient: one that fell back to MySQL would cache
	// nothing.
	warm := func(t *testing.T, s cache.Settings, window time.Duration) (most int, mean float64) {
		t.Helper()
		f.prefix += "x" // a key space of its own
		r := f.replica(t, patient(s))
		errs := reads(products, 16, func(i int) error {
			_, err := r.Product(context.Background(), int64(i+1))
			return err
		})
		for _, err := range errs {
			if err != nil {
				t.Fatalf("warm: %v", err)
			}
		}
		keys, err := scan(rdb, f.prefix+"cache:product:*}")
		if err != nil || len(keys) != products {
			t.Fatalf("%d keys cached (%v), want %d", len(keys), err, products)
		}
		pipe := rdb.Pipeline()
		ttls := make([]*redis.DurationCmd, len(keys))
		for i, k := range keys {
			ttls[i] = pipe.PTTL(context.Background(), k)
		}
		if _, err := pipe.Exec(context.Background()); err != nil {
			t.Fatal(err)
		}
		now := time.Now()
		buckets := map[int64]int{}
		for _, c := range ttls {
			buckets[now.Add(c.Val()).UnixMilli()/bucket.Milliseconds()]++
		}
		for _, n := range buckets {
			most = max(most, n)
		}
		return most, float64(products) * bucket.Seconds() / window.Seconds()
	}

	t.Run("jittered", func(t *testing.T) {
		// The defaults: 10m ± 10%, a window of 2 minutes.
		most, mean := warm(t, cache.Settings{}, 2*time.Minute)
		t.Logf("%d keys warmed at once, TTL 10m±10%%: at most %d expire in %s; mean %.1f", products, most, bucket, mean)
		if float64(most) > 2*mean {
			t.Errorf("%d keys expire in %s, more than twice the mean %.1f", most, bucket, mean)
		}
	})
	t.Run("without jitter", func(t *testing.T) {
		// The same measure over the same window shows the avalanche the
		// jitter prevents: every key expires within the span of the warm,
		// which a slow machine must keep under a minute (half the window)
		// for the measure to tell.
		most, mean := warm(t, cache.Settings{Jitter: -1}, 2*time.Minute)
		t.Logf("without jitter: %d keys expire in %s; mean over 2m would be %.1f", most, bucket, mean)
		if float64(most) <= 2*mean {
			t.Errorf("without jitter only %d keys share %s: the measure cannot tell", most, bucket)
		}
	})
}

func TestPlaceholderNeverOverwritesRealValue(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 10, 1)
	ctx := context.Background()

	// Replica a reads product 42 while it does not exist, then stalls past
	// its mutex's lease (its watchdog frozen, as in a long GC pause).
	paused, resume := f.pauseFirstQuery()
	frozen := func(time.Duration) <-chan time.Time { return nil }
	a := f.replicaWith(t, cache.Settings{}, lock.RedisOptions{TTL: 200 * time.Millisecond, After: frozen})
	b := f.replica(t, cache.Settings{})
	aDone := make(chan error, 1)
	go func() {
		_, err := a.Product(ctx, 42)
		aDone <- err
	}()
	<-paused

	// Meanwhile the product is created and replica b caches it.
	if err := f.db.Gorm.Create(&stock.Product{ID: 42, Name: "Late arrival", PriceCents: 500, InitialStock: 3, Stock: 3}).Error; err != nil {
		t.Fatal(err)
	}
	time.Sleep(300 * time.Millisecond) // a's lease runs out
	if p, err := b.Product(ctx, 42); err != nil || p.Name != "Late arrival" {
		t.Fatalf("b: %+v, %v", p, err)
	}

	// a wakes up and writes its placeholder with NX: it must not land.
	close(resume)
	if err := <-aDone; !errors.Is(err, stock.ErrNotFound) {
		t.Errorf("a = %v, want ErrNotFound (what MySQL said when a read it)", err)
	}
	for _, r := range []replica{a, b} {
		if p, err := r.Product(ctx, 42); err != nil || p.Stock != 3 {
			t.Errorf("after the late placeholder: %+v, %v; want the product", p, err)
		}
	}
}

func TestRealValueReplacesPlaceholder(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 10, 1)
	ctx := context.Background()
	r := f.replica(t, cache.Settings{NullTTL: 500 * time.Millisecond, Jitter: -1})
	if _, err := r.Product(ctx, 43); !errors.Is(err, stock.ErrNotFound) {
		t.Fatalf("GET of an absent product: %v", err)
	}
	if err := f.db.Gorm.Create(&stock.Product{ID: 43, Name: "New", PriceCents: 100, InitialStock: 1, Stock: 1}).Error; err != nil {
		t.Fatal(err)
	}
	// The placeholder answers until it expires; then the product shows.
	if _, err := r.Product(ctx, 43); !errors.Is(err, stock.ErrNotFound) {
		t.Fatalf("GET within the null TTL: %v, want the cached ErrNotFound", err)
	}
	deadline := time.Now().Add(2 * time.Second)
	for {
		p, err := r.Product(ctx, 43)
		if err == nil && p.Name == "New" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("product still hidden 2s after creation (null TTL 500ms): %v", err)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if loads := r.counter(t, "loads_total"); loads != 2 {
		t.Errorf("loads = %.0f, want 2 (placeholder, then product)", loads)
	}
}

func TestOrderInvalidatesCachedStock(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 3, 5)
	ctx := context.Background()
	r := f.replica(t, cache.Settings{Bloom: true})
	if _, err := r.Reset(ctx); err != nil {
		t.Fatal(err)
	}
	orders := stock.NewService(stock.Deps{DB: f.db.Gorm, Locks: lock.NewLocal(time.Second), Announcer: r}, stock.Settings{}, stock.Hooks{})

	if p, err := r.Product(ctx, 1); err != nil || p.Stock != 5 {
		t.Fatalf("before the order: %+v, %v", p, err)
	}
	if _, err := orders.PlaceOrder(ctx, 1, 100, ""); err != nil {
		t.Fatal(err)
	}
	// PlaceOrder returns after the invalidation: the next read is fresh.
	if p, err := r.Product(ctx, 1); err != nil || p.Stock != 4 {
		t.Fatalf("right after the order: %+v, %v; want stock 4", p, err)
	}

	// A load that read MySQL before an order committed must not write the
	// older stock back after the invalidation.
	paused, resume := f.pauseFirstQuery()
	if err := r.Announce(ctx, notify.Event{Kind: notify.Changed, SKU: 2}); err != nil {
		t.Fatal(err)
	}
	loaded := make(chan stock.Product, 1)
	go func() {
		p, _ := r.Product(ctx, 2)
		loaded <- p
	}()
	<-paused // the load has read stock 5
	if _, err := orders.PlaceOrder(ctx, 2, 100, ""); err != nil {
		t.Fatal(err)
	}
	close(resume)
	if p := <-loaded; p.Stock != 5 {
		t.Fatalf("the paused load returned stock %d, want the 5 it read", p.Stock)
	}
	if p, err := r.Product(ctx, 2); err != nil || p.Stock != 4 {
		t.Fatalf("after the order: %+v, %v; want stock 4, not the paused load's 5", p, err)
	}
}

func TestRefreshAheadServesAndRenewsOnce(t *testing.T) {
	f := newFixture(t, 10, 1)
	ctx := context.Background()
	rdb := testenv.RedisAt(t, testenv.RedisAddr(t))
	// An entry is due for refresh 1.5 s after its load, and lives 15 s:
	// the reads below come after it is due, long before it expires, and
	// once it is renewed it is due again only 1.5 s later, which the 300
	// reads outlasted by half a second on a loaded machine when it was due
	// 0.5 s after each load (a second refresh, rightly).
	set := cache.Settings{TTL: 15 * time.Second, Jitter: -1, RefreshAhead: 0.9, RedisTimeout: 5 * time.Second}
	replicas := []replica{f.replica(t, set), f.replica(t, set), f.replica(t, set)}
	if _, err := replicas[0].Product(ctx, 5); err != nil {
		t.Fatal(err)
	}
	time.Sleep(1600 * time.Millisecond)
	key := f.prefix + "cache:product:{5}"
	// expiry is when the entry expires, give or take a round trip.
	expiry := func() time.Time { return time.Now().Add(rdb.PTTL(ctx, key).Val()) }
	before := expiry()

	warmMisses := replicas[0].counter(t, "misses_total")
	f.q.total.Store(0)
	f.q.delay = 50 * time.Millisecond
	errs := reads(300, 300, func(i int) error {
		_, err := replicas[i%3].Product(ctx, 5)
		return err
	})
	for _, err := range errs {
		if err != nil {
			t.Fatalf("GET: %v", err)
		}
	}
	misses, refreshes := -warmMisses, 0.0
	for _, r := range replicas {
		r.Close() // waits for the background refresh
		misses += r.counter(t, "misses_total")
		refreshes += r.counter(t, "refreshes_total")
	}
	// Renewed a second or more after its load, the entry expires that much
	// later.
	later := expiry().Sub(before)
	t.Logf("300 GETs in the refresh window: %.0f misses, %.0f refreshes, %d MySQL queries; the entry expires %v later", misses, refreshes, f.q.total.Load(), later)
	if misses != 0 {
		t.Errorf("misses = %.0f: reads in the refresh window must be served", misses)
	}
	if n := f.q.total.Load(); n != 1 || refreshes != 1 {
		t.Errorf("%d MySQL queries, %.0f refreshes; want exactly one refresh", n, refreshes)
	}
	if later < 500*time.Millisecond {
		t.Errorf("the entry expires %v later than before the reads: it was not renewed", later)
	}
}

func TestBloomFilterRebuiltWhenMissing(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 100, 1)
	ctx := context.Background()
	r := f.replica(t, cache.Settings{Bloom: true})
	// No filter yet (Redis restarted empty, say): products are not turned
	// away, and the filter gets built.
	if _, err := r.Product(ctx, 50); err != nil {
		t.Fatalf("GET with no filter: %v", err)
	}
	deadline := time.Now().Add(5 * time.Second)
	for r.counter(t, "bloom_rejects_total") == 0 {
		if time.Now().After(deadline) {
			t.Fatal("absent ids are still not rejected 5s after the filter went missing")
		}
		if _, err := r.Product(ctx, 100_000); !errors.Is(err, stock.ErrNotFound) {
			t.Fatalf("GET of an absent product: %v", err)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := r.Product(ctx, 100); err != nil {
		t.Errorf("GET product 100 after the rebuild: %v", err)
	}
}

func TestRedisDownFallsBackWithinLimit(t *testing.T) {
	f := newFixture(t, 100, 1)
	ctx := context.Background()
	addr, kill := testenv.RedisServer(t)
	const limit = 3
	// A client like the service's, whose commands end with their context:
	// a dead Redis then fails reads with timeouts as well as EOFs.
	rdb := client(t, redis.Options{Addr: addr, PoolSize: 200})
	r := f.replicaOn(t, cache.Deps{Redis: rdb}, rdb, cache.Settings{Bloom: true, Fallback: limit, FallbackWait: 50 * time.Millisecond, RedisTimeout: 500 * time.Millisecond}, lock.RedisOptions{})
	if _, err := r.Reset(ctx); err != nil {
		t.Fatal(err)
	}
	// Every product cached, and the client's pools holding a connection
	// for each of the 100 readers below before they start: a patient
	// replica on the same client reads with 100 readers first. Dialled
	// under the 500ms of the readers' first reads, on a busy machine, a
	// connection outlasted it, and its read fell back to MySQL while Redis
	// was up.
	warm := f.replicaOn(t, cache.Deps{Redis: rdb}, rdb, patient(cache.Settings{Bloom: true}), lock.RedisOptions{})
	for range 2 {
		for _, err := range reads(100, 100, func(i int) error {
			_, err := warm.Product(ctx, int64(i+1))
			return err
		}) {
			if err != nil {
				t.Fatal(err)
			}
		}
	}
	f.q.total.Store(0)
	f.q.peak.Store(0)
	f.q.delay = 10 * time.Millisecond

	// Readers keep going; Redis dies under them.
	var served, busy, other atomic.Int64
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for w := range 100 {
		wg.Go(func() {
			for i := int64(w); ; i++ {
				select {
				case <-stop:
					return
				default:
				}
				_, err := r.Product(ctx, 1+i%100)
				switch {
				case err == nil:
					served.Add(1)
				case errors.Is(err, stock.ErrBusy):
					busy.Add(1)
				default:
					other.Add(1)
				}
			}
		})
	}
	time.Sleep(300 * time.Millisecond)
	cached := served.Load()
	if n := f.q.total.Load(); n != 0 {
		t.Errorf("%d MySQL queries while Redis was up and every product cached", n)
	}
	kill()
	killedAt := time.Now()
	time.Sleep(time.Second)
	close(stop)
	wg.Wait()
	down := time.Since(killedAt)

	n := f.q.total.Load()
	answered := served.Load() + busy.Load() - cached
	t.Logf("100 readers: %d served from the cache in 300ms; then Redis down for %v: %d reads answered, %d from MySQL (%.0f queries/s, at most %d at once), %d busy",
		cached, down.Round(time.Millisecond), answered, n, float64(n)/down.Seconds(), f.q.peak.Load(), busy.Load())
	if other.Load() != 0 {
		t.Errorf("%d reads failed with something else than ErrBusy", other.Load())
	}
	if p := f.q.peak.Load(); p > limit {
		t.Errorf("%d MySQL queries at once, limit %d", p, limit)
	}
	if n == 0 || busy.Load() == 0 {
		t.Errorf("%d served from MySQL, %d busy: want both, the limit serving some and refusing the rest", n, busy.Load())
	}
	// A dead Redis is an outage: reads stop asking it for a while.
	if skips := r.counter(t, "skips_total"); skips == 0 {
		t.Error("no read skipped the dead Redis")
	}
	// Reads skip the dead Redis rather than wait out its timeout (500ms)
	// each: each of the 100 readers is answered within the fallback's wait
	// (50ms), so 500 answers in a second is a wide margin.
	if answered < 500 {
		t.Errorf("%d reads answered in %v of outage: reads are waiting on the dead Redis", answered, down)
	}
	// With each query taking at least 10ms, the limit caps the rate.
	if rate, most := float64(n)/down.Seconds(), float64(limit)/0.010; rate > most {
		t.Errorf("%.0f MySQL queries/s, above the %.0f/s the limit allows", rate, most)
	}
}

// within waits for ch to close, failing the test if that takes more than
// ten seconds: what names the event.
func within(t *testing.T, ch <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-ch:
	case <-time.After(10 * time.Second):
		t.Fatalf("%s did not happen within 10s", what)
	}
}

// allFound fails the test unless every product from..to is found through r.
func allFound(t *testing.T, r replica, from, to int64) {
	t.Helper()
	var missing []int64
	for id := from; id <= to; id++ {
		if _, err := r.Product(context.Background(), id); err != nil {
			missing = append(missing, id)
		}
	}
	if len(missing) > 0 {
		t.Fatalf("%d of products %d..%d not found (%v…), %.0f Bloom rejects: the filter is stale",
			len(missing), from, to, missing[0], r.counter(t, "bloom_rejects_total"))
	}
}

// A build of the Bloom filter that read the ids before a seed must not swap
// its filter in after the seed's reset has, or the products the seed added
// are turned away for good. Step by step: the late build reads the ids (10
// products) and stops; a seed makes 60 products and its reset swaps in a
// filter over them; the late build goes on, and its swap must be refused.
// On every Redis deployment: on a Cluster, the epochs and swaps of the
// filter's shards are on different masters.
func TestBloomStaleBuildRefused(t *testing.T) {
	t.Parallel()
	testenv.EachTopology(t, testBloomStaleBuildRefused)
}

func testBloomStaleBuildRefused(t *testing.T, topo testenv.Topology) {
	cases := []struct {
		name  string
		build func(context.Context, replica) error
	}{
		// Reads the filter's epoch, then the ids.
		{"rebuild of a missing filter", func(ctx context.Context, r replica) error { return r.RebuildBloom(ctx) }},
		// Takes an epoch, then reads the ids; the seed's reset takes a newer one.
		{"an earlier seed's reset", func(ctx context.Context, r replica) error {
			_, err := r.Reset(ctx)
			return err
		}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixtureOn(t, topo, 10, 1)
			ctx := context.Background()
			late := f.replica(t, cache.Settings{Bloom: true})
			seeder := f.replica(t, cache.Settings{Bloom: true})

			paused, resume := f.pauseFirstQuery()
			built := make(chan error, 1)
			go func() { built <- c.build(ctx, late) }()
			within(t, paused, "the late build's read of the ids")

			if err := stock.NewCatalog(f.db.Gorm).Seed(ctx, 60, 1); err != nil {
				t.Fatal(err)
			}
			if _, err := seeder.Reset(ctx); err != nil {
				t.Fatalf("the seed's reset: %v", err)
			}
			close(resume)
			if err := <-built; err != nil {
				t.Fatalf("the late build: %v", err)
			}
			allFound(t, seeder, 1, 60)
			allFound(t, late, 11, 60)
		})
	}
}

// Reads that fail for want of a connection of their own process's pool —
// the pool's wait ran out, or their context ran out while they waited for a
// connection — are congestion, not a Redis outage: they fall back, but the
// next read still asks Redis, and is a hit. The replica's one connection
// goes through a slow link, so that a few hundred reads queue for it for
// longer than they may wait while Redis answers one every few milliseconds.
func TestCongestionIsNotAnOutage(t *testing.T) {
	const (
		products = 300
		probe    = products + 1 // the product read after the burst
		delay    = 2 * time.Millisecond
	)
	cases := []struct {
		name         string
		poolTimeout  time.Duration
		redisTimeout time.Duration
	}{
		{"pool timeout", 10 * time.Millisecond, 10 * time.Second},
		{"context ends in the pool", time.Minute, 300 * time.Millisecond},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			f := newFixture(t, probe, 1)
			ctx := context.Background()
			set := cache.Settings{Bloom: true, RedisTimeout: c.redisTimeout}
			// Another replica, on a fast client of its own, builds the
			// filter and caches every product.
			warm := f.replica(t, patient(cache.Settings{Bloom: true}))
			if _, err := warm.Reset(ctx); err != nil {
				t.Fatal(err)
			}
			for _, err := range reads(probe, 16, func(i int) error {
				_, err := warm.Product(ctx, int64(i+1))
				return err
			}) {
				if err != nil {
					t.Fatal(err)
				}
			}

			// This replica is fresh: it learns the filter's parameters from
			// the first answers, so the first reads ask the filter twice.
			rdb := client(t, redis.Options{Addr: slowLink(t, testenv.RedisAddr(t), delay, nil), PoolSize: 1, PoolTimeout: c.poolTimeout})
			r := f.replicaOn(t, cache.Deps{Redis: rdb}, rdb, set, lock.RedisOptions{})
			errs := reads(products, products, func(i int) error {
				_, err := r.Product(ctx, int64(i+1))
				return err
			})
			var busy int
			for _, err := range errs {
				switch {
				case errors.Is(err, stock.ErrBusy):
					busy++
				case err != nil:
					t.Fatalf("GET in the burst: %v", err)
				}
			}
			fallbacks, hits := r.counter(t, "fallbacks_total"), r.counter(t, "hits_total")
			t.Logf("%d concurrent GETs on one connection: %.0f hits, %.0f fell back (%d busy), %.0f skipped Redis",
				products, hits, fallbacks, busy, r.counter(t, "skips_total"))
			if fallbacks == 0 {
				t.Fatal("no read of the burst fell back: it did not congest the pool")
			}

			if _, err := r.Product(ctx, probe); err != nil {
				t.Fatalf("GET after the burst: %v", err)
			}
			if got := r.counter(t, "hits_total") - hits; got != 1 {
				t.Errorf("the read after the burst: %.0f hits, want 1", got)
			}
			if got := r.counter(t, "fallbacks_total") - fallbacks; got != 0 {
				t.Errorf("the read after the burst fell back to MySQL: congestion was taken for an outage")
			}
			if skips := r.counter(t, "skips_total"); skips != 0 {
				t.Errorf("%.0f reads skipped Redis: congestion was taken for an outage", skips)
			}
		})
	}
}

// A read that polls for another replica's load and whose wait runs out
// while its poll waits for Redis has waited long enough: it falls back, but
// Redis is not to blame, and the next read asks it. Every command on the
// test's keys takes 200ms here: the read's attempt at the mutex ends at
// 200ms, its poll starts then, and its wait of 350ms runs out while the poll
// waits — past a RedisTimeout (300ms) without an answer, which alone would
// read as a Redis that has stopped answering.
func TestPollThatRunsOutIsNotAnOutage(t *testing.T) {
	const (
		delay = 200 * time.Millisecond
		probe = 2
	)
	f := newFixture(t, probe, 1)
	ctx := context.Background()
	set := cache.Settings{RedisTimeout: delay * 3 / 2, Wait: delay * 7 / 4}
	warm := f.replica(t, set)
	if _, err := warm.Product(ctx, probe); err != nil {
		t.Fatal(err)
	}
	// Another replica is loading product 1.
	holder := lock.NewRedis(testenv.RedisAt(t, testenv.RedisAddr(t)), lock.RedisOptions{Prefix: f.prefix + "mutex:", NoFencing: true, TTL: time.Minute})
	lease, err := holder.TryObtain(ctx, "product:1")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { lease.Release(context.Background()) })

	// Slow on the test's keys only: connecting stays quick.
	rdb := client(t, redis.Options{Addr: slowLink(t, testenv.RedisAddr(t), delay, []byte(f.prefix))})
	r := f.replicaOn(t, cache.Deps{Redis: rdb}, rdb, set, lock.RedisOptions{})
	if p, err := r.Product(ctx, 1); err != nil || p.ID != 1 {
		t.Fatalf("read of a product another replica is loading: %+v, %v; want it from the fallback", p, err)
	}
	if fallbacks := r.counter(t, "fallbacks_total"); fallbacks != 1 {
		t.Fatalf("%.0f fallbacks, want 1: the wait did not run out", fallbacks)
	}
	if _, err := r.Product(ctx, probe); err != nil {
		t.Fatalf("GET after the wait ran out: %v", err)
	}
	if hits := r.counter(t, "hits_total"); hits != 1 {
		t.Errorf("the read after the wait ran out: %.0f hits, want 1: the wait was taken for a Redis outage (%.0f skipped Redis)", hits, r.counter(t, "skips_total"))
	}
}

// slowLink forwards connections to the server at target, holding each
// chunk a client sends for delay before passing it on — each chunk that
// contains match, when match is not nil: a Redis that answers every
// command, slowly. It stops when the test ends.
func slowLink(t *testing.T, target string, delay time.Duration, match []byte) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var (
		mu    sync.Mutex
		conns []net.Conn
	)
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	go func() {
		for {
			client, err := ln.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", target)
			if err != nil {
				client.Close()
				continue
			}
			mu.Lock()
			conns = append(conns, client, server)
			mu.Unlock()
			go func() {
				io.Copy(client, server)
				client.Close()
			}()
			go func() {
				defer server.Close()
				buf := make([]byte, 64<<10)
				for {
					n, err := client.Read(buf)
					if n > 0 {
						if match == nil || bytes.Contains(buf[:n], match) {
							time.Sleep(delay)
						}
						if _, err := server.Write(buf[:n]); err != nil {
							return
						}
					}
					if err != nil {
						return
					}
				}
			}()
		}
	}()
	return ln.Addr().String()
}

// A hung Redis (SIGSTOP: connections stay open, nothing is answered) costs a
// read about RedisTimeout, with a client that honours context deadlines as
// New requires; then reads skip it, as they skip a dead one.
func TestRedisHungFallsBackWithinTimeout(t *testing.T) {
	const timeout = 300 * time.Millisecond
	f := newFixture(t, 10, 1)
	ctx := context.Background()
	srv := testenv.StartRedis(t)
	rdb := client(t, redis.Options{Addr: srv.Addr})
	r := f.replicaOn(t, cache.Deps{Redis: rdb}, rdb, cache.Settings{Bloom: true, RedisTimeout: timeout}, lock.RedisOptions{})
	if _, err := r.Reset(ctx); err != nil {
		t.Fatal(err)
	}
	for id := int64(1); id <= 10; id++ {
		if _, err := r.Product(ctx, id); err != nil {
			t.Fatal(err)
		}
	}

	srv.Pause()
	start := time.Now()
	p, err := r.Product(ctx, 1)
	took := time.Since(start)
	t.Logf("a cached product read on a hung Redis (RedisTimeout %v): answered in %v", timeout, took.Round(time.Millisecond))
	if err != nil || p.ID != 1 {
		t.Fatalf("read on a hung Redis: %+v, %v; want product 1 from the fallback", p, err)
	}
	if took > 10*timeout {
		t.Errorf("the read took %v: the RedisTimeout of %v was not enforced", took, timeout)
	}
	if fallbacks := r.counter(t, "fallbacks_total"); fallbacks != 1 {
		t.Errorf("fallbacks = %.0f, want 1", fallbacks)
	}
	// The hung Redis is an outage: the next reads do not ask it.
	for id := int64(2); id <= 4; id++ {
		if _, err := r.Product(ctx, id); err != nil {
			t.Fatalf("read %d on a hung Redis: %v", id, err)
		}
	}
	if skips := r.counter(t, "skips_total"); skips == 0 {
		t.Error("no read skipped the hung Redis")
	}
}

// A read's attempt at the load mutex waits for Redis at most RedisTimeout
// too: a Redis that hangs while a read takes the mutex costs the read about
// RedisTimeout, not its whole wait and load budget.
func TestHungMutexFallsBackWithinTimeout(t *testing.T) {
	const timeout = 300 * time.Millisecond
	f := newFixture(t, 10, 1)
	ctx := context.Background()
	// The mutexes on a Redis of their own, so that it can hang after the
	// read found nothing cached.
	mutexSrv := testenv.StartRedis(t)
	rdb := client(t, redis.Options{Addr: testenv.RedisAddr(t)})
	r := f.replicaOn(t, cache.Deps{Redis: rdb}, client(t, redis.Options{Addr: mutexSrv.Addr}),
		cache.Settings{RedisTimeout: timeout, Wait: 5 * time.Second, LoadTimeout: 5 * time.Second}, lock.RedisOptions{})

	mutexSrv.Pause()
	start := time.Now()
	p, err := r.Product(ctx, 3)
	took := time.Since(start)
	mutexSrv.Resume() // lets the abandoned attempt end, and Close with it
	t.Logf("a miss whose mutex hangs (RedisTimeout %v, wait and load 5s each): answered in %v", timeout, took.Round(time.Millisecond))
	if err != nil || p.ID != 3 {
		t.Fatalf("read with a hung mutex: %+v, %v; want product 3 from the fallback", p, err)
	}
	if took > 10*timeout {
		t.Errorf("the read took %v: the mutex was waited for past the RedisTimeout of %v", took, timeout)
	}
}

// The cache carries a product's sale window. An entry written by an older
// replica during a rolling upgrade has none: it is read as a miss and
// loaded again, never as "no window" for a product that has one; and a
// changed window shows once the entry is invalidated.
func TestSaleWindowCached(t *testing.T) {
	t.Parallel()
	f := newFixture(t, 1, 1)
	ctx := context.Background()
	r := f.replica(t, cache.Settings{})
	starts := time.Date(2030, 1, 2, 3, 4, 5, 678901000, time.UTC)
	if err := f.db.Gorm.Exec("UPDATE products SET sale_starts_at = ? WHERE id = 1", starts).Error; err != nil {
		t.Fatal(err)
	}
	key := f.prefix + "cache:product:{1}"
	old := fmt.Sprintf(`{"product":{"sku_id":1,"name":"Product 1","price_cents":137,"stock":1},"refresh_at":%d}`,
		time.Now().Add(time.Hour).UnixMilli())
	if err := f.rdb.Set(ctx, key, old, time.Hour).Err(); err != nil {
		t.Fatal(err)
	}
	p, err := r.Product(ctx, 1)
	if err != nil || p.SaleStartsAt == nil || !p.SaleStartsAt.Equal(starts) || p.SaleEndsAt != nil {
		t.Fatalf("product under an older replica's entry: %+v, %v; want the window from MySQL (starts %s, no end)", p, err, starts)
	}
	raw, err := f.rdb.Get(ctx, key).Result()
	if err != nil || !strings.Contains(raw, `"sale_starts_at":"2030-01-02T03:04:05.678901Z"`) || !strings.Contains(raw, `"sale_ends_at":null`) {
		t.Errorf("entry after the load: %q, %v; want it rewritten with the window", raw, err)
	}
	if p, err := r.Product(ctx, 1); err != nil || p.SaleStartsAt == nil || !p.SaleStartsAt.Equal(starts) {
		t.Errorf("product from the rewritten entry: %+v, %v", p, err)
	}
	if hits, loads := r.counter(t, "hits_total"), r.counter(t, "loads_total"); hits != 1 || loads != 1 {
		t.Errorf("hits %.0f, loads %.0f; want the old entry loaded once, then a hit", hits, loads)
	}

	ends := starts.Add(time.Hour)
	if err := f.db.Gorm.Exec("UPDATE products SET sale_starts_at = NULL, sale_ends_at = ? WHERE id = 1", ends).Error; err != nil {
		t.Fatal(err)
	}
	if err := r.Announce(ctx, notify.Event{Kind: notify.Changed, SKU: 1}); err != nil {
		t.Fatal(err)
	}
	if p, err := r.Product(ctx, 1); err != nil || p.SaleStartsAt != nil || p.SaleEndsAt == nil || !p.SaleEndsAt.Equal(ends) {
		t.Errorf("after the window changed and the entry was invalidated: %+v, %v; want no start, end %s", p, err, ends)
	}
}
