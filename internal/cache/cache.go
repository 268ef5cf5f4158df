// Package cache keeps product reads off MySQL with a cache-aside copy in
// Redis, defended against the three classic failures:
//
//   - penetration (requests for ids that do not exist): a Bloom filter over
//     the existing ids turns most of them away before the cache, and the rest
//     are cached as placeholders with a short TTL;
//   - breakdown (a hot key expires under load): one load per key across the
//     whole fleet — singleflight inside a process, a Redis mutex between
//     processes — while everyone else waits for the refilled key; hot keys
//     are also renewed in the background before they expire;
//   - avalanche (many keys expiring at once): every TTL is jittered.
//
// When Redis fails, reads fall back to MySQL through a small concurrency
// limit (see Products.Product).
package cache

import (
	"context"
	_ "embed"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/semaphore"
	"golang.org/x/sync/singleflight"

	"shop/internal/keyspace"
	"shop/internal/lock"
	"shop/internal/notify"
	"shop/internal/stock"
)

var (
	//go:embed begin.lua
	beginLua string
	//go:embed fill.lua
	fillLua string
	//go:embed bloomcheck.lua
	bloomCheckLua string
	//go:embed bloomswap.lua
	bloomSwapLua string

	beginScript      = redis.NewScript(beginLua)
	fillScript       = redis.NewScript(fillLua)
	bloomCheckScript = redis.NewScript(bloomCheckLua)
	bloomSwapScript  = redis.NewScript(bloomSwapLua)
)

// Announcer queues an announcement to every replica in a pipeline;
// *notify.Restocks implements it.
type Announcer interface {
	Queue(ctx context.Context, pipe redis.Pipeliner, e notify.Event)
}

// Source is where products come from; *stock.Catalog implements it.
type Source interface {
	// Product returns the product, or an error wrapping stock.ErrNotFound.
	Product(ctx context.Context, id int64) (stock.Product, error)
	// ProductIDsWithEpoch returns the id of every product and the
	// catalog's epoch they are of, read in one snapshot.
	ProductIDsWithEpoch(ctx context.Context) ([]int64, int64, error)
	// Epoch returns the catalog's epoch, which every reset of the catalog
	// raises (see stock.Catalog.Epoch).
	Epoch(ctx context.Context) (int64, error)
}

// Mutex gives a lease on a key if nobody holds it; *lock.Redis implements
// it. Every replica must use the same Redis and prefix.
type Mutex interface {
	TryObtain(ctx context.Context, key string) (*lock.Lease, error)
}

// Deps are what Products works with. Redis, Source and Mutex are needed;
// the others may be left out.
type Deps struct {
	// Redis holds the cache. It must honour context deadlines (go-redis:
	// Options.ContextTimeoutEnabled): the cache bounds each Redis call of a
	// read with Settings.RedisTimeout through the call's context and relies
	// on nothing else; a client that ignores the deadline waits its own
	// ReadTimeout instead, and a read on a hung Redis falls back only then.
	Redis redis.Cmdable
	// Source is where products are loaded from, and where reads go when
	// Redis fails.
	Source Source
	// Mutex serialises loads of one key across replicas.
	Mutex Mutex
	// Announcer, when set, carries Announce's announcement to every
	// replica, in the pipeline of the invalidation itself, so that each
	// drops its own copy of the page (Pages). Without one, Announce only
	// invalidates.
	Announcer Announcer
	// Pages, when set, is this replica's own copy of the product pages:
	// Announce drops the product's page from it before it returns, and Hear
	// when it hears of a change.
	Pages *Pages
	// Registerer receives the cache's metrics; nil registers them nowhere.
	Registerer prometheus.Registerer
	// Logger gets what nobody waits for: failed background work. Nil
	// discards it.
	Logger *slog.Logger
}

// Settings tune Products. Zero fields take the defaults.
type Settings struct {
	// Prefix is put before every key; default "shop:cache:".
	Prefix string
	// TTL is how long a product stays cached; default 10m. Each entry's TTL
	// is drawn uniformly from TTL×(1±Jitter).
	TTL time.Duration
	// Jitter spreads TTLs, as a fraction of them; default 0.1, at most 0.5.
	// Negative means none.
	Jitter float64
	// NullTTL is how long "no such product" stays cached; default 60s,
	// jittered like TTL.
	NullTTL time.Duration
	// Bloom turns the Bloom filter on.
	Bloom bool
	// BloomFalsePositive is the share of absent ids the filter lets through;
	// default 0.001.
	BloomFalsePositive float64
	// BloomShards is how many shards the filter is split into, each under
	// a hash tag of its own, so that on a Redis Cluster its checks spread
	// over the masters (see bloomFilter); default DefaultBloomShards, at
	// most MaxBloomShards. 1 is the unsharded layout: one bitmap under one
	// tag. Every replica must use the same count: each count is a filter of
	// its own, and a reset rebuilds only its replica's.
	BloomShards int
	// BloomCopy, when above zero, has each replica check ids against its
	// own copy of the Bloom filter's shards, read again this often, rather
	// than asking Redis every time (see bloomCopy). Zero asks Redis.
	BloomCopy time.Duration
	// RefreshAhead is the final share of an entry's TTL in which a read
	// serves it and renews it in the background; default 0.2. Negative turns
	// refresh-ahead off.
	RefreshAhead float64
	// Wait bounds how long a read waits for another replica's load of the
	// same key; default 1s. Then it falls back to MySQL.
	Wait time.Duration
	// LoadTimeout bounds one load from MySQL; default 3s.
	LoadTimeout time.Duration
	// EpochTimeout bounds one question to MySQL for the catalog's epoch,
	// which a read asks at most once a second to judge the Bloom filter's
	// "no" by (see Products.trusted); default 500ms. Then the epoch known
	// before stands.
	EpochTimeout time.Duration
	// Fallback is how many reads of this process may go to MySQL at once
	// without the cache; default 4.
	Fallback int
	// FallbackWait is how long a read waits for a fallback slot; default
	// 100ms. Then it fails with stock.ErrBusy.
	FallbackWait time.Duration
	// RedisTimeout bounds each Redis call of a read; default 500ms. Then the
	// read falls back to MySQL. It is carried by the call's context: the
	// client must honour context deadlines (see Deps.Redis).
	RedisTimeout time.Duration
}

func (s *Settings) defaults() {
	if s.Prefix == "" {
		s.Prefix = "shop:cache:"
	}
	if s.TTL <= 0 {
		s.TTL = 10 * time.Minute
	}
	s.Jitter = share(s.Jitter, 0.1, 0.5)
	if s.NullTTL <= 0 {
		s.NullTTL = time.Minute
	}
	if s.BloomFalsePositive <= 0 || s.BloomFalsePositive >= 1 {
		s.BloomFalsePositive = 0.001
	}
	if s.BloomShards <= 0 {
		s.BloomShards = DefaultBloomShards
	}
	s.BloomShards = min(s.BloomShards, MaxBloomShards)
	s.RefreshAhead = share(s.RefreshAhead, 0.2, 0.9)
	if s.Wait <= 0 {
		s.Wait = time.Second
	}
	if s.LoadTimeout <= 0 {
		s.LoadTimeout = 3 * time.Second
	}
	if s.EpochTimeout <= 0 {
		s.EpochTimeout = 500 * time.Millisecond
	}
	if s.Fallback <= 0 {
		s.Fallback = 4
	}
	if s.FallbackWait <= 0 {
		s.FallbackWait = 100 * time.Millisecond
	}
	if s.RedisTimeout <= 0 {
		s.RedisTimeout = 500 * time.Millisecond
	}
}

// share reads a fractional option: zero takes def, a negative value means
// none, and most is the cap.
func share(v, def, most float64) float64 {
	switch {
	case v == 0:
		return def
	case v < 0:
		return 0
	}
	return min(v, most)
}

const (
	// DefaultBloomShards is the Bloom filter's default shard count. On a
	// Cluster each shard takes 1/16 of the checks to the master of its
	// slot: three masters (the smallest Cluster) get 4 to 6 shards each
	// (a third is 5.3; the busiest takes at most 37.5% of the checks, not
	// all), and up to 16 masters get one or more. A shard costs nothing in
	// bits (each is sized for its own ids); a reset or rebuild costs a few
	// round trips per shard.
	DefaultBloomShards = 16
	// MaxBloomShards bounds Settings.BloomShards: far more than any
	// Cluster has masters, and few enough that finding the shards' tags
	// (see shardTag) stays instant.
	MaxBloomShards = 256
	// generationTTL is how long an entry's generation outlives its last
	// load or invalidation; far longer than any load may take.
	generationTTL = time.Minute
	// skipRedisFor is how long reads go straight to the fallback after a
	// Redis call showed Redis down (see outage).
	skipRedisFor = time.Second
	// backgroundSlots bounds the refreshes one process runs at once.
	backgroundSlots = 16
)

var (
	// errRedis marks a failed Redis call; the read falls back to MySQL.
	errRedis = errors.New("cache: redis")
	// errRejected means the Bloom filter ruled the id out.
	errRejected = errors.New("cache: not in the bloom filter")
	// errSkipped means Redis failed a moment ago and was not asked.
	errSkipped = errors.New("cache: redis failed a moment ago")
	// errWaited means another replica's load did not fill the key in time.
	errWaited = errors.New("cache: waited too long for another load")
)

// Products is a read-through cache of products in Redis.
type Products struct {
	rdb       redis.Cmdable
	src       Source
	mutex     Mutex
	announcer Announcer // nil: none
	pages     *Pages    // nil: none
	log       *slog.Logger
	set       Settings
	bloom     *bloomFilter
	m         *metrics

	loads      singleflight.Group
	fallback   *semaphore.Weighted
	skipRedis  atomic.Int64 // Unix ns until which reads do not ask Redis; 0: ask
	answered   atomic.Int64 // Unix ns of the last reply Redis gave a read of this process
	background *semaphore.Weighted
	underway   sync.Map // name → struct{}: background work running here
	running    sync.WaitGroup
	epoch      catalogEpoch
}

// New returns a cache of d.Source's products in d.Redis, tuned by s.
func New(d Deps, s Settings) *Products {
	s.defaults()
	log := d.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	p := &Products{
		rdb:        d.Redis,
		src:        d.Source,
		mutex:      d.Mutex,
		announcer:  d.Announcer,
		pages:      d.Pages,
		log:        log,
		set:        s,
		bloom:      newBloomFilter(d.Redis, s.Prefix, s.BloomFalsePositive, s.BloomShards),
		m:          newMetrics(d.Registerer),
		fallback:   semaphore.NewWeighted(int64(s.Fallback)),
		background: semaphore.NewWeighted(backgroundSlots),
	}
	p.epoch.known.Store(-1)
	return p
}

// entry is what the cache holds for an id, as JSON.
type entry struct {
	// Product is nil in a placeholder: there is no such product.
	Product *product `json:"product"`
	// RefreshAt is when, in Unix milliseconds, reads start renewing the
	// entry ahead of its expiry; zero for never.
	RefreshAt int64 `json:"refresh_at,omitempty"`
	// Format is entryFormat in what this code writes (see decode).
	Format int `json:"format,omitempty"`
}

// entryFormat is the format of the entries this code writes: 2 carries the
// sale window, 3 the price's currency; the entries of older replicas, which
// lack them, have a lower one or none.
const entryFormat = 3

type product struct {
	ID           int64      `json:"sku_id"`
	Name         string     `json:"name"`
	PriceCents   int64      `json:"price_cents"`
	Currency     string     `json:"currency"`
	Stock        int        `json:"stock"`
	SaleStartsAt *time.Time `json:"sale_starts_at"`
	SaleEndsAt   *time.Time `json:"sale_ends_at"`
}

func (e entry) due(now time.Time) bool { return e.RefreshAt > 0 && now.UnixMilli() >= e.RefreshAt }

// Product returns the product with id, from the cache when it holds it.
// Its stock may lag behind MySQL's until the entry is invalidated.
//
// When Redis fails, the read goes to MySQL, but at most Settings.Fallback
// such reads of this process run at once and the rest fail with
// stock.ErrBusy after Settings.FallbackWait. Failing fast alone would turn a Redis outage
// into a full outage of product pages; falling back without a limit would
// hand all of the cache's traffic to MySQL at once, the stampede the cache is
// there to prevent. The same limit applies when a read has waited
// Settings.Wait for another replica's load. After a Redis call that shows
// Redis down, reads skip Redis for a second (then try it again), so that an
// outage costs each read the fallback's wait rather than a Redis timeout too;
// a call that failed for want of a connection of this process's pool does
// not (see outage).
//
// Errors: stock.ErrInvalid, stock.ErrNotFound, stock.ErrBusy.
func (p *Products) Product(ctx context.Context, id int64) (stock.Product, error) {
	if id <= 0 {
		return stock.Product{}, fmt.Errorf("%w: id must be a positive integer", stock.ErrInvalid)
	}
	if until := p.skipRedis.Load(); until != 0 && time.Now().UnixNano() < until {
		p.m.skips.Inc()
		return p.fallBack(ctx, id, errSkipped)
	}
	e, ok, err := p.read(ctx, id)
	switch {
	case errors.Is(err, errRejected):
		p.m.bloomRejects.Inc()
		return stock.Product{}, notFound(id)
	case err != nil:
		return p.fallBack(ctx, id, err)
	case ok:
		return p.serve(id, e)
	}
	p.m.misses.Inc()
	ch := p.loads.DoChan(p.entryKey(id), func() (any, error) {
		// The load outlives the caller who started it: the others sharing
		// it still want the answer. What it logs carries that caller's
		// request id only, though it loads for all of them.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.set.Wait+p.set.LoadTimeout)
		defer cancel()
		return p.fill(ctx, id)
	})
	select {
	case <-ctx.Done():
		return stock.Product{}, fmt.Errorf("%w: waiting for product %d: %w", stock.ErrBusy, id, context.Cause(ctx))
	case res := <-ch:
		switch {
		case errors.Is(res.Err, errRedis), errors.Is(res.Err, errWaited):
			return p.fallBack(ctx, id, res.Err)
		case res.Err != nil:
			return stock.Product{}, res.Err
		}
		return answer(id, res.Val.(entry))
	}
}

// read returns id's entry; ok is false when there is none. With the Bloom
// filter on, it asks the filter first and returns errRejected for an id the
// filter rules out. The question and the read of the entry travel in one
// pipeline, one round trip: the filter's answer decides, and neither writes
// anything. With no filter in Redis, every id passes and one is built; so
// too with a filter built from another catalog than MySQL's (see trusted).
func (p *Products) read(ctx context.Context, id int64) (e entry, ok bool, err error) {
	if !p.set.Bloom {
		return p.get(ctx, id)
	}
	if maybe, ok := p.fromCopy(ctx, id); ok {
		if !maybe {
			return entry{}, false, errRejected
		}
		return p.get(ctx, id)
	}
	redisCtx, cancel := p.redisCtx(ctx)
	defer cancel()
	pipe := p.rdb.Pipeline()
	check := p.bloom.check(redisCtx, pipe, id)
	get := pipe.Get(redisCtx, p.entryKey(id))
	_, _ = pipe.Exec(redisCtx) // each command keeps its own error
	if replied(get) {
		p.heard() // even if the filter must be asked again below
	}
	v, err := p.bloom.answer(redisCtx, check, id)
	if err := p.judge(ctx, v, err); err != nil {
		return entry{}, false, err
	}
	return entryFrom(get)
}

// judge reads the Bloom filter's verdict v on an id, asked with error err:
// errRejected when the filter rules the id out and can be trusted to,
// Redis's error when it failed, nil when the id may be a product or the
// filter cannot tell. A missing filter, or one built from an older
// catalog, is rebuilt in the background.
func (p *Products) judge(ctx context.Context, v bloomVerdict, err error) error {
	switch {
	case errors.Is(err, errNoFilter):
		p.goBackground("bloom", p.rebuildBloom)
	case err != nil:
		return err
	case v.maybe:
	case p.trusted(ctx, v.catalog):
		return errRejected
	default:
		p.m.bloomStale.Inc()
		p.goBackground("bloom", p.rebuildBloom)
	}
	return nil
}

// RuleOut answers for a read that goes to MySQL without the cache (the
// authoritative stock): stock.ErrNotFound when the Bloom filter rules id
// out, so that an id that is no product costs one Redis round trip and no
// MySQL read; nil when id may be a product, and also when the filter
// cannot tell (off, missing, of an older catalog, Redis failing or being
// skipped), when the caller must ask MySQL.
func (p *Products) RuleOut(ctx context.Context, id int64) error {
	if !p.set.Bloom || id <= 0 {
		return nil
	}
	if maybe, ok := p.fromCopy(ctx, id); ok {
		if maybe {
			return nil
		}
		p.m.bloomRejects.Inc()
		return notFound(id)
	}
	if until := p.skipRedis.Load(); until != 0 && time.Now().UnixNano() < until {
		return nil
	}
	redisCtx, cancel := p.redisCtx(ctx)
	defer cancel()
	v, err := p.bloom.mayContain(redisCtx, id)
	if errors.Is(p.judge(ctx, v, err), errRejected) {
		p.m.bloomRejects.Inc()
		return notFound(id)
	}
	return nil
}

// serve answers from e, found in the cache, and starts a refresh if e is
// close to expiry.
func (p *Products) serve(id int64, e entry) (stock.Product, error) {
	if e.Product == nil {
		p.m.nullHits.Inc()
		return answer(id, e)
	}
	p.m.hits.Inc()
	if e.due(time.Now()) {
		p.goBackground(strconv.FormatInt(id, 10), func(ctx context.Context) error { return p.refresh(ctx, id) })
	}
	return answer(id, e)
}

// answer is the product e holds, or ErrNotFound for a placeholder.
func answer(id int64, e entry) (stock.Product, error) {
	if e.Product == nil {
		return stock.Product{}, notFound(id)
	}
	return stock.Product{ID: e.Product.ID, Name: e.Product.Name, PriceCents: e.Product.PriceCents,
		Currency: e.Product.Currency, Stock: e.Product.Stock,
		SaleStartsAt: e.Product.SaleStartsAt, SaleEndsAt: e.Product.SaleEndsAt}, nil
}

// fill gets id's entry into the cache. One replica at a time loads a key:
// the one holding its mutex. The others poll the key, with backoff, until it
// is filled or the mutex is free again, for at most Settings.Wait.
func (p *Products) fill(ctx context.Context, id int64) (entry, error) {
	waitCtx, cancel := context.WithTimeout(ctx, p.set.Wait)
	defer cancel()
	b := &backoff.ExponentialBackOff{
		InitialInterval:     2 * time.Millisecond,
		RandomizationFactor: 1,
		Multiplier:          2,
		MaxInterval:         50 * time.Millisecond,
	}
	b.Reset()
	for {
		lease, err := p.obtain(ctx, p.mutexKey(id))
		if err == nil {
			defer p.release(lease)
			e, _, err := p.load(lease.Context(), id)
			return e, err
		}
		if !errors.Is(err, lock.ErrNotObtained) {
			return entry{}, fmt.Errorf("%w: load %d: %w", errRedis, id, err)
		}
		select {
		case <-waitCtx.Done():
			return entry{}, errWaited
		case <-time.After(b.NextBackOff()):
		}
		e, ok, err := p.get(waitCtx, id)
		switch {
		case err != nil && waitCtx.Err() != nil:
			// The wait ran out while the poll waited, most likely for a
			// connection: this read has waited long enough, and Redis is
			// not to blame.
			return entry{}, errWaited
		case err != nil || ok:
			return e, err
		}
	}
}

// obtain takes the mutex on key, as Mutex.TryObtain does, but waits for
// Redis's answer for at most Settings.RedisTimeout. The attempt itself cannot
// carry that deadline: the lease it brings lives on its context, and the
// load under the lease takes longer. So it runs aside on ctx, and an answer
// later than RedisTimeout is given up on; a lease that answer still brings is
// released.
func (p *Products) obtain(ctx context.Context, key string) (*lock.Lease, error) {
	type obtained struct {
		lease *lock.Lease
		err   error
	}
	answer, gaveUp := make(chan obtained), make(chan struct{})
	p.running.Go(func() {
		lease, err := p.mutex.TryObtain(ctx, key)
		select {
		case answer <- obtained{lease, err}:
		case <-gaveUp:
			if lease != nil {
				p.release(lease)
			}
		}
	})
	timer := time.NewTimer(p.set.RedisTimeout)
	defer timer.Stop()
	select {
	case a := <-answer:
		if a.err == nil {
			p.heard()
		}
		return a.lease, a.err
	case <-timer.C:
		close(gaveUp)
		return nil, fmt.Errorf("mutex %s: %w", key, context.DeadlineExceeded)
	}
}

// load reads id from MySQL and caches it; the caller holds id's mutex. A
// value present and not yet due for refresh was written by whoever held the
// mutex before, and is taken as it is: loaded reports whether MySQL was read.
func (p *Products) load(ctx context.Context, id int64) (e entry, loaded bool, err error) {
	ctx, cancel := context.WithTimeout(ctx, p.set.LoadTimeout)
	defer cancel()
	keys := []string{p.entryKey(id), p.generationKey(id)}
	vals, err := p.begin(ctx, keys)
	if err != nil {
		return entry{}, false, fmt.Errorf("%w: load %d: %w", errRedis, id, err)
	}
	if s, ok := vals[0].(string); ok {
		if e, err := decode(s); err == nil && !e.due(time.Now()) {
			return e, false, nil
		}
	}
	generation, _ := vals[1].(string)

	p.m.loads.Inc()
	ttl, nx := p.jitter(p.set.TTL), ""
	switch v, err := p.src.Product(ctx, id); {
	case errors.Is(err, stock.ErrNotFound):
		ttl, nx = p.jitter(p.set.NullTTL), "NX"
	case err != nil:
		p.m.loadErrors.Inc()
		return entry{}, true, fmt.Errorf("cache: load %d: %w", id, err)
	default:
		e.Product = &product{ID: v.ID, Name: v.Name, PriceCents: v.PriceCents, Currency: v.Currency, Stock: v.Stock,
			SaleStartsAt: v.SaleStartsAt, SaleEndsAt: v.SaleEndsAt}
		e.Format = entryFormat
		if p.set.RefreshAhead > 0 {
			e.RefreshAt = time.Now().Add(ttl - time.Duration(float64(ttl)*p.set.RefreshAhead)).UnixMilli()
		}
	}
	raw, err := json.Marshal(e)
	if err != nil {
		return entry{}, true, fmt.Errorf("cache: load %d: %w", id, err)
	}
	// Not written means invalidated meanwhile, or (a placeholder) a real
	// value is there: either way this read still gets what MySQL said.
	fillCtx, cancel := p.redisCtx(ctx)
	defer cancel()
	if err := fillScript.Run(fillCtx, p.rdb, keys, generation, raw, ttl.Milliseconds(), nx).Err(); err != nil {
		p.log.WarnContext(ctx, "cache: write entry", "sku", id, "err", err)
	}
	return e, true, nil
}

// begin runs begin.lua on keys, an entry's and its generation's, and
// returns its answer: the entry (or nil) and the generation.
func (p *Products) begin(ctx context.Context, keys []string) ([]any, error) {
	ctx, cancel := p.redisCtx(ctx)
	defer cancel()
	vals, err := beginScript.Run(ctx, p.rdb, keys, generationTTL.Milliseconds()).Slice()
	if err != nil {
		return nil, err
	}
	p.heard()
	if len(vals) != 2 {
		return nil, fmt.Errorf("begin script answered %v", vals)
	}
	return vals, nil
}

// refresh renews id's entry ahead of its expiry, if no other replica is at it.
func (p *Products) refresh(ctx context.Context, id int64) error {
	lease, err := p.mutex.TryObtain(ctx, p.mutexKey(id))
	if errors.Is(err, lock.ErrNotObtained) {
		return nil
	}
	if err != nil {
		return err
	}
	defer p.release(lease)
	_, loaded, err := p.load(lease.Context(), id)
	if loaded && err == nil {
		p.m.refreshes.Inc()
	}
	return err
}

// goBackground runs fn in the background unless work under the same name is
// already running here, or too much background work is.
func (p *Products) goBackground(name string, fn func(context.Context) error) {
	if _, busy := p.underway.LoadOrStore(name, struct{}{}); busy {
		return
	}
	if !p.background.TryAcquire(1) {
		p.underway.Delete(name)
		return
	}
	p.running.Go(func() {
		defer p.background.Release(1)
		defer p.underway.Delete(name)
		ctx, cancel := context.WithTimeout(context.Background(), p.set.LoadTimeout)
		defer cancel()
		if err := fn(ctx); err != nil {
			p.log.Warn("cache: background "+name, "err", err)
		}
	})
}

// rebuildBloom builds the shards of the Bloom filter that are missing, or
// were built from another catalog epoch than MySQL's current one, from the
// source, once across replicas; the other shards stay as they are. It reads
// the shards' epochs before the ids, so that its swap of a shard is refused
// if a reset (which reads the ids later) has run meanwhile.
func (p *Products) rebuildBloom(ctx context.Context) error {
	lease, err := p.mutex.TryObtain(ctx, "bloom")
	if errors.Is(err, lock.ErrNotObtained) {
		return nil
	}
	if err != nil {
		return err
	}
	defer p.release(lease)
	ctx = lease.Context()
	epochs, err := p.bloom.currentEpochs(ctx)
	if err != nil {
		return err
	}
	current, err := p.src.Epoch(ctx)
	if err != nil {
		return err
	}
	outdated, err := p.bloom.outdated(ctx, current)
	if err != nil || len(outdated) == 0 {
		return err // none outdated: built meanwhile
	}
	ids, catalog, err := p.src.ProductIDsWithEpoch(ctx)
	if err != nil {
		return err
	}
	p.log.Info("cache: rebuilding the bloom filter", "products", len(ids), "catalog_epoch", catalog,
		"shards", len(outdated), "of", len(p.bloom.shards))
	swapped, err := p.bloom.build(ctx, ids, catalog, epochs, outdated)
	if dropped := len(outdated) - swapped; err == nil && dropped > 0 {
		p.log.Info("cache: bloom filter rebuild dropped: a reset built newer shards", "shards", dropped)
	}
	return err
}

// fallBack reads id from MySQL without the cache, within the fallback limit.
// cause is why the cache could not answer; if it shows Redis down, reads
// skip Redis for a while.
func (p *Products) fallBack(ctx context.Context, id int64, cause error) (stock.Product, error) {
	if ctx.Err() == nil && p.outage(cause) {
		p.skipRedis.Store(time.Now().Add(skipRedisFor).UnixNano())
	}
	wait, cancel := context.WithTimeout(ctx, p.set.FallbackWait)
	defer cancel()
	if err := p.fallback.Acquire(wait, 1); err != nil {
		p.m.fallbacks.WithLabelValues("rejected").Inc()
		return stock.Product{}, fmt.Errorf("%w: product cache unavailable and MySQL fallback full: %w", stock.ErrBusy, cause)
	}
	defer p.fallback.Release(1)
	p.m.fallbacks.WithLabelValues("served").Inc()
	return p.src.Product(ctx, id)
}

// outage reports whether cause, why a read could not use the cache, shows
// Redis itself unreachable or failing — so that the next reads had better
// not ask it — rather than this process short of connections to it, which
// skipping Redis would only make worse: every read would go to the small
// MySQL fallback.
//
// What go-redis v9 returns decides the rule (measured with a client that
// honours context deadlines and keeps its default retries, as the service's):
//
//   - a wait for a pool connection that outlasts the pool's PoolTimeout:
//     redis.ErrPoolTimeout. Congestion, never an outage.
//   - a call whose context runs out returns context.DeadlineExceeded —
//     while it waits for a pool connection, but just as well on a hung
//     Redis (SIGSTOP) or a dead one (killed: the retries' redials are
//     refused until the context ends). A socket timeout ("read/write tcp …:
//     i/o timeout") comes from a hung Redis, and also from a congested pool
//     when a command gets its connection too late to be answered in time.
//     The value cannot tell, so a timeout counts as an outage only if Redis
//     has answered no read of this process for RedisTimeout — since the
//     failed call began. Congestion keeps the pool's connections answering
//     (a pool whose every connection some slow command held that long would
//     pass for an outage, though).
//   - anything else — connection refused or reset, EOF (what the pooled
//     connections of a killed Redis give), a Redis error reply such as
//     LOADING — shows Redis down or failing: an outage.
//
// A poll for another replica's load whose wait runs out is errWaited, and a
// read whose caller has gone is not counted at all (see fallBack).
func (p *Products) outage(cause error) bool {
	switch {
	case !errors.Is(cause, errRedis):
		return false
	case errors.Is(cause, redis.ErrPoolTimeout), errors.Is(cause, redis.ErrPoolExhausted):
		return false
	case timedOut(cause):
		return time.Since(time.Unix(0, p.answered.Load())) >= p.set.RedisTimeout
	}
	return true
}

// timedOut reports whether err is a context's end or a socket timeout.
func timedOut(err error) bool {
	var netErr net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) ||
		errors.As(err, &netErr) && netErr.Timeout()
}

// replied reports whether Redis answered cmd with a value or nil.
func replied(cmd redis.Cmder) bool {
	err := cmd.Err()
	return err == nil || errors.Is(err, redis.Nil)
}

// heard records that Redis has just answered a read of this process.
func (p *Products) heard() {
	now := time.Now().UnixNano()
	// Written at most once a millisecond: every read passes here.
	if now-p.answered.Load() > int64(time.Millisecond) {
		p.answered.Store(now)
	}
}

// Announce makes a change of a product known: to the cache in Redis, to
// every replica, and to this replica's copy of the pages. Call it after the
// change has committed.
//
// For an event about one product (e.SKU > 0), of any kind, it bumps the
// product's generation, drops its entry and queues the announcement of e
// (with an Announcer) after them, in one pipeline: one round trip, or one to
// each master of a Cluster at once (see invalidate). Then it drops this
// replica's copy of the product's page (Pages), even when the pipeline
// failed (the change has committed all the same), so that this replica
// answers from the change on, before the announcement reaches it.
//
// It deletes rather than writes the new product: a written value could land
// after a newer one (two writers' SETs are not ordered by the SKU lock once
// it is released) and would need the whole product, while a delete is the
// same whoever does it last. The bump of the generation keeps a load that
// read MySQL before the change from writing its older copy back afterwards.
// The next read loads the product once, as any miss does.
//
// For e.SKU == notify.All (a seed; only a Raised may be about every
// product), it only publishes e. Dropping every entry is Reset's, which the
// seed runs; this replica's pages and copies of the Bloom filter go when it
// hears its own announcement (Hear), as every replica's do.
//
// A Raised with a fence is published as notify.Restocks.Raise publishes it:
// with its fence, then as the bare SKU, which replicas from before fences
// read (they ignore the fenced form).
//
// Errors: stock.ErrInvalid for an event no replica would read (a negative
// SKU, or any other kind than a Raised about every product), and Redis's.
func (p *Products) Announce(ctx context.Context, e notify.Event) error {
	switch {
	case e.SKU < 0 || e.SKU == notify.All && e.Kind != notify.Raised:
		return fmt.Errorf("%w: cache: announce: no replica reads kind %d of product %d", stock.ErrInvalid, e.Kind, e.SKU)
	case e.SKU == notify.All:
		if p.announcer == nil {
			return nil
		}
		pipe := p.rdb.Pipeline()
		p.queue(ctx, pipe, e)
		if _, err := pipe.Exec(ctx); err != nil {
			return fmt.Errorf("cache: announce a change of every product: %w", err)
		}
		return nil
	}
	_, err := p.invalidate(ctx, []int64{e.SKU}, e)
	if p.pages != nil {
		p.pages.Forget(e.SKU)
	}
	if err != nil {
		return fmt.Errorf("cache: invalidate %d: %w", e.SKU, err)
	}
	return nil
}

// Hear is the cache's part of an announcement heard from any replica, this
// one included (see notify.Restocks.Listen). Every kind changes the
// product's page: this replica's copy of it is dropped (of every page, for
// notify.All). A Raised of notify.All — a seed, or a subscription (re)made,
// which may have missed one — drops this replica's copies of the Bloom
// filter too, which the seed's reset has rebuilt: the next checks read it
// again.
func (p *Products) Hear(e notify.Event) {
	if e.Kind == notify.Raised && e.SKU == notify.All {
		p.forgetBloomCopies()
	}
	if p.pages != nil {
		p.pages.Forget(e.SKU)
	}
}

// Invalidate is Announce of a Changed of product id: a change of the
// product committed (admin.Admin's change of a product).
func (p *Products) Invalidate(ctx context.Context, id int64) error {
	return p.Announce(ctx, notify.Event{Kind: notify.Changed, SKU: id})
}

// queue adds the announcement of e to pipe, when there is an Announcer. A
// Raised with a fence goes out as notify.Restocks.Raise sends it: with its
// fence, then as the bare SKU, for the replicas that know only that.
func (p *Products) queue(ctx context.Context, pipe redis.Pipeliner, e notify.Event) {
	if p.announcer == nil {
		return
	}
	p.announcer.Queue(ctx, pipe, e)
	if e.Kind == notify.Raised && e.Fence > 0 {
		p.announcer.Queue(ctx, pipe, notify.Event{Kind: notify.Raised, SKU: e.SKU})
	}
}

// invalidate drops the entries of ids and bumps their generations (see
// Announce) in one pipeline, with the announcements (see Deps.Announcer)
// after the deletes: on a Redis Cluster go-redis splits it by master, one
// round trip to each at once. It returns how many of the ids had an entry.
//
// An id's generation is bumped before its entry is dropped, on the one
// connection to its master, so the two need no script: a load that read
// MySQL before the change and writes after the bump is refused (fill.lua),
// and one that wrote before the bump is dropped with the entry.
func (p *Products) invalidate(ctx context.Context, ids []int64, announce ...notify.Event) (int, error) {
	pipe := p.rdb.Pipeline()
	dels := make([]*redis.IntCmd, len(ids))
	for i, id := range ids {
		pipe.Incr(ctx, p.generationKey(id))
		pipe.PExpire(ctx, p.generationKey(id), generationTTL)
		dels[i] = pipe.Del(ctx, p.entryKey(id))
	}
	// After the deletes: a replica told of the change reads the entry after
	// it is gone.
	for _, e := range announce {
		p.queue(ctx, pipe, e)
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return 0, err
	}
	dropped := 0
	for _, del := range dels {
		dropped += int(del.Val())
	}
	return dropped, nil
}

// resetBatch is how many entries a reset drops in one pipeline.
const resetBatch = 1000

// dropAll invalidates every cached entry, on every master of a Redis
// Cluster (a SCAN of one node sees only its own), as it scans them:
// resetBatch ids per pipeline. An id whose generation alone is there is
// invalidated too: a load of it is under way, and what it read may be older
// than the reset. It returns how many entries it dropped.
func (p *Products) dropAll(ctx context.Context) (int, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	seen := map[int64]bool{} // an entry and its generation are two keys
	batch := make([]int64, 0, resetBatch)
	dropped := 0
	var failed error
	flush := func() {
		n, err := p.invalidate(ctx, batch)
		dropped += n
		batch = batch[:0]
		if err != nil {
			failed = err
			cancel(err) // the scans stop
		}
	}
	// Scan calls its function from one master at a time.
	err := keyspace.Scan(ctx, p.rdb, p.set.Prefix+"product:*", func(key string) {
		id, ok := p.idOf(key)
		if !ok || seen[id] || failed != nil {
			return
		}
		seen[id] = true
		if batch = append(batch, id); len(batch) == resetBatch {
			flush()
		}
	})
	if err == nil && failed == nil && len(batch) > 0 {
		flush()
	}
	if failed != nil {
		return dropped, failed
	}
	return dropped, err
}

// Reset follows a reset of the catalog: it rebuilds the Bloom filter from
// the source's ids, recording the catalog epoch they are of, and invalidates
// every cached entry, a pipeline of them at a time (see dropAll). It
// returns how many entries it dropped.
//
// It takes a new epoch of every shard of the filter before it reads the
// ids. If another reset takes a newer one of a shard before this one swaps
// its own in, this one's swap of that shard is refused, and not an error:
// the other read the ids later, so its shard covers this reset's change too
// (and if the other fails, its caller is told). A shard that cannot be
// swapped in (its master fails) fails the reset, after the other shards
// have been swapped in.
func (p *Products) Reset(ctx context.Context) (int, error) {
	epochs, err := p.bloom.newEpochs(ctx)
	if err != nil {
		return 0, err
	}
	ids, catalog, err := p.src.ProductIDsWithEpoch(ctx)
	if err != nil {
		return 0, err
	}
	shards := p.bloom.all()
	swapped, err := p.bloom.build(ctx, ids, catalog, epochs, shards)
	if err != nil {
		return 0, err
	}
	if dropped := len(shards) - swapped; dropped > 0 {
		p.log.InfoContext(ctx, "cache: bloom filter shards of this reset dropped: a later reset built newer ones", "shards", dropped)
	}
	p.forgetBloomCopies()
	dropped, err := p.dropAll(ctx)
	if err != nil {
		return 0, fmt.Errorf("cache: reset: %w", err)
	}
	return dropped, nil
}

// Close waits for background work to end: refreshes, a rebuild of the Bloom
// filter, and attempts at a mutex that a read stopped waiting for.
func (p *Products) Close() { p.running.Wait() }

// get reads id's entry, without asking the Bloom filter.
func (p *Products) get(ctx context.Context, id int64) (e entry, ok bool, err error) {
	ctx, cancel := p.redisCtx(ctx)
	defer cancel()
	get := p.rdb.Get(ctx, p.entryKey(id))
	if replied(get) {
		p.heard()
	}
	return entryFrom(get)
}

// redisCtx bounds one Redis call of a read.
func (p *Products) redisCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, p.set.RedisTimeout)
}

// entryFrom decodes the reply of a GET of an entry; ok is false when there
// is none (or it is garbled, which a load then overwrites).
func entryFrom(get *redis.StringCmd) (e entry, ok bool, err error) {
	s, err := get.Result()
	switch {
	case errors.Is(err, redis.Nil):
		return entry{}, false, nil
	case err != nil:
		return entry{}, false, fmt.Errorf("%w: get %s: %w", errRedis, get.Args()[1], err)
	}
	e, err = decode(s)
	return e, err == nil, nil
}

func (p *Products) release(lease *lock.Lease) {
	ctx, cancel := context.WithTimeout(context.Background(), p.set.RedisTimeout)
	defer cancel()
	if err := lease.Release(ctx); err != nil {
		p.log.Warn("cache: release mutex", "key", lease.Key(), "err", err)
	}
}

// jitter draws a TTL uniformly from d×(1±Jitter).
func (p *Products) jitter(d time.Duration) time.Duration {
	return time.Duration(float64(d) * (1 + p.set.Jitter*(2*rand.Float64()-1)))
}

// Keys: an entry and its generation share a hash slot.
func (p *Products) entryKey(id int64) string {
	return p.set.Prefix + "product:{" + strconv.FormatInt(id, 10) + "}"
}
func (p *Products) generationKey(id int64) string { return p.entryKey(id) + ":gen" }
func (p *Products) mutexKey(id int64) string      { return "product:" + strconv.FormatInt(id, 10) }

// idOf returns the id of an entry or generation key.
func (p *Products) idOf(key string) (int64, bool) {
	rest, ok := strings.CutPrefix(key, p.set.Prefix+"product:{")
	if !ok {
		return 0, false
	}
	digits, _, ok := strings.Cut(rest, "}")
	id, err := strconv.ParseInt(digits, 10, 64)
	return id, ok && err == nil
}

// errOldFormat is an entry an older replica wrote, during a rolling upgrade.
var errOldFormat = errors.New("cache: entry of an older format")

// decode reads an entry. A product written by an older replica (an older
// format: it has no sale window, or no currency) is refused like a garbled entry, so it counts as a
// miss and the load overwrites it: read as it is, it would show "no window"
// for a product that has one, and let nobody see the window until the entry
// expired. Placeholders carry no product, so every format's are good.
func decode(s string) (entry, error) {
	var e entry
	if err := json.Unmarshal([]byte(s), &e); err != nil {
		return entry{}, err
	}
	if e.Product != nil && e.Format < entryFormat {
		return entry{}, errOldFormat
	}
	return e, nil
}

func notFound(id int64) error { return fmt.Errorf("%w: product %d", stock.ErrNotFound, id) }
