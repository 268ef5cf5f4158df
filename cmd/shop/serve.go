package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/gin-gonic/gin"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"gorm.io/gorm"

	"shop/internal/admin"
	"shop/internal/auth"
	"shop/internal/cache"
	"shop/internal/depmetrics"
	"shop/internal/failpoint"
	"shop/internal/handler"
	"shop/internal/mysqldb"
	"shop/internal/notify"
	"shop/internal/outbox"
	"shop/internal/ratelimit"
	"shop/internal/requestid"
	"shop/internal/stock"
)

// Each replica's MySQL connections, split by who may take them, so that
// no flood of public requests can take a connection the order path or
// readiness needs. A replica holds at most 24+4+6+2+2 = 38 here (and the
// readiness check its own one), the refunds' two only with Stripe and the
// events' two only with SHOP_EVENTS_URL: three replicas and one more
// surging during a rolling restart stay within MySQL's default
// max_connections of 151, with room for an operator's shop verify, but
// for Stripe and events together, which need it raised (docs/scaling.md).
const (
	// ordersPoolSize is the budget of order transactions (and payments,
	// cancellations and the sweep, which take the same slots), so that a
	// lock holder never waits for a connection a reader holds.
	ordersPoolSize = 24
	// orderReadsPoolSize is for the order path's reads outside its
	// transactions: a SKU's stock before its turn, a replay's look-up, the
	// user limit's counters, the sweep's search; and the lifecycle's
	// look-ups, at most lookupsWidth of them at once.
	orderReadsPoolSize = 4
	// lookupsWidth bounds the lifecycle's look-ups (stock.Deps.Lookups):
	// the order a cancellation or a checkout is for, and a buyer's own
	// order read with a bearer token. They have a gate of their own, so
	// that anonymous reads filling the public one never refuse a buyer
	// cancelling or paying near pay_by; it leaves the order path the rest
	// of the reads pool.
	lookupsWidth = 2
	// publicPoolSize is for reads made for public requests — a product
	// page the cache misses, the authoritative stock, an order read
	// without a bearer token — under a gate of the same width: the
	// seventh at once is refused 503 after stock.DefaultGateWait, rather
	// than queued. The admin API's seeds and reports use it too, ungated.
	publicPoolSize = 6
	// refundPoolSize is the refunder's (SHOP_PAYMENTS=stripe): its claims
	// and records are short transactions of their own, the calls to
	// Stripe made between them, outside any.
	refundPoolSize = 2
	// eventsPoolSize is the events relay's (SHOP_EVENTS_URL): its claims
	// and marks are single statements, each POST made between them,
	// outside any transaction.
	eventsPoolSize = 2
	// redisPoolSize bounds the Redis connections of a replica.
	redisPoolSize = 64
	// redisTimeout bounds every Redis command; a command whose context has
	// an earlier deadline ends then.
	redisTimeout = time.Second
)

// serve is `shop serve`: a replica built from the configuration (build),
// behind its listeners until ctx ends (listen.go).
func serve(ctx context.Context, args []string, getenv func(string) string, stderr io.Writer) error {
	if err := parseFlags(newFlags("serve"), args); err != nil {
		return err
	}
	cfg, err := loadConfig(getenv)
	if err != nil {
		return err
	}
	if err := cfg.servable(); err != nil {
		return err
	}
	// Every line logged for a request, with its context, carries the
	// request's id (requestid.LogHandler).
	log := slog.New(requestid.LogHandler(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: cfg.Stop.LogLevel})))
	r, err := build(ctx, cfg, log)
	if err != nil {
		return err
	}
	defer r.close()
	return listen(ctx, cfg, r, log)
}

// app is a replica's parts, built from its configuration: the API's
// handlers, the drain that takes it out of service, and what stops its
// background work and closes its clients.
type app struct {
	handlers handler.Handlers
	drain    *drainer
	closers  []func()
}

// onClose adds f to what close runs, before everything added earlier.
func (a *app) onClose(f func()) { a.closers = append(a.closers, f) }

// close stops and closes the replica's parts, the last built first.
func (a *app) close() {
	for i := len(a.closers) - 1; i >= 0; i-- {
		a.closers[i]()
	}
}

// build builds a replica from cfg: its pools, clients, lock, cache, order
// service and API. An error closes what was built.
func build(ctx context.Context, cfg config, log *slog.Logger) (_ *app, err error) {
	r := &app{drain: newDrainer()}
	defer func() {
		if err != nil {
			r.close()
		}
	}()
	var buyers handler.Authenticator // nil: SHOP_AUTH=none
	if cfg.Buyers.Auth == "jwt" {
		v, err := auth.New(cfg.Buyers.JWT)
		if err != nil {
			return nil, configError{fmt.Errorf("SHOP_AUTH=jwt: %w", err)}
		}
		buyers = v
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	depErrors := depmetrics.New(reg)
	pools, err := openPools(r, cfg.MySQL, depErrors)
	if err != nil {
		return nil, err
	}
	rdb := newRedis(cfg.Redis)
	r.onClose(func() { rdb.Close() })
	rdb.AddHook(depErrors.RedisHook())

	// Fault injection exists only in a -tags failpoints build; here, in a
	// default one, every hook is nil (internal/failpoint).
	hooks := failpoint.New()
	locker, closeLocker, err := newLocker(cfg, hooks.After, depErrors.RedisHook(), log)
	if err != nil {
		return nil, err
	}
	r.onClose(closeLocker)
	warnLock(cfg.Lock, log)
	registerLockStats(reg, locker.Stats)

	catalog := stock.NewCatalog(pools.public)
	public := catalog.Public(publicPoolSize, stock.DefaultGateWait)
	restocks := notify.New(rdb, cfg.Redis.Prefix)
	var pages *cache.Pages
	if cfg.Cache.LocalTTL > 0 {
		if pages, err = cache.NewPages(cfg.Cache.LocalTTL, pageLoadTimeout, reg); err != nil {
			return nil, fmt.Errorf("serve: %w", err)
		}
	}
	products, closeProducts := newCache(cfg, rdb, public, reg, log, depErrors.RedisHook(), restocks, pages)
	r.onClose(closeProducts)

	stripe, err := newStripe(cfg.Payments)
	if err != nil {
		return nil, err
	}
	orders := newOrders(ctx, cfg, pools, public, locker, products, stripe.checkouts(), hooks, reg, log)
	// Every replica hears what every replica announces, itself included.
	_, stopHearing := restocks.Listen(func(e notify.Event) {
		orders.Hear(e)
		products.Hear(e)
	})
	r.onClose(func() { stopHearing() })
	// Every replica sweeps lapsed reservations; the SKU lock and MySQL's
	// conditional updates make one sweep of each unit count.
	sweepCtx, stopSweeping := context.WithCancel(context.WithoutCancel(ctx))
	swept := make(chan struct{})
	go func() { defer close(swept); orders.RunSweeper(sweepCtx, cfg.Orders.SweepInterval) }()
	r.onClose(func() { stopSweeping(); <-swept })
	// In stripe mode every replica pays refunds back; the leases keep them
	// off each other's.
	r.onClose(stripe.runRefunder(ctx, cfg.Payments, pools, locker, hooks, reg, log))
	// With SHOP_EVENTS_URL every replica relays the outbox's events; the
	// leases keep them off each other's.
	r.onClose(runRelay(ctx, cfg.Events, outbox.NewStore(pools.events), hooks, reg, log))

	ready, stopProbes, err := newReadiness(ctx, cfg, rdb, reg, log)
	if err != nil {
		return nil, err
	}
	r.onClose(stopProbes)

	adm := &admin.Admin{Catalog: catalog, Changer: orders, Cache: products, Restocks: restocks, Currency: cfg.Payments.Currency, Logger: log}
	gin.SetMode(gin.ReleaseMode)
	r.handlers = handler.New(handler.Deps{
		Logger:    log,
		Registry:  reg,
		Orders:    orders,
		Lifecycle: orders,
		Replays:   public,
		Auth:      buyers,
		Products:  products,
		Pages:     handlerPages(pages),
		Stock:     public,
		Filter:    products,
		Seeder:    adm,
		Admin:     adm,
		Refunds:   catalog,
		Events:    outbox.NewStore(pools.public),
		Verifier:  cfg.Payments.Verifier,
		Payments:  orders,
		Checkouts: stripe.checkoutRoute(orders),
		Limiter:   ratelimit.New(rdb, cfg.Redis.Prefix+"limit:"),
		Ready:     ready,
		Stopping:  r.drain.Draining,
	}, handler.Settings{
		AdminToken:     cfg.Listen.AdminToken,
		TrustedProxies: cfg.Buyers.TrustedProxies,
		Limits: handler.Limits{
			User:      ratelimit.PerSecond(cfg.Buyers.RateUser, cfg.Buyers.RateUserBurst),
			Client:    ratelimit.PerSecond(cfg.Buyers.RateIP, 0),
			AdminAuth: handler.AdminAuthLimit(),
		},
	})
	return r, nil
}

// pools are a replica's MySQL pools (see the pool sizes above).
type pools struct {
	public, reads, orders, refunds, events *gorm.DB
}

// openPools opens a replica's MySQL pools on c's DSN, closed with r, their
// errors counted by depErrors. The orders' pools have their own timeouts
// (mysqldb.OpenOrders); the others' reads and writes time out after c's
// IOTimeout.
func openPools(r *app, c mysqlConfig, depErrors *depmetrics.Errors) (pools, error) {
	var p pools
	var err error
	for _, pool := range []struct {
		db     **gorm.DB
		size   int
		orders bool
	}{{&p.public, publicPoolSize, false}, {&p.reads, orderReadsPoolSize, false}, {&p.orders, ordersPoolSize, true},
		{&p.refunds, refundPoolSize, true}, {&p.events, eventsPoolSize, false}} {
		if pool.orders {
			*pool.db, err = mysqldb.OpenOrders(c.DSN, pool.size)
		} else {
			*pool.db, err = mysqldb.Open(c.DSN, pool.size, mysqldb.IOTimeout(c.IOTimeout))
		}
		if err != nil {
			return pools{}, err
		}
		if sqlDB, err := (*pool.db).DB(); err == nil {
			r.onClose(func() { sqlDB.Close() })
		}
	}
	if err := errors.Join(depErrors.WatchGorm(p.public), depErrors.WatchGorm(p.reads), depErrors.WatchGorm(p.orders),
		depErrors.WatchGorm(p.refunds), depErrors.WatchGorm(p.events)); err != nil {
		return pools{}, fmt.Errorf("serve: %w", err)
	}
	return p, nil
}

// newOrders is the replica's order service on its pools, under locker,
// announcing through products, with hooks (a failpoints build's).
func newOrders(ctx context.Context, cfg config, p pools, public *stock.Catalog, locker orderLock, products *cache.Products,
	checkouts stock.Checkouts, hooks failpoint.Hooks, reg prometheus.Registerer, log *slog.Logger) *stock.Service {
	update := stock.Guarded
	if cfg.Orders.StockUpdate == "naive" {
		update = stock.Naive
	}
	lanes := 1
	if cfg.Lock.Mode == "none" {
		// The lock-free baseline places a SKU's orders side by side.
		lanes = ordersPoolSize
	}
	// MariaDB returns a batch's orders with the INSERT; elsewhere, or when
	// MySQL does not answer at start, they are read back after it.
	versionCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	returning, err := mysqldb.Returning(versionCtx, p.orders)
	cancel()
	if err != nil {
		log.Warn("orders are read back after their INSERT", "err", err)
	}
	transitions := registerTransitions(reg)
	orders := stock.NewService(stock.Deps{
		DB: p.orders, Reads: p.reads, Public: public, Lookups: stock.NewCatalog(p.reads).Lookups(lookupsWidth, stock.DefaultLookupWait),
		Locks: locker, Announcer: products, Checkouts: checkouts, Logger: log,
		Transitions: transitions,
	}, stock.Settings{
		Update: update, Fencing: cfg.Lock.Fencing, Batch: cfg.Orders.Batch, Group: cfg.Orders.Group, Lanes: lanes, UserLimit: cfg.Orders.UserLimit,
		PayWindow: cfg.Orders.PayWindow, Returning: returning, Concurrency: ordersPoolSize,
	}, stock.Hooks{BeforeWrite: hooks.BeforeWrite, BeforeReturn: hooks.BeforeReturn})
	registerOrderStats(reg, orders.Stats)
	registerSweepStats(reg, orders.OldestLapsed)
	return orders
}
