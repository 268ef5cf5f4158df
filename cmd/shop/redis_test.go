package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"shop/internal/cache"
	"shop/internal/lock"
	"shop/internal/stock"
	"shop/internal/testenv"
)

// testConfig is the configuration of vars over the defaults.
func testConfig(t *testing.T, vars map[string]string) config {
	t.Helper()
	cfg, err := loadConfig(env(vars))
	if err != nil {
		t.Fatal(err)
	}
	return cfg
}

// testLocker is the order lock newLocker builds for vars, closed when the
// test ends.
func testLocker(t *testing.T, vars map[string]string) stock.Locker {
	t.Helper()
	locker, closeLocker, err := newLocker(testConfig(t, vars), nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(closeLocker)
	return locker
}

// testCache is the Redis client and the product cache serve builds for
// cfg, in front of catalog, closed when the test ends.
func testCache(t *testing.T, cfg config, catalog *stock.Catalog) (redis.UniversalClient, *cache.Products) {
	t.Helper()
	rdb := newRedis(cfg.Redis)
	t.Cleanup(func() { rdb.Close() })
	products, closeProducts := newCache(cfg, rdb, catalog, nil, nil, nil, nil, nil)
	t.Cleanup(closeProducts)
	return rdb, products
}

// A lease's context must end when the lease does, whatever Redis does: a
// renewal that gets no answer may not outlive the lease. With the clients
// newLocker builds and a Redis that stops answering, the lease's Context is
// cancelled by the time Until says the lease ran out, give or take the
// slack of a busy machine — not when a client's own read timeout (1s, and
// again on a retry) finally ends the renewal.
func TestLeaseEndsWithItsTTLWhenRedisHangs(t *testing.T) {
	// Not in parallel: it times the lease's end within 300ms.
	const (
		ttl   = 600 * time.Millisecond
		slack = 300 * time.Millisecond
	)
	r := testenv.StartRedis(t)
	locker := testLocker(t, map[string]string{"SHOP_REDIS_ADDR": r.Addr, "SHOP_LOCK_TTL": ttl.String()})
	t.Cleanup(r.Resume) // before the kill of StartRedis's cleanup

	lease, err := locker.Obtain(context.Background(), stock.LockKey(1))
	if err != nil {
		t.Fatal(err)
	}
	// Renewed while Redis answers.
	time.Sleep(2 * ttl)
	if err := lease.Context().Err(); err != nil {
		t.Fatalf("lease lost while Redis answered: %v", context.Cause(lease.Context()))
	}
	r.Pause()
	select {
	case <-lease.Context().Done():
	case <-time.After(10 * ttl):
		t.Fatal("the lease's context was not cancelled while Redis was paused")
	}
	ended := time.Now()
	until := lease.Until()
	if late := ended.Sub(until); late > slack {
		t.Errorf("lease context cancelled %s after the lease ran out (Until %s); want at most %s",
			late.Round(time.Millisecond), until.Format("15:04:05.000"), slack)
	} else {
		t.Logf("lease context cancelled %s after Until", late.Round(time.Millisecond))
	}
	if cause := context.Cause(lease.Context()); !errors.Is(cause, lock.ErrNotHeld) {
		t.Errorf("cause %v, want lock.ErrNotHeld", cause)
	}
}

// The product cache gives each Redis call 500ms and then reads MySQL: with
// the client newRedis builds and a Redis that stops answering, a product
// read answers (from MySQL) in about that time, not after the client's 1s
// read timeout.
func TestCacheReadFallsBackInTimeWhenRedisHangs(t *testing.T) {
	// Not in parallel: it times the read within 400ms.
	const (
		redisTimeout = 500 * time.Millisecond // cache.Settings.RedisTimeout's default
		slack        = 400 * time.Millisecond
	)
	db := testenv.MySQL(t)
	catalog := stock.NewCatalog(db.Gorm)
	ctx := context.Background()
	if err := catalog.Seed(ctx, 3, 1); err != nil {
		t.Fatal(err)
	}
	r := testenv.StartRedis(t)
	_, products := testCache(t, testConfig(t, map[string]string{"SHOP_REDIS_ADDR": r.Addr}), catalog)
	t.Cleanup(r.Resume)
	if _, err := products.Reset(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := products.Product(ctx, 1); err != nil { // a pooled connection, and product 1 cached
		t.Fatal(err)
	}

	r.Pause()
	start := time.Now()
	p, err := products.Product(ctx, 2)
	took := time.Since(start)
	if err != nil || p.ID != 2 {
		t.Fatalf("product 2 with Redis paused: %+v, %v", p, err)
	}
	if took > redisTimeout+slack {
		t.Errorf("read with Redis paused took %s; want at most %s", took.Round(time.Millisecond), redisTimeout+slack)
	} else {
		t.Logf("read with Redis paused took %s", took.Round(time.Millisecond))
	}
}

// A release whose reply is lost did release the lock. The order lock's
// client must not retry it behind the lock's back: the retry finds the key
// gone and reports the lock as not held, a lease lost under an order that
// in fact kept it to the end.
func TestLockReleaseWithLostReplyIsNotReportedNotHeld(t *testing.T) {
	t.Parallel()
	proxy := testenv.StartProxy(t, testenv.RedisAddr(t))
	prefix := redisPrefix(t)
	locker := testLocker(t, map[string]string{"SHOP_REDIS_ADDR": proxy.Addr, "SHOP_REDIS_PREFIX": prefix})
	ctx := context.Background()
	key := stock.LockKey(1)
	// One hold first, so the release script is cached in Redis and the cut
	// release below runs it rather than being told to send it again.
	lease, err := locker.Obtain(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	if err := lease.Release(ctx); err != nil {
		t.Fatal(err)
	}

	if lease, err = locker.Obtain(ctx, key); err != nil {
		t.Fatal(err)
	}
	redisKey := prefix + "lock:{" + key + "}"
	cut := proxy.CutReply([]byte(redisKey))
	err = lease.Release(ctx)
	select {
	case <-cut:
	case <-time.After(10 * time.Second):
		t.Fatal("the release never went through the proxy")
	}
	if errors.Is(err, lock.ErrNotHeld) {
		t.Errorf("release with its reply lost: %v; the lock was released, not lost", err)
	}
	rdb := testenv.RedisAt(t, testenv.RedisAddr(t))
	if n, err := rdb.Exists(ctx, redisKey).Result(); err != nil || n != 0 {
		t.Errorf("lock key after the release: exists=%d, %v; want released", n, err)
	}
	t.Logf("release with its reply lost: %v", err)
}

// The product cache's load mutex must leave a lost reply to the lock as
// the order lock does: a client that retries a SET NX whose reply was lost
// finds the key held, by its own token, and the mutex stays taken for a
// whole TTL by a try nobody knows of — every replica's read of the product
// waits for it and falls back to MySQL meanwhile. With the reply to the
// mutex's SET lost, the failed try gives the key back at once, and another
// replica loads the product into the cache at once.
func TestCacheMutexWithLostReplyIsGivenBack(t *testing.T) {
	// Not in parallel: the mutex's try is given 500ms for its answer
	// (cache.Options.RedisTimeout), or the read goes to MySQL without it.
	db := testenv.MySQL(t)
	catalog := stock.NewCatalog(db.Gorm)
	ctx := context.Background()
	if err := catalog.Seed(ctx, 3, 1); err != nil {
		t.Fatal(err)
	}
	proxy := testenv.StartProxy(t, testenv.RedisAddr(t))
	prefix := redisPrefix(t)
	_, products := testCache(t, testConfig(t, map[string]string{"SHOP_REDIS_ADDR": proxy.Addr, "SHOP_REDIS_PREFIX": prefix}), catalog)
	if _, err := products.Reset(ctx); err != nil { // the Bloom filter: the read below goes straight to its load
		t.Fatal(err)
	}
	mutexKey := prefix + "cache:mutex:{product:1}"
	cut := proxy.CutReply([]byte(mutexKey))
	if p, err := products.Product(ctx, 1); err != nil || p.ID != 1 {
		t.Fatalf("product 1 with the mutex's reply lost: %+v, %v; want it from MySQL", p, err)
	}
	select {
	case <-cut:
	default:
		t.Fatal("the read took no mutex through the proxy")
	}
	direct := testenv.RedisAt(t, testenv.RedisAddr(t))
	if ttl := direct.PTTL(ctx, mutexKey).Val(); ttl > 0 {
		t.Errorf("the try whose reply was lost left the mutex held for %v more: nobody holds its token", ttl)
	}

	_, other := testCache(t, testConfig(t, map[string]string{"SHOP_REDIS_ADDR": testenv.RedisAddr(t), "SHOP_REDIS_PREFIX": prefix}), catalog)
	start := time.Now()
	if p, err := other.Product(ctx, 1); err != nil || p.ID != 1 {
		t.Fatalf("product 1 on another replica: %+v, %v", p, err)
	}
	took := time.Since(start)
	if n := direct.Exists(ctx, prefix+"cache:product:{1}").Val(); n != 1 {
		t.Errorf("another replica's read (%s) did not cache product 1: it found the mutex held and fell back", took.Round(time.Millisecond))
	} else {
		t.Logf("another replica loaded product 1 in %s", took.Round(time.Millisecond))
	}
}

// /readyz's Redis check passes on every topology the service runs on.
func TestRedisReadyOnEveryTopology(t *testing.T) {
	t.Parallel()
	testenv.EachTopology(t, func(t *testing.T, topo testenv.Topology) {
		rdb := newRedis(testConfig(t, topo.Env()).Redis)
		t.Cleanup(func() { rdb.Close() })
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := redisReady(rdb)(ctx); err != nil {
			t.Errorf("ready check on %s: %v", topo.Name, err)
		}
	})
}

// On a Redis Cluster the replica is ready only while every master answers:
// with one master paused, then killed, the check fails every time — a
// PING through the ClusterClient would reach a live node most times — and
// it passes again once the master is back.
func TestRedisReadyNeedsEveryClusterMaster(t *testing.T) {
	t.Parallel()
	cluster := testenv.StartRedisCluster(t, 3, 0)
	rdb := newRedis(testConfig(t, map[string]string{"SHOP_REDIS_ADDR": strings.Join(cluster.Addrs(), ",")}).Redis)
	t.Cleanup(func() { rdb.Close() })
	ready := redisReady(rdb)
	check := func() error {
		// /readyz's own bound on a check.
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		return ready(ctx)
	}
	if err := check(); err != nil {
		t.Fatalf("ready check with every master up: %v", err)
	}
	down := cluster.Masters[2]
	expectNotReady := func(state string, tries int) {
		t.Helper()
		for i := range tries {
			if err := check(); err == nil {
				t.Fatalf("ready check %d with a master %s: ready", i+1, state)
			} else if i == 0 {
				t.Logf("with a master %s: %v", state, err)
			}
		}
	}
	down.Pause()
	expectNotReady("paused", 3)
	down.Resume()
	waitReady := func() {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for err := check(); err != nil; err = check() {
			if time.Now().After(deadline) {
				t.Fatalf("not ready again once the master was back: %v", err)
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	waitReady()
	down.Kill()
	expectNotReady("killed", 10)
}

// On a Redis Cluster the lock's client must leave a lost reply to the lock
// as a single server's does: a ClusterClient retries a command whose reply
// was lost (EOF, a timeout) by itself, whatever MaxRetries says. Its retry
// of a release that had deleted the key finds none, and the lock would
// report a lease it released as lost; its retry of an obtain that had taken
// the key finds it held — by the same token — and the key stays taken by a
// try nobody knows of for a whole TTL. Every node of the test Cluster is
// reached through a proxy that loses, on cue, the reply to the command
// that names the key.
func TestLockClientOnClusterLeavesLostRepliesToTheLock(t *testing.T) {
	// Not in parallel: its lock waits 500ms for a key.
	ctx := context.Background()
	topo := testenv.TopologyNamed(t, "cluster")
	direct, prefix := testenv.RedisOn(t, topo)
	proxies := map[string]*testenv.Proxy{}
	for _, addr := range topo.Addrs {
		proxies[addr] = testenv.StartProxy(t, addr)
	}
	o := lockRedisOptions(testConfig(t, topo.Env()).Redis, time.Minute)
	o.Dialer = func(ctx context.Context, network, addr string) (net.Conn, error) {
		p, ok := proxies[addr]
		if !ok {
			return nil, fmt.Errorf("no proxy for cluster node %s", addr)
		}
		var d net.Dialer
		return d.DialContext(ctx, network, p.Addr)
	}
	c := redis.NewUniversalClient(o)
	t.Cleanup(func() { c.Close() })
	if _, ok := c.(*redis.ClusterClient); !ok {
		t.Fatalf("the lock's client of a Cluster is a %T", c)
	}
	l := lock.NewRedis(c, lock.RedisOptions{Prefix: prefix, TTL: time.Minute, Wait: 500 * time.Millisecond})
	// cutNext loses the reply to the next command that carries match, on
	// whichever node it goes to; it returns once that has happened.
	cutNext := func(match string) (done func()) {
		var cuts []<-chan struct{}
		for _, p := range proxies {
			cuts = append(cuts, p.CutReply([]byte(match)))
		}
		return func() {
			t.Helper()
			for _, p := range proxies {
				p.Disarm()
			}
			for _, cut := range cuts {
				select {
				case <-cut:
					return
				default:
				}
			}
			t.Fatal("no proxy saw the command it was to cut the reply of")
		}
	}
	// The scripts loaded on the key's node, so that a cut lands on their
	// reply rather than on a NOSCRIPT.
	warm, err := l.Obtain(ctx, "k")
	if err != nil {
		t.Fatal(err)
	}
	warm.Release(ctx)

	t.Run("release", func(t *testing.T) {
		lease, err := l.Obtain(ctx, "k")
		if err != nil {
			t.Fatal(err)
		}
		done := cutNext(direct.Get(ctx, l.Key("k")).Val()) // the token: only the release sends it now
		if err := lease.Release(ctx); err != nil {
			t.Errorf("Release = %v, want nil: the try whose reply was lost released it", err)
		}
		done()
		if n := direct.Exists(ctx, l.Key("k")).Val(); n != 0 {
			t.Error("the key is still held after Release")
		}
	})
	t.Run("obtain", func(t *testing.T) {
		done := cutNext(l.Key("k"))
		if lease, err := l.TryObtain(ctx, "k"); err == nil {
			lease.Release(ctx)
			t.Fatal("obtained although the reply was lost")
		}
		done()
		if ttl := direct.PTTL(ctx, l.Key("k")).Val(); ttl > 0 {
			t.Errorf("the failed obtain left the key held for %v more: nobody holds its token", ttl)
		}
		// Obtain, which waits, takes the key again within its wait.
		done = cutNext(l.Key("k"))
		lease, err := l.Obtain(ctx, "k")
		done()
		if err != nil {
			t.Fatalf("Obtain with its first reply lost = %v, want the key taken again within the wait", err)
		}
		if err := lease.Release(ctx); err != nil {
			t.Fatalf("Release = %v: the lease is not the holder's", err)
		}
	})
}
