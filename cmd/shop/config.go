package main

import (
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/go-sql-driver/mysql"

	"shop/internal/auth"
	"shop/internal/payments"
	"shop/internal/stock"
)

// config is the service's configuration, read from the environment by
// subject, as docs/configuration.md lists it.
type config struct {
	Listen   listenConfig
	MySQL    mysqlConfig
	Redis    redisConfig
	Lock     lockConfig
	Orders   ordersConfig
	Cache    cacheConfig
	Buyers   buyersConfig
	Payments paymentsConfig
	Events   eventsConfig
	Stop     stopConfig
}

// listenConfig is where a replica listens.
type listenConfig struct {
	// HTTP and Debug are listeners' [host]:port: an empty host is every
	// interface (not allowed for Debug, loopback only), port 0 a free port,
	// logged as bound. Debug is empty for none.
	HTTP  string
	Debug string
	// Admin is the operators' listener: the admin API and /metrics, which
	// the public listener does not serve. AdminToken is the admin API's
	// bearer token; empty turns the admin API off.
	Admin      string
	AdminToken string
}

// mysqlConfig is the database.
type mysqlConfig struct {
	DSN string
	// IOTimeout bounds every read and write on the connections of a
	// replica's pools other than the orders' (SHOP_MYSQL_IO_TIMEOUT),
	// unless the DSN sets its readTimeout and writeTimeout: the public
	// pool's reads and admin changes, the order reads, the events relay,
	// the mysql lock's table and the readiness probe.
	IOTimeout time.Duration
}

// redisConfig is the Redis of the cache, the rate limits, the
// announcements and the Redis locks.
type redisConfig struct {
	// Addrs is one Redis server, or the seed nodes of a Redis Cluster, or —
	// with MasterName — the Sentinels that watch the master of that name:
	// go-redis's UniversalOptions.Addrs. Like lockConfig's lists, each is
	// host:port with a port from 1 to 65535, without a scheme, and none is
	// listed twice.
	Addrs      []string
	MasterName string
	// Prefix is put before every key (and etcd's and ZooKeeper's paths).
	Prefix string
}

// lockConfig is the order lock.
type lockConfig struct {
	Mode    string
	TTL     time.Duration
	Wait    time.Duration
	Fencing bool
	// RedlockAddrs are the independent masters of redlock mode;
	// EtcdEndpoints the members of the etcd cluster of etcd mode, and
	// ZKServers the servers of the ZooKeeper ensemble of zookeeper mode;
	// host:port each.
	RedlockAddrs  []string
	EtcdEndpoints []string
	ZKServers     []string
}

// ordersConfig is how orders are placed and their reservations kept.
type ordersConfig struct {
	StockUpdate string
	// Batch is the most orders of one SKU one lock holder places in one
	// transaction.
	Batch int
	// Group is the most SKUs' batches placed in one transaction, each under
	// its own lock; 1 is a transaction per batch.
	Group int
	// UserLimit is the most orders one user may hold over all products;
	// 0 is off.
	UserLimit int
	// PayWindow is how long a reservation waits for its payment; 0 places
	// orders paid. SweepInterval is how often each replica gives back the
	// units of lapsed reservations.
	PayWindow     time.Duration
	SweepInterval time.Duration
}

// cacheConfig is the product cache.
type cacheConfig struct {
	TTL time.Duration
	// LocalTTL is how long a replica keeps its own copy of a product page
	// (cache.Pages); 0 turns the copy off.
	LocalTTL time.Duration
	Jitter   float64
	NullTTL  time.Duration
	Bloom    bool
}

// paymentsConfig is the payment provider, whose signed events say that
// money arrived (docs/payments.md).
type paymentsConfig struct {
	// Provider is SHOP_PAYMENTS: "webhook" (Standard Webhooks) or
	// "stripe".
	Provider string
	// Verifier checks the provider's events, built from its secret; nil
	// when Missing names a secret not set, which a payment window does not
	// allow (serving).
	Verifier payments.Verifier
	Missing  []string
	// StripeKey and StripeAPIBase are Stripe's API key and address
	// (stripe mode).
	StripeKey     string
	StripeAPIBase string
	// Currency is SHOP_CURRENCY: the currency of products seeded or
	// migrated without one.
	Currency string
}

// buyersConfig is who the buyers and clients are, and how often they may
// ask.
type buyersConfig struct {
	// Auth is SHOP_AUTH: "none", the request's user_id is the buyer, or
	// "jwt", the buyer routes need a bearer token verified by JWT and the
	// buyer is its subject. JWT is the verifier's settings with Auth "jwt":
	// SHOP_JWT_SECRET, or the keys of the file SHOP_JWT_PUBLIC_KEYS names,
	// and SHOP_JWT_ISSUER, SHOP_JWT_AUDIENCE, SHOP_JWT_MAX_TTL.
	Auth string
	JWT  auth.Options
	// RateUser is how many orders a second one user may send, in bursts of
	// RateUserBurst, over every replica; RateIP how many requests a second
	// one client address may send. 0 is no limit.
	RateUser      int
	RateUserBurst int
	RateIP        int
	// TrustedProxies are the proxies (addresses or CIDR ranges) whose
	// X-Forwarded-For names the client: SHOP_TRUSTED_PROXIES, "none" for
	// none.
	TrustedProxies []string
}

// stopConfig is how a replica tells it is ready, and stops, and what it
// logs.
type stopConfig struct {
	// Drain is how long a stopping replica, which accepts no new
	// connection, keeps serving those it has, every response closing its
	// connection, before Shutdown.
	Drain time.Duration
	// ReadyGrace is how long MySQL or Redis, once it has answered, may go
	// without answering before /readyz fails (see package readiness).
	ReadyGrace time.Duration
	LogLevel   slog.Level
}

const (
	// maxOrderBatch bounds SHOP_ORDER_BATCH: a batch is one INSERT of that
	// many rows and one IN list of that many users.
	maxOrderBatch = 10000
	// minLockTTL and maxLockTTL bound SHOP_LOCK_TTL. The lock's Redis calls
	// time out at TTL/3 (at most 1 s), so that two renewals fit in one lease:
	// below 300ms a call gets less than 100ms, which a busy Redis or a GC
	// pause can use up, and leases would be lost without anything being
	// wrong. Above 10 minutes a holder that crashed blocks its SKU for too
	// long: nobody can sell it until the lease runs out.
	minLockTTL = 300 * time.Millisecond
	maxLockTTL = 10 * time.Minute
	// minAdminToken is the shortest SHOP_ADMIN_TOKEN: the token resets the
	// catalog, orders included. Below goodAdminToken the replica starts,
	// and warns (warnSettings).
	minAdminToken  = 16
	goodAdminToken = 32
	// maxDrain bounds SHOP_DRAIN.
	maxDrain = time.Minute
	// maxReadyGrace bounds SHOP_READY_GRACE: a replica whose MySQL or
	// Redis has been silent for longer is down, and its balancer should
	// know.
	maxReadyGrace = 5 * time.Minute
	// maxMySQLIOTimeout bounds SHOP_MYSQL_IO_TIMEOUT: beyond it a frozen
	// database would hold a request for longer than any client waits.
	maxMySQLIOTimeout = 10 * time.Minute
	// maxCacheLocalTTL bounds SHOP_CACHE_LOCAL_TTL: the TTL is how stale a
	// replica's copy of a page may get when an announcement is lost, and
	// a page a minute old is no longer a flash sale's page.
	maxCacheLocalTTL = time.Minute
	// maxUserLimit bounds SHOP_USER_LIMIT, well inside the INT counter of
	// user_orders.
	maxUserLimit = 1_000_000
	// maxPayWindow bounds SHOP_PAY_WINDOW: a unit held longer than a week
	// is not a flash sale's.
	maxPayWindow = 7 * 24 * time.Hour
	// minSweepInterval and maxSweepInterval bound SHOP_SWEEP_INTERVAL:
	// every replica's sweep asks MySQL for lapsed reservations once per
	// interval.
	minSweepInterval = 100 * time.Millisecond
	maxSweepInterval = 10 * time.Minute
	// jwtLeeway is the clock skew allowed on a buyer token's exp and nbf:
	// the clocks of whoever issues tokens and of the replicas differ a
	// little.
	jwtLeeway = 30 * time.Second
	// maxJWTMaxTTL bounds SHOP_JWT_MAX_TTL: a buyer's token good for more
	// than a year is not limited by it.
	maxJWTMaxTTL = 365 * 24 * time.Hour
	// maxRate bounds SHOP_RATE_USER, SHOP_RATE_USER_BURST and SHOP_RATE_IP:
	// a limit above it limits nothing a replica could serve.
	maxRate = 1_000_000
)

// defaultTrustedProxies are the proxies trusted by default: the loopback
// networks, where nginx runs beside the replicas.
const defaultTrustedProxies = "127.0.0.0/8,::1"

// configError is a bad setting; the process exits with status 2.
type configError struct{ err error }

func (e configError) Error() string { return e.err.Error() }
func (e configError) Unwrap() error { return e.err }

// loadConfig reads every SHOP_* variable through getenv, applying the
// defaults of docs/configuration.md, and reports every bad value at once,
// each naming its variable.
func loadConfig(getenv func(string) string) (config, error) {
	e := &environ{getenv: getenv}
	c := config{
		Listen: e.listen(),
		MySQL:  e.mysql(),
		Redis:  e.redis(),
		Lock:   e.lock(),
		Orders: e.orders(),
		Cache:  e.cache(),
		Buyers: e.buyers(),
		Events: e.events(),
		Stop:   e.stop(),
	}
	c.Payments = e.payments()
	if len(e.errs) > 0 {
		return c, configError{errors.Join(e.errs...)}
	}
	return c, nil
}

// environ reads SHOP_* variables, keeping what is wrong with them.
type environ struct {
	getenv func(string) string
	errs   []error
}

// bad records what is wrong with a variable.
func (e *environ) bad(format string, args ...any) {
	e.errs = append(e.errs, fmt.Errorf(format, args...))
}

// get is name's value, or def when it is unset or empty.
func (e *environ) get(name, def string) string {
	if v := e.getenv(name); v != "" {
		return v
	}
	return def
}

// oneOf is name's value, one of allowed.
func (e *environ) oneOf(name, def string, allowed ...string) string {
	v := e.get(name, def)
	if !slices.Contains(allowed, v) {
		e.bad("%s=%q: must be one of %s", name, v, strings.Join(allowed, ", "))
	}
	return v
}

// on is name's on or off, as true or false.
func (e *environ) on(name, def string) bool { return e.oneOf(name, def, "on", "off") == "on" }

// duration is name's duration, at least min.
func (e *environ) duration(name, def string, min time.Duration) time.Duration {
	v := e.get(name, def)
	d, err := time.ParseDuration(v)
	if err != nil || d < min {
		e.bad("%s=%q: must be a duration of at least %s, like %s", name, v, min, def)
	}
	return d
}

// between is name's duration, from min to max.
func (e *environ) between(name, def string, min, max time.Duration) time.Duration {
	v := e.get(name, def)
	d, err := time.ParseDuration(v)
	if err != nil || d < min || d > max {
		e.bad("%s=%q: must be a duration from %s to %s, like %s", name, v, min, max, def)
	}
	return d
}

// count is name's whole number from 0 to max; zero says what 0 means.
func (e *environ) count(name, def string, max int, zero string) int {
	v := e.get(name, def)
	n, err := strconv.Atoi(v)
	if err != nil || n < 0 || n > max {
		e.bad("%s=%q: must be a whole number from 0 (%s) to %d", name, v, zero, max)
	}
	return n
}

// addrs reads name's comma-separated list of servers to dial, each
// checked by checkAddr and none listed twice: dup says what a duplicate
// would do. Entries are compared as written, spaces around them trimmed:
// localhost:6379 and 127.0.0.1:6379 are not seen as one.
func (e *environ) addrs(name, def, dup string) []string {
	list := addrList(e.get(name, def))
	seen := make(map[string]bool, len(list))
	for _, a := range list {
		if err := checkAddr(a, false); err != nil {
			e.bad("%s: %w", name, err)
		} else if seen[a] {
			e.bad("%s: %q is listed twice: %s", name, a, dup)
		}
		seen[a] = true
	}
	return list
}

// listener is name's listener address.
func (e *environ) listener(name, def string) string {
	v := e.get(name, def)
	if v != "" {
		if err := checkAddr(v, true); err != nil {
			e.bad("%s: %w", name, err)
		}
	}
	return v
}

func (e *environ) listen() listenConfig {
	c := listenConfig{
		HTTP:       e.listener("SHOP_HTTP_ADDR", ":8080"),
		Admin:      e.listener("SHOP_ADMIN_ADDR", "127.0.0.1:0"),
		Debug:      e.listener("SHOP_DEBUG_ADDR", ""),
		AdminToken: e.getenv("SHOP_ADMIN_TOKEN"),
	}
	if c.Debug != "" && checkAddr(c.Debug, true) == nil && !loopback(c.Debug) {
		e.bad("SHOP_DEBUG_ADDR=%q: must be a loopback host:port (127.0.0.1, ::1 or localhost): pprof shows the process's memory and must not be reachable from elsewhere", c.Debug)
	}
	if n := len(c.AdminToken); n > 0 && n < minAdminToken {
		e.bad("SHOP_ADMIN_TOKEN: %d characters, must be at least %d (it can reset the catalog)", n, minAdminToken)
	}
	// No client could send such a token: HTTP trims a header's value.
	if c.AdminToken != strings.TrimSpace(c.AdminToken) {
		e.bad("SHOP_ADMIN_TOKEN: begins or ends with white space (a space, or the newline of a file it was read from): remove it")
	}
	return c
}

func (e *environ) mysql() mysqlConfig {
	c := mysqlConfig{
		DSN:       e.get("SHOP_MYSQL_DSN", "root@tcp(127.0.0.1:3306)/shop?parseTime=true"),
		IOTimeout: e.between("SHOP_MYSQL_IO_TIMEOUT", "10s", time.Second, maxMySQLIOTimeout),
	}
	if _, err := mysql.ParseDSN(c.DSN); err != nil {
		e.bad("SHOP_MYSQL_DSN: %w", err)
	}
	return c
}

func (e *environ) redis() redisConfig {
	c := redisConfig{
		Addrs:      e.addrs("SHOP_REDIS_ADDR", "127.0.0.1:6379", "one server listed twice is taken for two: a Redis Cluster's seed nodes, or two Sentinels"),
		MasterName: e.getenv("SHOP_REDIS_MASTER_NAME"),
		Prefix:     e.get("SHOP_REDIS_PREFIX", "shop:"),
	}
	if len(c.Addrs) == 0 {
		e.bad("SHOP_REDIS_ADDR: must be host:port, or a comma-separated list of them")
	}
	// The keys carry hash tags ({sku:42}) so that each script's keys share
	// a Redis Cluster slot; a brace in the prefix would be taken for the tag.
	if strings.ContainsAny(c.Prefix, "{}") {
		e.bad("SHOP_REDIS_PREFIX=%q: must not contain { or }: the keys' hash tags, which keep each script's keys in one Redis Cluster slot, follow it", c.Prefix)
	}
	return c
}

func (e *environ) lock() lockConfig {
	c := lockConfig{
		Mode:          e.oneOf("SHOP_LOCK_MODE", "redis", "redis", "redlock", "mysql", "etcd", "zookeeper", "local", "none"),
		TTL:           e.between("SHOP_LOCK_TTL", "5s", minLockTTL, maxLockTTL),
		Wait:          e.between("SHOP_LOCK_WAIT", "2s", time.Millisecond, stock.MaxLockWait),
		Fencing:       e.on("SHOP_FENCING", "on"),
		RedlockAddrs:  e.addrs("SHOP_REDLOCK_ADDRS", "", "a master listed twice counts twice towards a majority"),
		EtcdEndpoints: e.addrs("SHOP_ETCD_ENDPOINTS", "", "a member listed twice is dialled twice"),
		ZKServers:     e.addrs("SHOP_ZK_SERVERS", "", "a server listed twice is dialled twice"),
	}
	for _, need := range []struct {
		mode, name, what string
		list             []string
	}{
		{"redlock", "SHOP_REDLOCK_ADDRS", "the independent Redis masters", c.RedlockAddrs},
		{"etcd", "SHOP_ETCD_ENDPOINTS", "the members of the etcd cluster", c.EtcdEndpoints},
		{"zookeeper", "SHOP_ZK_SERVERS", "the servers of the ZooKeeper ensemble", c.ZKServers},
	} {
		if c.Mode == need.mode && len(need.list) == 0 {
			e.bad("%s: %s mode needs %s, comma-separated host:port", need.name, need.mode, need.what)
		}
	}
	return c
}

func (e *environ) orders() ordersConfig {
	c := ordersConfig{
		StockUpdate:   e.oneOf("SHOP_STOCK_UPDATE", "guarded", "guarded", "naive"),
		Batch:         stock.DefaultBatch,
		PayWindow:     e.between("SHOP_PAY_WINDOW", "15m", 0, maxPayWindow),
		SweepInterval: e.between("SHOP_SWEEP_INTERVAL", "1s", minSweepInterval, maxSweepInterval),
	}
	if v := e.getenv("SHOP_ORDER_BATCH"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > maxOrderBatch {
			e.bad("SHOP_ORDER_BATCH=%q: must be a whole number from 1 (one order per lock hold) to %d", v, maxOrderBatch)
		}
		c.Batch = n
	}
	c.Group = 1
	if v := e.getenv("SHOP_ORDER_GROUP"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > ordersPoolSize {
			e.bad("SHOP_ORDER_GROUP=%q: must be a whole number from 1 (a transaction per batch) to %d, the order slots", v, ordersPoolSize)
		}
		c.Group = n
	}
	c.UserLimit = e.count("SHOP_USER_LIMIT", "0", maxUserLimit, "no limit")
	return c
}

func (e *environ) cache() cacheConfig {
	c := cacheConfig{
		TTL:      e.duration("SHOP_CACHE_TTL", "10m", time.Second),
		NullTTL:  e.duration("SHOP_CACHE_NULL_TTL", "60s", time.Second),
		LocalTTL: e.between("SHOP_CACHE_LOCAL_TTL", "1s", 0, maxCacheLocalTTL),
		Bloom:    e.on("SHOP_BLOOM", "on"),
	}
	if c.NullTTL > 5*time.Minute {
		e.bad("SHOP_CACHE_NULL_TTL=%q: must be at most 5m", e.getenv("SHOP_CACHE_NULL_TTL"))
	}
	if v := e.get("SHOP_CACHE_JITTER", "10%"); !parseJitter(v, &c.Jitter) {
		e.bad("SHOP_CACHE_JITTER=%q: must be a share of the TTL from 0 to 50%%, like 10%% or 0.1", v)
	}
	return c
}

func (e *environ) buyers() buyersConfig {
	c := buyersConfig{
		Auth:          e.oneOf("SHOP_AUTH", "none", "none", "jwt"),
		RateUser:      e.count("SHOP_RATE_USER", "5", maxRate, "no limit"),
		RateUserBurst: e.count("SHOP_RATE_USER_BURST", "10", maxRate, "the rate's own"),
		RateIP:        e.count("SHOP_RATE_IP", "0", maxRate, "no limit"),
	}
	if c.RateUser > 0 && c.RateUserBurst > 0 && c.RateUserBurst < c.RateUser {
		e.bad("SHOP_RATE_USER_BURST=%d: must be at least SHOP_RATE_USER (%d), or 0 for the same", c.RateUserBurst, c.RateUser)
	}
	var err error
	if c.TrustedProxies, err = trustedProxies(e.get("SHOP_TRUSTED_PROXIES", defaultTrustedProxies)); err != nil {
		e.bad("SHOP_TRUSTED_PROXIES: %w", err)
	}
	c.JWT = e.jwt(c.Auth)
	return c
}

// defaultStripeAPIBase is Stripe's own API.
const defaultStripeAPIBase = "https://api.stripe.com"

// payments reads the provider's settings.
func (e *environ) payments() paymentsConfig {
	c := paymentsConfig{
		Provider:      e.oneOf("SHOP_PAYMENTS", payments.ProviderWebhook, payments.ProviderWebhook, payments.ProviderStripe),
		StripeAPIBase: e.get("SHOP_STRIPE_API_BASE", defaultStripeAPIBase),
		Currency:      e.get("SHOP_CURRENCY", "USD"),
	}
	if err := stock.CheckCurrency(c.Currency); err != nil {
		e.bad("SHOP_CURRENCY=%q: must be three upper-case letters (ISO 4217)", c.Currency)
	}
	if u, err := url.Parse(c.StripeAPIBase); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		e.bad("SHOP_STRIPE_API_BASE=%q: must be an http or https URL", c.StripeAPIBase)
	}
	var missing []string
	switch c.Provider {
	case payments.ProviderWebhook:
		if secret := e.getenv("SHOP_PAYMENT_WEBHOOK_SECRET"); secret != "" {
			v, err := payments.NewStandard(secret)
			if err != nil {
				e.bad("%w", err)
			}
			c.Verifier = v
		} else {
			missing = append(missing, "SHOP_PAYMENT_WEBHOOK_SECRET")
		}
	case payments.ProviderStripe:
		c.StripeKey = e.getenv("SHOP_STRIPE_SECRET_KEY")
		if c.StripeKey == "" {
			missing = append(missing, "SHOP_STRIPE_SECRET_KEY")
		}
		if secret := e.getenv("SHOP_STRIPE_WEBHOOK_SECRET"); secret != "" {
			v, err := payments.NewStripe(secret)
			if err != nil {
				e.bad("%w", err)
			}
			c.Verifier = v
		} else {
			missing = append(missing, "SHOP_STRIPE_WEBHOOK_SECRET")
		}
	}
	if len(missing) > 0 {
		c.Verifier, c.Missing = nil, missing
	}
	return c
}

// servable refuses to serve a payment window without the provider's
// secret: orders are paid only by the provider's signed events, so a
// forgotten secret must stop the service rather than give goods away, and
// nothing switches to orders paid when placed by itself.
func (c config) servable() error {
	if c.Orders.PayWindow > 0 && len(c.Payments.Missing) > 0 {
		return configError{fmt.Errorf("%s: not set, and SHOP_PAY_WINDOW=%s asks buyers to pay: only the payment provider's signed events pay an order, "+
			"so set the provider's secret (SHOP_PAYMENTS=%s), or SHOP_PAY_WINDOW=0 for orders paid when placed",
			strings.Join(c.Payments.Missing, ", "), c.Orders.PayWindow, c.Payments.Provider)}
	}
	return nil
}

func (e *environ) stop() stopConfig {
	c := stopConfig{
		Drain:      e.between("SHOP_DRAIN", defaultDrain.String(), 0, maxDrain),
		ReadyGrace: e.between("SHOP_READY_GRACE", "10s", 0, maxReadyGrace),
	}
	if v := e.get("SHOP_LOG_LEVEL", "info"); c.LogLevel.UnmarshalText([]byte(v)) != nil {
		e.bad("SHOP_LOG_LEVEL=%q: must be debug, info, warn or error", v)
	}
	return c
}

// jwtVars are the settings of SHOP_AUTH=jwt.
var jwtVars = []string{"SHOP_JWT_SECRET", "SHOP_JWT_PUBLIC_KEYS", "SHOP_JWT_ISSUER", "SHOP_JWT_AUDIENCE", "SHOP_JWT_MAX_TTL"}

// jwt reads the SHOP_JWT_* settings of SHOP_AUTH mode, reading and parsing
// the public keys' file. With SHOP_AUTH=jwt exactly one of the secret and
// the keys' file is set; with SHOP_AUTH=none none of them is: set, they say
// the operator meant buyers to be authenticated, and serving without would
// let anyone buy as anyone.
func (e *environ) jwt(mode string) auth.Options {
	getenv := e.getenv
	if mode != "jwt" {
		var set []string
		for _, name := range jwtVars {
			if getenv(name) != "" {
				set = append(set, name)
			}
		}
		if len(set) > 0 && mode == "none" {
			e.bad("%s: set, but SHOP_AUTH is none, which authenticates no buyer: set SHOP_AUTH=jwt, or unset them", strings.Join(set, ", "))
		}
		return auth.Options{}
	}
	secret, keysFile := getenv("SHOP_JWT_SECRET"), getenv("SHOP_JWT_PUBLIC_KEYS")
	o := auth.Options{Issuer: getenv("SHOP_JWT_ISSUER"), Audience: getenv("SHOP_JWT_AUDIENCE"), Leeway: jwtLeeway,
		MaxTTL: e.between("SHOP_JWT_MAX_TTL", "0s", 0, maxJWTMaxTTL)}
	switch {
	case secret != "" && keysFile != "":
		e.bad("SHOP_JWT_SECRET and SHOP_JWT_PUBLIC_KEYS: both set; SHOP_AUTH=jwt takes exactly one, the HS256 secret or the file of a gateway's public keys")
	case secret == "" && keysFile == "":
		e.bad("SHOP_JWT_SECRET or SHOP_JWT_PUBLIC_KEYS: SHOP_AUTH=jwt needs one, an HS256 secret of at least 32 bytes or a PEM file of Ed25519 or RSA public keys")
	case secret != "":
		if n := len(secret); n < auth.MinSecret {
			e.bad("SHOP_JWT_SECRET: %d bytes, must be at least %d", n, auth.MinSecret)
		}
		// Whoever mints the tokens most likely signs without it.
		if secret != strings.TrimSpace(secret) {
			e.bad("SHOP_JWT_SECRET: begins or ends with white space (a space, or the newline of a file it was read from): remove it")
		}
		o.Secret = []byte(secret)
	default:
		data, err := os.ReadFile(keysFile)
		if err != nil {
			e.bad("SHOP_JWT_PUBLIC_KEYS: %w", err)
			break
		}
		if o.PublicKeys, err = auth.ParsePublicKeys(data); err != nil {
			e.bad("SHOP_JWT_PUBLIC_KEYS=%q: %w", keysFile, err)
		}
	}
	for _, name := range []string{"SHOP_JWT_ISSUER", "SHOP_JWT_AUDIENCE"} {
		if v := getenv(name); v != strings.TrimSpace(v) {
			e.bad("%s=%q: begins or ends with white space, which no token's claim would match", name, v)
		}
	}
	return o
}

// addrList splits a comma-separated list of addresses, dropping blanks.
func addrList(v string) []string {
	var addrs []string
	for a := range strings.SplitSeq(v, ",") {
		if a = strings.TrimSpace(a); a != "" {
			addrs = append(addrs, a)
		}
	}
	return addrs
}

// checkAddr reports what is wrong with addr as host:port: the address of
// a server to dial, which needs a host and a port from 1 to 65535, or, when
// listen is set, of a listener, whose host may be empty (every interface)
// and whose port may be 0 (a free one, which the listener logs).
func checkAddr(addr string, listen bool) error {
	if scheme, _, ok := strings.Cut(addr, "://"); ok {
		shown := scheme + "://…"
		if u, err := url.Parse(addr); err == nil {
			shown = u.Redacted()
		}
		return fmt.Errorf("%q: drop the scheme %q: the address is host:port", shown, scheme+"://")
	}
	form, minPort := "host:port", uint64(1)
	if listen {
		form, minPort = "[host]:port", 0
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q: must be %s", addr, form)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n < minPort {
		return fmt.Errorf("%q: the port must be a number from %d to 65535", addr, minPort)
	}
	if host == "" && !listen {
		return fmt.Errorf("%q: names no host: must be host:port", addr)
	}
	return nil
}

// topology names the Redis deployment that c describes, as go-redis's
// NewUniversalClient reads it.
func (c redisConfig) topology() string {
	switch {
	case c.MasterName != "":
		return "sentinel"
	case len(c.Addrs) > 1:
		return "cluster"
	}
	return "single"
}

// loopback reports whether addr is host:port with a loopback host:
// 127.0.0.1 (or another 127.x address), ::1 or localhost.
func loopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// trustedProxies reads SHOP_TRUSTED_PROXIES: "none", or a comma-separated
// list of addresses and CIDR ranges (gin's trusted proxies).
func trustedProxies(v string) ([]string, error) {
	if strings.TrimSpace(v) == "none" {
		return nil, nil
	}
	list := addrList(v)
	if len(list) == 0 {
		return nil, fmt.Errorf("%q: must be none, or addresses and CIDR ranges, comma-separated", v)
	}
	for _, p := range list {
		if _, _, err := net.ParseCIDR(p); err != nil && net.ParseIP(p) == nil {
			return nil, fmt.Errorf("%q: must be an IP address or a CIDR range like 10.0.0.0/8", p)
		}
	}
	return list, nil
}

// parseJitter reads a share written as a percentage ("10%") or a fraction
// ("0.1"), from 0 to one half.
func parseJitter(v string, share *float64) bool {
	pct, isPct := strings.CutSuffix(v, "%")
	f, err := strconv.ParseFloat(pct, 64)
	if isPct {
		f /= 100
	}
	*share = f
	return err == nil && f >= 0 && f <= 0.5
}
