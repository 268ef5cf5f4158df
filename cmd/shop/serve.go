package main

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/go-sql-driver/mysql"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"

	"shop/internal/auth"
	"shop/internal/cache"
	"shop/internal/depmetrics"
	"shop/internal/failpoint"
	"shop/internal/handler"
	"shop/internal/lock"
	"shop/internal/mysqldb"
	"shop/internal/notify"
	"shop/internal/ratelimit"
	"shop/internal/readiness"
	"shop/internal/requestid"
	"shop/internal/stock"
)

// Each replica's MySQL connections, split by who may take them, so that
// no flood of public requests can take a connection the order path or
// readiness needs. A replica holds at most 24+4+6 = 34 here (and the
// readiness check its own one): three replicas and one more surging
// during a rolling restart stay within MySQL's default max_connections of
// 151, with room for an operator's shop verify (docs/scaling.md).
const (
	// ordersPoolSize is the budget of order transactions (and payments,
	// cancellations and the sweep, which take the same slots), so that a
	// lock holder never waits for a connection a reader holds.
	ordersPoolSize = 24
	// orderReadsPoolSize is for the order path's reads outside its
	// transactions: a SKU's stock before its turn, a replay's look-up, the
	// user limit's counters, the sweep's search.
	orderReadsPoolSize = 4
	// publicPoolSize is for reads made for public requests — a product
	// page the cache misses, the authoritative stock, a buyer's order —
	// under a gate of the same width: the seventh at once is refused 503
	// after stock.DefaultGateWait, rather than queued. The admin API's
	// seeds and reports use it too, ungated.
	publicPoolSize = 6
	// redisPoolSize bounds the Redis connections of a replica.
	redisPoolSize = 64
	// redisTimeout bounds every Redis command; a command whose context has
	// an earlier deadline ends then.
	redisTimeout = time.Second
	// shutdownTimeout is how long in-flight requests get to finish once the
	// drain is over.
	shutdownTimeout = 30 * time.Second
	// writeTimeout bounds a request from the end of its headers to the end
	// of its response: above handler.OrderBudget, so that an order is never
	// cut off by the server itself.
	writeTimeout = 30 * time.Second
)

func serve(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	if err := parseFlags(newFlags("serve"), args); err != nil {
		return err
	}
	cfg, err := loadConfig(getenv)
	if err != nil {
		return err
	}
	var buyers handler.Authenticator // nil: SHOP_AUTH=none
	if cfg.Auth == "jwt" {
		v, err := auth.New(cfg.JWT)
		if err != nil {
			return configError{fmt.Errorf("SHOP_AUTH=jwt: %w", err)}
		}
		buyers = v
	}

	// Every line logged for a request, with its context, carries the
	// request's id (requestid.LogHandler).
	log := slog.New(requestid.LogHandler(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: cfg.LogLevel})))

	reg := prometheus.NewRegistry()
	depErrors := depmetrics.New(reg)
	db, err := mysqldb.Open(cfg.MySQLDSN, publicPoolSize)
	if err != nil {
		return err
	}
	if sqlDB, err := db.DB(); err == nil {
		defer sqlDB.Close()
	}
	readsDB, err := mysqldb.Open(cfg.MySQLDSN, orderReadsPoolSize)
	if err != nil {
		return err
	}
	if sqlDB, err := readsDB.DB(); err == nil {
		defer sqlDB.Close()
	}
	ordersDB, err := mysqldb.OpenOrders(cfg.MySQLDSN, ordersPoolSize)
	if err != nil {
		return err
	}
	if sqlDB, err := ordersDB.DB(); err == nil {
		defer sqlDB.Close()
	}
	if err := errors.Join(depErrors.WatchGorm(db), depErrors.WatchGorm(readsDB), depErrors.WatchGorm(ordersDB)); err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	rdb := newRedis(cfg)
	defer rdb.Close()
	rdb.AddHook(depErrors.RedisHook())

	// Fault injection exists only in a -tags failpoints build; here, in a
	// default one, every hook is nil (internal/failpoint).
	hooks := failpoint.New()
	locker, closeLocker, err := newLocker(cfg, hooks.After, depErrors.RedisHook(), log)
	if err != nil {
		return err
	}
	defer closeLocker()
	update := stock.Guarded
	if cfg.StockUpdate == "naive" {
		update = stock.Naive
	}
	if n := len(cfg.RedlockAddrs); cfg.LockMode == "redlock" && n < 3 {
		log.Warn("SHOP_REDLOCK_ADDRS has fewer than three masters: a majority of them survives no failure", "masters", n)
	}
	if cfg.Fencing && !fencedMode(cfg.LockMode) {
		log.Warn("SHOP_FENCING=on has no effect: this lock mode gives no fencing tokens", "lock_mode", cfg.LockMode)
	}
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	if l, ok := locker.(interface{ Stats() lock.Stats }); ok {
		registerLockStats(reg, l.Stats)
	}
	catalog := stock.NewCatalog(db)
	public := catalog.Public(publicPoolSize, stock.DefaultGateWait)
	// MariaDB returns a batch's orders with the INSERT; elsewhere, or when
	// MySQL does not answer at start, they are read back after it.
	versionCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	returning, err := mysqldb.Returning(versionCtx, ordersDB)
	cancel()
	if err != nil {
		log.Warn("orders are read back after their INSERT", "err", err)
	}
	restocks := notify.New(rdb, cfg.RedisPrefix)
	var pages *cache.Pages
	if cfg.CacheLocalTTL > 0 {
		if pages, err = cache.NewPages(cfg.CacheLocalTTL, pageLoadTimeout, reg); err != nil {
			return fmt.Errorf("serve: %w", err)
		}
	}
	products, closeProducts := newCache(cfg, rdb, public, reg, log, depErrors.RedisHook(), restocks, pages)
	defer closeProducts()
	lanes := 1
	if cfg.LockMode == "none" {
		// The lock-free baseline places a SKU's orders side by side.
		lanes = ordersPoolSize
	}
	transitions := registerTransitions(reg)
	orders := stock.NewService(stock.Deps{
		DB: ordersDB, Reads: readsDB, Public: public, Locks: locker, Cache: products, Logger: log,
		Returned:    announceReturn(restocks, log),
		Transitions: func(status string, n int) { transitions.WithLabelValues(status).Add(float64(n)) },
	}, stock.Settings{
		Update: update, Fencing: cfg.Fencing, Batch: cfg.OrderBatch, Lanes: lanes, UserLimit: cfg.UserLimit,
		PayWindow: cfg.PayWindow, Returning: returning, Concurrency: ordersPoolSize,
	}, stock.Hooks{BeforeWrite: hooks.BeforeWrite, BeforeReturn: hooks.BeforeReturn})
	registerOrderStats(reg, orders.Stats)
	_, stopRestocks := restocks.Listen(func(e notify.Event) {
		switch e.Kind {
		case notify.Raised:
			orders.Raised(e.SKU, e.Fence)
		case notify.SoldOut:
			orders.SoldOutElsewhere(e.SKU, e.Fence)
		}
		products.Hear(e)
	})
	defer stopRestocks()
	// Every replica sweeps lapsed reservations; the SKU lock and MySQL's
	// conditional updates make one sweep of each unit count.
	sweepCtx, stopSweeping := context.WithCancel(context.WithoutCancel(ctx))
	swept := make(chan struct{})
	go func() { defer close(swept); orders.RunSweeper(sweepCtx, cfg.SweepInterval) }()
	defer func() { stopSweeping(); <-swept }()

	ready, stopProbes, err := newReadiness(ctx, cfg, rdb, reg, log)
	if err != nil {
		return err
	}
	defer stopProbes()

	gin.SetMode(gin.ReleaseMode)
	drain := newDrainer()
	h := handler.New(handler.Deps{
		Logger:    log,
		Orders:    orders,
		Lifecycle: orders,
		Products:  products,
		Pages:     handlerPages(pages),
		Stock:     public,
		Filter:    products,
		Replays:   public,
		Seeder:    newSeeder(catalog, products, restocks, log),
		Admin:     newProductAdmin(orders, products, restocks, log),
		Refunds:   catalog,
		Auth:      buyers,
		Limiter:   ratelimit.New(rdb, cfg.RedisPrefix+"limit:"),
		Ready:     ready,
		Stopping:  drain.Draining,
		Registry:  reg,
	}, handler.Settings{
		AdminToken:     cfg.AdminToken,
		TrustedProxies: cfg.TrustedProxies,
		Limits: handler.Limits{
			User:      ratelimit.PerSecond(cfg.RateUser, cfg.RateUserBurst),
			Client:    ratelimit.PerSecond(cfg.RateIP, 0),
			AdminAuth: handler.AdminAuthLimit(),
		},
	})

	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	srv := &http.Server{
		Handler:           drain.handler(h.Public),
		ConnState:         drain.track,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      writeTimeout,
		IdleTimeout:       2 * time.Minute,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	adminSrv, adminAddr, err := serveAdmin(cfg.AdminAddr, h.Admin, log)
	if err != nil {
		ln.Close()
		return err
	}
	defer adminSrv.Close()
	log.Info("admin listener", "addr", adminAddr)
	log.Info("listening", "addr", ln.Addr().String(), "drain", cfg.Drain.String(), "redis", cfg.redisTopology(), "lock_mode", cfg.LockMode, "lock_ttl", cfg.LockTTL.String(),
		"lock_wait", cfg.LockWait.String(), "stock_update", cfg.StockUpdate, "fencing", cfg.Fencing, "order_batch", cfg.OrderBatch,
		"cache_ttl", cfg.CacheTTL.String(), "cache_jitter", cfg.CacheJitter, "null_ttl", cfg.NullTTL.String(), "bloom", cfg.Bloom,
		"user_limit", cfg.UserLimit, "pay_window", cfg.PayWindow.String(), "sweep_interval", cfg.SweepInterval.String(), "auth", cfg.Auth,
		"rate_user", cfg.RateUser, "rate_user_burst", cfg.RateUserBurst, "rate_ip", cfg.RateIP, "trusted_proxies", cfg.TrustedProxies,
		"ready_grace", cfg.ReadyGrace.String())

	if cfg.DebugAddr != "" {
		dbg, addr, err := serveDebug(cfg.DebugAddr)
		if err != nil {
			return err
		}
		defer dbg.Close()
		log.Info("debug listener", "addr", addr)
	}

	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return fmt.Errorf("serve: %w", err)
	case <-ctx.Done():
	}

	// First the drain: no new connections, /readyz answers 503 and
	// connections close after their next response (see drainer). Then
	// Shutdown closes the connections left idle and waits for in-flight
	// requests; their contexts are not cancelled, so orders under way
	// commit or roll back and are answered. main turns a second signal
	// into an immediate exit.
	log.Info("stopping: a second signal exits at once")
	drain.drain(log, ln, cfg.Drain)
	log.Info("shutting down: closing idle connections, waiting for in-flight requests", "timeout", shutdownTimeout.String())
	sctx, cancel := context.WithTimeout(context.Background(), shutdownTimeout)
	defer cancel()
	// The drain closed the listener already; Shutdown may find it closed.
	if err := srv.Shutdown(sctx); err != nil && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("serve: shutdown: %w", err)
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) && !errors.Is(err, net.ErrClosed) {
		return fmt.Errorf("serve: %w", err)
	}
	log.Info("stopped")
	return nil
}

// redisReady is the readiness check of the replica's Redis. On a Redis
// Cluster every master must answer a PING: a PING through the ClusterClient
// reaches one node, and a replica whose orders for a dead master's slots
// all fail is not ready. Which masters there are is the Cluster's own
// view (go-redis reloads it), so a master replaced by its promoted replica
// counts as the replica. A Sentinel-managed master is what the
// FailoverClient's PING reaches; one server answers for itself.
func redisReady(rdb redis.UniversalClient) readiness.Check {
	cluster, ok := rdb.(*redis.ClusterClient)
	if !ok {
		return func(ctx context.Context) error { return rdb.Ping(ctx).Err() }
	}
	return func(ctx context.Context) error {
		return cluster.ForEachMaster(ctx, func(ctx context.Context, node *redis.Client) error {
			if err := node.Ping(ctx).Err(); err != nil {
				return fmt.Errorf("redis master %s: %w", node.Options().Addr, err)
			}
			return nil
		})
	}
}

// redisLog sends go-redis's own messages (failed dials, mostly) to the JSON
// log.
type redisLog struct{ log *slog.Logger }

func (l redisLog) Printf(ctx context.Context, format string, v ...any) {
	l.log.WarnContext(ctx, fmt.Sprintf(format, v...), "component", "go-redis")
}

// newRedis is a replica's client of its Redis: one server, a Redis Cluster
// or a Sentinel-managed master, as cfg says (see config.RedisAddrs).
func newRedis(cfg config) redis.UniversalClient { return newRedisClient(cfg, redisOptions(cfg)) }

// clusterStateReload bounds how old a client's view of a Redis Cluster's
// slots may be when it sends a command: an older view is asked for again,
// in the background, while the command goes by the one it has. go-redis
// asks again at once only when a node answers MOVED (or READONLY), and
// otherwise every minute; a master that died answers nothing, so without
// this the clients kept sending its slots' commands to it, refused, for up
// to a minute after its replica had taken over — every order of those SKUs
// a 503, and the lock's subscription, if it lived there, gone as long.
const clusterStateReload = time.Second

// newRedisClient is the client of o, for cfg's Redis; on a Redis Cluster it
// asks for the slots again whenever its view is older than
// clusterStateReload.
func newRedisClient(cfg config, o *redis.UniversalOptions) redis.UniversalClient {
	if cfg.redisTopology() != "cluster" {
		return redis.NewUniversalClient(o)
	}
	co := o.Cluster()
	co.ClusterStateReloadInterval = clusterStateReload
	return redis.NewClusterClient(co)
}

// redisOptions are a replica's settings for a client of its Redis. A
// command ends at its context's deadline when that comes before the
// timeouts: the product cache gives each read 500ms, a lock renewal the time
// left on its lease.
func redisOptions(cfg config) *redis.UniversalOptions {
	return &redis.UniversalOptions{
		Addrs:                 cfg.RedisAddrs,
		MasterName:            cfg.RedisMasterName,
		PoolSize:              redisPoolSize,
		DialTimeout:           redisTimeout,
		ReadTimeout:           redisTimeout,
		WriteTimeout:          redisTimeout,
		ContextTimeoutEnabled: true,
	}
}

// newLockRedis is a lock's own client of the Redis (the order lock's, the
// product cache's load mutexes'), for a lock whose leases last ttl. It does
// not retry: the lock retries a release itself and must see a lost reply as
// an error, where a retry by the client would find the key gone and report
// a lock it did release as not held, and a retry of an obtain would find the
// key held by its own token and leave it held for a whole TTL.
// Each command times out after ttl/3 (at most redisTimeout), so that a
// renewal that gets no answer leaves time for a second one in the lease.
func newLockRedis(cfg config, ttl time.Duration) redis.UniversalClient {
	return newRedisClient(cfg, lockRedisOptions(cfg, ttl))
}

// lockRedisOptions are newLockRedis's settings. On a Redis Cluster
// MaxRetries is not enough: the ClusterClient retries a command whose
// reply was lost by itself, up to MaxRedirects times, so that is turned off
// too (-1 means none). It then follows no MOVED or ASK either: those come
// back to the lock as answers that the command did not run, the client
// reloads the slots meanwhile, and a waiter tries again (see lock's
// failingOver).
func lockRedisOptions(cfg config, ttl time.Duration) *redis.UniversalOptions {
	o := redisOptions(cfg)
	o.MaxRetries = -1
	o.MaxRedirects = -1
	o.ReadTimeout = min(redisTimeout, ttl/3)
	o.WriteTimeout = o.ReadTimeout
	return o
}

// newLocker returns the order path's lock and what closes it, its clients
// included. The Redis locks wake their waiters on release. after, when not
// nil, is the timer their lease watchdogs sleep on (a failpoint's); hook,
// when not nil, is added to each of their clients (the dependency errors'
// count).
func newLocker(cfg config, after func(time.Duration) <-chan time.Time, hook redis.Hook, log *slog.Logger) (stock.Locker, func(), error) {
	opt := lock.RedisOptions{Prefix: cfg.RedisPrefix + "lock:", TTL: cfg.LockTTL, Wait: cfg.LockWait, After: after}
	switch cfg.LockMode {
	case "local":
		return lock.NewLocal(cfg.LockWait), func() {}, nil
	case "none":
		return lock.None{}, func() {}, nil
	case "mysql":
		return newMySQLLocker(cfg, after)
	case "etcd":
		return newEtcdLocker(cfg)
	case "zookeeper":
		return newZooKeeperLocker(cfg, log)
	case "redlock":
		nodes := make([]redis.Scripter, len(cfg.RedlockAddrs))
		clients := make([]redis.UniversalClient, len(cfg.RedlockAddrs))
		for i, addr := range cfg.RedlockAddrs {
			clients[i] = withHook(newRedlockNode(addr), hook)
			nodes[i] = clients[i]
		}
		opt.Subscriber = clients[0]
		l, err := lock.NewRedlock(nodes, opt)
		if err != nil {
			return nil, nil, fmt.Errorf("serve: %w", err)
		}
		return l, func() {
			l.Close()
			for _, c := range clients {
				c.Close()
			}
		}, nil
	}
	rdb := withHook(newLockRedis(cfg, cfg.LockTTL), hook)
	opt.Subscriber = rdb
	l := lock.NewRedis(rdb, opt)
	return l, func() {
		l.Close()
		rdb.Close()
	}, nil
}

// withHook adds hook, when not nil, to c and returns c.
func withHook(c redis.UniversalClient, hook redis.Hook) redis.UniversalClient {
	if hook != nil {
		c.AddHook(hook)
	}
	return c
}

// registerLockStats exports what the order lock's waiters do.
func registerLockStats(reg prometheus.Registerer, stats func() lock.Stats) {
	reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "shop_lock_attempts_total",
			Help: "Tries to take an order lock in Redis.",
		}, func() float64 { return float64(stats().Attempts) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "shop_lock_wakeups_total",
			Help: "Retries of a waiter woken by an announced release rather than by its backoff.",
		}, func() float64 { return float64(stats().Wakeups) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "shop_lock_waiting",
			Help: "Orders waiting for their SKU lock now.",
		}, func() float64 { return float64(stats().Waiting) }),
	)
}

// newRedlockNode is a client of one Redlock master. It does not retry (the
// other masters answer instead) and lets the lock's per-node timeout, carried
// by the context, bound each command.
func newRedlockNode(addr string) redis.UniversalClient {
	o := redisOptions(config{RedisAddrs: []string{addr}})
	o.MaxRetries = -1
	o.DialerRetries = 1
	return redis.NewUniversalClient(o)
}

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

// newCache returns the product cache. With announcer, every invalidation
// is announced to the replicas, and pages, when not nil, is this
// replica's own copy of the pages, which it drops from too. Tools that
// only seed pass neither.
func newCache(cfg config, rdb redis.UniversalClient, catalog *stock.Catalog, reg prometheus.Registerer, log *slog.Logger, hook redis.Hook,
	announcer cache.Announcer, pages *cache.Pages) (*cache.Products, func()) {
	mutexRdb := withHook(newLockRedis(cfg, cacheMutexTTL), hook)
	mutex := lock.NewRedis(mutexRdb, lock.RedisOptions{Prefix: cfg.RedisPrefix + "cache:mutex:", TTL: cacheMutexTTL, NoFencing: true})
	jitter := cfg.CacheJitter
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
		Prefix:    cfg.RedisPrefix + "cache:",
		TTL:       cfg.CacheTTL,
		Jitter:    jitter,
		NullTTL:   cfg.NullTTL,
		Bloom:     cfg.Bloom,
		BloomCopy: bloomCopyEvery,
	})
	return products, func() {
		products.Close()
		mutexRdb.Close()
	}
}

// catalogSeeder resets the catalog in MySQL; *stock.Catalog is one.
type catalogSeeder interface {
	SeedWindow(ctx context.Context, n, units int, sale stock.Window) error
}

// seedFollowUpTimeout bounds what follows a committed seed: the restock
// announcement and the cache reset, which rebuilds the Bloom filter from
// every product id. It stays well below nginx's proxy_read_timeout (25s), so
// that a committed seed is answered, with its warnings, rather than with
// nginx's 504, which invites a retry that would delete the orders since.
const seedFollowUpTimeout = 15 * time.Second

// seeded is what a committed seed did beyond the catalog.
type seeded struct {
	// dropped is how many cached products were dropped.
	dropped int
	// warnings are what did not follow the seed.
	warnings []seedWarning
}

// seedWarning is a step after a committed seed that failed: msg says what
// it means to the user, err why it failed (for the log, not the client).
type seedWarning struct {
	msg string
	err error
}

// messages returns the warnings' messages.
func (s seeded) messages() []string {
	var msgs []string
	for _, w := range s.warnings {
		msgs = append(msgs, w.msg)
	}
	return msgs
}

// seedCatalog resets the catalog, then the product cache and its Bloom
// filter, and tells every replica to forget what it found sold out.
//
// An error means the catalog was not reset. Once it was, the seed stands:
// what fails after it is a warning, logged at error level, and not an
// error, because retrying a seed deletes the orders placed since. What
// follows the commit runs on a context of its own, so a caller that gives up
// then does not leave the old Bloom filter (which refuses the new products)
// and the old cached pages in place.
func seedCatalog(ctx context.Context, catalog catalogSeeder, products *cache.Products, restocks *notify.Restocks, log *slog.Logger, n, units int, sale stock.Window) (seeded, error) {
	if err := catalog.SeedWindow(ctx, n, units, sale); err != nil {
		return seeded{}, busyIfUnreachable(err)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), seedFollowUpTimeout)
	defer cancel()
	var s seeded
	warn := func(msg string, err error) {
		log.ErrorContext(ctx, "seed: the catalog was reset, but "+msg, "err", err)
		s.warnings = append(s.warnings, seedWarning{msg, err})
	}
	// Announced first: a replica refusing from memory is a wrong answer,
	// a stale cached product only a stale page.
	if err := restocks.Announce(ctx, notify.All); err != nil {
		warn(fmt.Sprintf("the replicas were not told of the new stock: a replica may refuse a product it found sold out before the seed for up to %s", stock.DefaultSoldOutTTL), err)
	}
	dropped, err := products.Reset(ctx)
	if err != nil {
		warn("the product cache was not reset: product pages may show old stock until their cache entries expire (SHOP_CACHE_TTL), "+
			"and ids read as absent before the seed may answer 404 until theirs do (SHOP_CACHE_NULL_TTL); "+
			"the replicas rebuild the Bloom filter for the new catalog within seconds", err)
	}
	s.dropped = dropped
	if err == nil {
		// Now that the filter of the new catalog is built: every replica
		// drops its copy of the old one (see cache.Products.Hear).
		if err := restocks.Announce(ctx, notify.All); err != nil {
			log.WarnContext(ctx, "seed: the replicas were not told the Bloom filter was rebuilt: each reads it again once its copy is found of an older catalog (within a second)", "err", err)
		}
	}
	log.InfoContext(ctx, "seed: catalog reset", "products", n, "stock", units, "cache_entries_dropped", dropped, "warnings", len(s.warnings))
	return s, nil
}

// newSeeder is the admin API's seed: seedCatalog, its warnings in words for
// the client.
func newSeeder(catalog catalogSeeder, products *cache.Products, restocks *notify.Restocks, log *slog.Logger) handler.Seeder {
	return handler.SeedFunc(func(ctx context.Context, n, units int, sale stock.Window) ([]string, error) {
		s, err := seedCatalog(ctx, catalog, products, restocks, log, n, units, sale)
		return s.messages(), err
	})
}

// productChanger changes a product in MySQL; *stock.Service is one.
type productChanger interface {
	ChangeProduct(ctx context.Context, sku int64, c stock.Change) (stock.Product, error)
}

// productInvalidator drops a cached product; *cache.Products is one.
type productInvalidator interface {
	Invalidate(ctx context.Context, sku int64) error
}

// changeFollowUpTimeout bounds what follows a committed change of a
// product: the restock announcement and the cache invalidation.
const changeFollowUpTimeout = 5 * time.Second

// changeProduct changes a product (see stock.Service.ChangeProduct), which
// has forgotten on this replica that the product was sold out if it was
// restocked; then it tells every other replica of a restock and drops the
// cached product, so that its page shows the change at once.
//
// An error means nothing changed, but for an unknown outcome (below). Once
// the change committed it stands, as a seed does (see seedCatalog): what
// fails after it is a warning, logged at error level — a retry would add the
// units a second time — and what follows runs on a context of its own (see
// followChange).
//
// A change whose outcome is unknown (stock.ErrChangeOutcomeUnknown) is
// followed up as one that committed, since it may have: an announcement and
// a dropped cache entry are harmless if nothing changed, where leaving them
// out would keep the new units, if they are there, from the other replicas
// and the product page. Its error is returned all the same, and what fails
// in the follow-up is only logged.
func changeProduct(ctx context.Context, changer productChanger, products productInvalidator, restocks *notify.Restocks, log *slog.Logger,
	sku int64, c stock.Change) (stock.Product, []string, error) {
	p, err := changer.ChangeProduct(ctx, sku, c)
	switch {
	case errors.Is(err, stock.ErrOutcomeUnknown):
		followChange(ctx, products, restocks, log, sku, c, "may have been changed")
		return stock.Product{}, nil, err
	case err != nil:
		return stock.Product{}, nil, err
	}
	return p, followChange(ctx, products, restocks, log, sku, c, "was changed"), nil
}

// followChange is what follows a change c of product sku that changed, or
// may have: the restock announced, the cached product dropped. It runs on a
// context of its own, whether the client stays or not. What fails is logged
// at error level, changed saying whether the product was changed or may
// have been, and returned as warnings in words for the client.
func followChange(ctx context.Context, products productInvalidator, restocks *notify.Restocks, log *slog.Logger,
	sku int64, c stock.Change, changed string) []string {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), changeFollowUpTimeout)
	defer cancel()
	var warnings []string
	warn := func(msg string, err error) {
		log.ErrorContext(ctx, "change product: the product "+changed+", but "+msg, "sku", sku, "err", err)
		warnings = append(warnings, msg)
	}
	if c.AddStock != nil {
		if err := restocks.Announce(ctx, sku); err != nil {
			warn(fmt.Sprintf("the other replicas were not told of the new stock: one that found the product sold out may refuse it for up to %s", stock.DefaultSoldOutTTL), err)
		}
	}
	if err := products.Invalidate(ctx, sku); err != nil {
		warn("the product cache was not updated: the product page may show the old stock and sale window until its cache entry expires (SHOP_CACHE_TTL)", err)
	}
	return warnings
}

// newProductAdmin is the admin API's change of a product: changeProduct.
func newProductAdmin(changer productChanger, products productInvalidator, restocks *notify.Restocks, log *slog.Logger) handler.ProductAdmin {
	return handler.ChangeProductFunc(func(ctx context.Context, sku int64, c stock.Change) (stock.Product, []string, error) {
		return changeProduct(ctx, changer, products, restocks, log, sku, c)
	})
}

// busyIfUnreachable marks a seed that failed because MySQL could not be
// reached (down, or the connection lost) as stock.ErrBusy, a 503 to retry
// rather than a 500. Nothing was written: the seed is one transaction.
func busyIfUnreachable(err error) error {
	var netErr net.Error
	switch {
	case errors.Is(err, stock.ErrBusy), errors.Is(err, stock.ErrInvalid):
		return err
	case errors.As(err, &netErr), errors.Is(err, driver.ErrBadConn), errors.Is(err, mysql.ErrInvalidConn):
		return fmt.Errorf("%w: seed: %w", stock.ErrBusy, err)
	}
	return err
}

// registerOrderStats exports how orders are grouped into transactions.
func registerOrderStats(reg prometheus.Registerer, stats func() stock.Stats) {
	reg.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "shop_order_transactions_total",
			Help: "Order transactions run; each places one batch of a SKU's orders.",
		}, func() float64 { return float64(stats().Batches) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{
			Name: "shop_order_transaction_orders_total",
			Help: "Orders decided in those transactions (sold, refused or replayed); divided by the transactions, the mean batch.",
		}, func() float64 { return float64(stats().Orders) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "shop_orders_queued",
			Help: "Orders waiting to be taken into a batch of their SKU.",
		}, func() float64 { return float64(stats().Queued) }),
	)
}

// serveDebug serves net/http/pprof on addr, apart from the public API, and
// returns the server and the address it listens on: addr's port 0 becomes
// the port the system chose.
func serveDebug(addr string) (*http.Server, string, error) {
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, "", fmt.Errorf("serve: debug listener: %w", err)
	}
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(ln)
	return srv, ln.Addr().String(), nil
}

// serveAdmin serves the operators' API on addr, apart from the public
// listener, and returns the server and the address it listens on: addr's
// port 0 becomes the port the system chose, which the caller logs, so that
// several replicas on one host never collide. It is closed, not drained,
// when the replica stops: nothing on it is a buyer's.
func serveAdmin(addr string, h http.Handler, log *slog.Logger) (*http.Server, string, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, "", fmt.Errorf("serve: admin listener: %w", err)
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		// A seed rebuilds the Bloom filter before it answers
		// (seedFollowUpTimeout).
		WriteTimeout: time.Minute,
		IdleTimeout:  2 * time.Minute,
		ErrorLog:     slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	go srv.Serve(ln)
	return srv, ln.Addr().String(), nil
}

// The order locks that give fencing tokens can also repair their counter
// when MySQL shows it fell behind a row's fence.
var (
	_ stock.FenceRaiser = (*lock.Redis)(nil)
	_ stock.FenceRaiser = (*lock.Redlock)(nil)
)

// registerTransitions registers the counter of orders by the status they
// reached, and of refunds owed, exported at 0 from the start.
func registerTransitions(reg prometheus.Registerer) *prometheus.CounterVec {
	c := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "shop_order_status_total",
		Help: "Orders as they reach a status: reserved or paid when placed, paid by a payment, cancelled, expired (their units back in the sale); refund_owed counts payments that came too late and are owed back.",
	}, []string{"status"})
	reg.MustRegister(c)
	for _, s := range []string{stock.StatusReserved, stock.StatusPaid, stock.StatusCancelled, stock.StatusExpired, "refund_owed"} {
		c.WithLabelValues(s)
	}
	return c
}

// announceReturn tells every replica that units of a SKU went back to the
// sale, so that none refuses it from its sold-out memory. A failure is
// logged: the memory lapses on its own (stock.DefaultSoldOutTTL).
func announceReturn(restocks *notify.Restocks, log *slog.Logger) func(ctx context.Context, sku, fence int64) {
	return func(ctx context.Context, sku, fence int64) {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
		defer cancel()
		if err := restocks.Raise(ctx, sku, fence); err != nil {
			log.WarnContext(ctx, "announce units returned to the sale", "sku", sku, "err", err)
		}
	}
}
