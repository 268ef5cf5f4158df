package main

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"shop/internal/readiness"

	"github.com/redis/go-redis/v9"
)

// The replica's clients of Redis: the one of the cache, the rate limits and
// the announcements, and the locks' own, which never retry.

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
// or a Sentinel-managed master, as c says (see redisConfig.Addrs).
func newRedis(c redisConfig) redis.UniversalClient { return newRedisClient(c, redisOptions(c)) }

// clusterStateReload bounds how old a client's view of a Redis Cluster's
// slots may be when it sends a command: an older view is asked for again,
// in the background, while the command goes by the one it has. go-redis
// asks again at once only when a node answers MOVED (or READONLY), and
// otherwise every minute; a master that died answers nothing, so without
// this the clients kept sending its slots' commands to it, refused, for up
// to a minute after its replica had taken over — every order of those SKUs
// a 503, and the lock's subscription, if it lived there, gone as long.
const clusterStateReload = time.Second

// newRedisClient is the client of o, for c's Redis; on a Redis Cluster it
// asks for the slots again whenever its view is older than
// clusterStateReload.
func newRedisClient(c redisConfig, o *redis.UniversalOptions) redis.UniversalClient {
	if c.topology() != "cluster" {
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
func redisOptions(c redisConfig) *redis.UniversalOptions {
	return &redis.UniversalOptions{
		Addrs:                 c.Addrs,
		MasterName:            c.MasterName,
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
func newLockRedis(c redisConfig, ttl time.Duration) redis.UniversalClient {
	return newRedisClient(c, lockRedisOptions(c, ttl))
}

// lockRedisOptions are newLockRedis's settings. On a Redis Cluster
// MaxRetries is not enough: the ClusterClient retries a command whose
// reply was lost by itself, up to MaxRedirects times, so that is turned off
// too (-1 means none). It then follows no MOVED or ASK either: those come
// back to the lock as answers that the command did not run, the client
// reloads the slots meanwhile, and a waiter tries again (see lock's
// failingOver).
func lockRedisOptions(c redisConfig, ttl time.Duration) *redis.UniversalOptions {
	o := redisOptions(c)
	o.MaxRetries = -1
	o.MaxRedirects = -1
	o.ReadTimeout = min(redisTimeout, ttl/3)
	o.WriteTimeout = o.ReadTimeout
	return o
}

// withHook adds hook, when not nil, to c and returns c.
func withHook(c redis.UniversalClient, hook redis.Hook) redis.UniversalClient {
	if hook != nil {
		c.AddHook(hook)
	}
	return c
}

// newRedlockNode is a client of one Redlock master. It does not retry (the
// other masters answer instead) and lets the lock's per-node timeout, carried
// by the context, bound each command.
func newRedlockNode(addr string) redis.UniversalClient {
	o := redisOptions(redisConfig{Addrs: []string{addr}})
	o.MaxRetries = -1
	o.DialerRetries = 1
	return redis.NewUniversalClient(o)
}
